"""A counting OTLP/HTTP sink: how many spans arrived, keyed by the first bytes of the trace id.

The load generator mints every rollout's trace id itself (``traceparent`` on the request
to the agent's ``/run``), with a tag in the first bytes saying which variant and which
phase sent it, so spans from Ray daemons, start-up or another variant never count
towards a measurement.  Decoding is the protobuf message only (no per-span dicts), so
the sink costs the benchmark process little.
"""

from __future__ import annotations

import collections
import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TAG_BYTES = 4


class CountingSink:
    def __init__(self, host: str = "127.0.0.1") -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self._request_cls = trace_service_pb2.ExportTraceServiceRequest
        self._response = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self._lock = threading.Lock()
        self.by_tag: collections.Counter[bytes] = collections.Counter()
        self.total = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                body = b""
                if self.path.split("?")[0] == "/v1/traces":
                    if encoding == "gzip":
                        raw = gzip.decompress(raw)
                    elif encoding == "deflate":
                        raw = zlib.decompress(raw)
                    sink._count(raw)
                    body = sink._response
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="counting-sink")
        self._thread.start()

    def _count(self, raw: bytes) -> None:
        counts: collections.Counter[bytes] = collections.Counter()
        n = 0
        for resource_spans in self._request_cls.FromString(raw).resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    counts[span.trace_id[:TAG_BYTES]] += 1
                    n += 1
        with self._lock:
            self.by_tag.update(counts)
            self.total += n

    def count(self, tag: bytes) -> int:
        with self._lock:
            return self.by_tag[tag]

    def snapshot(self) -> int:
        with self._lock:
            return self.total

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
