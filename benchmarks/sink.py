"""A counting OTLP/HTTP sink: how many spans arrived, keyed by the first bytes of the trace id.

The load generator mints every rollout's trace id itself (``traceparent`` on the request
to the agent's ``/run``), with a tag in the first bytes saying which variant and which
phase sent it, so spans from Ray daemons, start-up or another variant never count
towards a measurement.  Spans are also counted per tag and ``service.name`` (which
server sent them), and spans and metric data points per ``nemo.gym.run.id`` resource
attribute (the benchmark gives each trio its own run id: which variant exported metrics,
and whether a variant whose rollouts carry no tag exported any span).  Decoding is the
protobuf message only (no per-span dicts), so the sink costs the benchmark process
little.
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
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self._request_cls = trace_service_pb2.ExportTraceServiceRequest
        self._response = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self._metrics_request_cls = metrics_service_pb2.ExportMetricsServiceRequest
        self._metrics_response = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self._lock = threading.Lock()
        self.by_tag: collections.Counter[bytes] = collections.Counter()
        self.by_tag_service: collections.Counter[tuple[bytes, str]] = collections.Counter()
        self.spans_by_run: collections.Counter[str] = collections.Counter()
        self.points_by_run: collections.Counter[str] = collections.Counter()
        self.metric_names_by_run: dict[str, set] = collections.defaultdict(set)
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
                path = self.path.split("?")[0]
                if path in ("/v1/traces", "/v1/metrics"):
                    if encoding == "gzip":
                        raw = gzip.decompress(raw)
                    elif encoding == "deflate":
                        raw = zlib.decompress(raw)
                    if path == "/v1/traces":
                        sink._count(raw)
                        body = sink._response
                    else:
                        sink._count_metrics(raw)
                        body = sink._metrics_response
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="counting-sink")
        self._thread.start()

    @staticmethod
    def _resource(resource) -> tuple[str, str]:
        service = run = ""
        for kv in resource.attributes:
            if kv.key == "service.name":
                service = kv.value.string_value
            elif kv.key == "nemo.gym.run.id":
                run = kv.value.string_value
        return service, run

    def _count(self, raw: bytes) -> None:
        counts: collections.Counter[bytes] = collections.Counter()
        by_service: collections.Counter[tuple[bytes, str]] = collections.Counter()
        by_run: collections.Counter[str] = collections.Counter()
        n = 0
        for resource_spans in self._request_cls.FromString(raw).resource_spans:
            service, run = self._resource(resource_spans.resource)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    tag = span.trace_id[:TAG_BYTES]
                    counts[tag] += 1
                    by_service[(tag, service)] += 1
                    n += 1
            by_run[run] += sum(len(s.spans) for s in resource_spans.scope_spans)
        with self._lock:
            self.by_tag.update(counts)
            self.by_tag_service.update(by_service)
            self.spans_by_run.update(by_run)
            self.total += n

    def _count_metrics(self, raw: bytes) -> None:
        for resource_metrics in self._metrics_request_cls.FromString(raw).resource_metrics:
            _, run = self._resource(resource_metrics.resource)
            points, names = 0, set()
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    names.add(metric.name)
                    kind = metric.WhichOneof("data")
                    if kind:
                        points += len(getattr(metric, kind).data_points)
            with self._lock:
                self.points_by_run[run] += points
                self.metric_names_by_run[run].update(names)

    def count(self, tag: bytes) -> int:
        with self._lock:
            return self.by_tag[tag]

    def count_by_service(self, tag: bytes) -> dict[str, int]:
        with self._lock:
            return {service: n for (t, service), n in self.by_tag_service.items() if t == tag}

    def run_counts(self, run: str) -> dict:
        """Spans and metric data points received so far from resources with this run id."""
        with self._lock:
            return {
                "spans": self.spans_by_run[run],
                "metric_points": self.points_by_run[run],
                "metric_names": sorted(self.metric_names_by_run.get(run, ())),
            }

    def snapshot(self) -> int:
        with self._lock:
            return self.total

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
