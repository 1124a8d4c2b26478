"""A real OpenTelemetry collector (rotel) in front of an in-test OTLP sink.

Topology used by the tests::

    process under test --OTLP gRPC/HTTP--> rotel-agent --OTLP/HTTP (gzip)--> OtlpSink

``OtlpSink`` is a small stdlib HTTP server that decodes OTLP/HTTP protobuf
requests and keeps both the raw (decompressed) bodies and a flattened view of
every span.  ``Collector`` runs the ``rotel-agent`` binary shipped in the
``rotel`` PyPI wheel as a subprocess, wired to an ``OtlpSink``.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.harness.ports import reserve_port

__all__ = ["OtlpSink", "Collector", "CollectorError", "find_rotel_agent", "free_port"]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

_SPAN_KINDS = {
    0: "UNSPECIFIED",
    1: "INTERNAL",
    2: "SERVER",
    3: "CLIENT",
    4: "PRODUCER",
    5: "CONSUMER",
}
_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, outside the range other processes bind port 0 from."""
    return reserve_port(host)


def _port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _any_value(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` into a plain Python value."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def _attrs(key_values: Sequence[Any]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in key_values}


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding: {encoding!r}")


def flatten_trace_request(request: Any) -> list[dict[str, Any]]:
    """Flatten an ``ExportTraceServiceRequest`` into a list of span dicts."""
    out: list[dict[str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = _attrs(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                out.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "name": span.name,
                        "kind": _SPAN_KINDS.get(span.kind, "UNSPECIFIED"),
                        "attributes": _attrs(span.attributes),
                        "resource": dict(resource),
                        "scope": scope,
                        "status": _STATUS_CODES.get(span.status.code, "UNSET"),
                        "status_message": span.status.message,
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "events": [e.name for e in span.events],
                        "event_attributes": [_attrs(e.attributes) for e in span.events],
                        "links": [
                            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links
                        ],
                    }
                )
    return out


# --------------------------------------------------------------------------
# OTLP/HTTP sink
# --------------------------------------------------------------------------


class OtlpSink:
    """In-process OTLP/HTTP (protobuf) receiver that records everything it gets."""

    SIGNAL_PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # Imported lazily so that importing this module never requires protobuf.
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self._pb = {
            "traces": (
                trace_service_pb2.ExportTraceServiceRequest,
                trace_service_pb2.ExportTraceServiceResponse,
            ),
            "metrics": (
                metrics_service_pb2.ExportMetricsServiceRequest,
                metrics_service_pb2.ExportMetricsServiceResponse,
            ),
            "logs": (
                logs_service_pb2.ExportLogsServiceRequest,
                logs_service_pb2.ExportLogsServiceResponse,
            ),
        }
        self._lock = threading.Lock()
        self._spans: list[dict[str, Any]] = []
        self._raw: list[bytes] = []
        self._requests: list[dict[str, Any]] = []  # {"path", "headers", "body"}
        self._metrics: list[Any] = []
        self._logs: list[Any] = []
        self._errors: list[str] = []
        self._fail_next: list[int] = []  # status codes to answer with, FIFO

        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _reply(self, status: int, body: bytes = b"", ctype: str = "application/x-protobuf") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                status, body = sink._handle(path, dict(self.headers.items()), raw)
                self._reply(status, body)

            def do_GET(self) -> None:  # noqa: N802
                self._reply(404, b"not found", "text/plain")

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="otlp-sink",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    # ---- request handling (runs on server threads) ----

    def _handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple:
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            body = _decompress(raw, lower.get("content-encoding", ""))
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._errors.append(f"{path}: cannot decompress: {exc!r}")
            return 400, b""
        with self._lock:
            self._raw.append(body)
            self._requests.append({"path": path, "headers": lower, "body": body})
            if self._fail_next:
                return self._fail_next.pop(0), b""
        signal_name = self.SIGNAL_PATHS.get(path)
        if signal_name is None:
            return 404, b""
        ctype = lower.get("content-type", "application/x-protobuf")
        if "protobuf" not in ctype:
            with self._lock:
                self._errors.append(f"{path}: unsupported Content-Type {ctype!r}")
            return 415, b""
        req_cls, resp_cls = self._pb[signal_name]
        try:
            message = req_cls.FromString(body)
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._errors.append(f"{path}: cannot decode protobuf: {exc!r}")
            return 400, b""
        with self._lock:
            if signal_name == "traces":
                self._spans.extend(flatten_trace_request(message))
            elif signal_name == "metrics":
                self._metrics.append(message)
            else:
                self._logs.append(message)
        return 200, resp_cls().SerializeToString()

    # ---- public API ----

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._spans)

    def metrics_requests(self) -> list[Any]:
        """Decoded ``ExportMetricsServiceRequest`` messages, in arrival order."""
        with self._lock:
            return list(self._metrics)

    def metric_names(self) -> list[str]:
        names = []
        for req in self.metrics_requests():
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    names.extend(m.name for m in sm.metrics)
        return names

    def logs_requests(self) -> list[Any]:
        with self._lock:
            return list(self._logs)

    def raw_bodies(self) -> list[bytes]:
        """Every request body received (decompressed), any signal, arrival order."""
        with self._lock:
            return list(self._raw)

    def requests(self) -> list[dict[str, Any]]:
        """Every request: ``{"path", "headers" (lower-cased), "body"}``."""
        with self._lock:
            return [dict(r) for r in self._requests]

    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def fail_next(self, count: int = 1, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` (for fault tests)."""
        with self._lock:
            self._fail_next.extend([status] * count)

    def wait_for(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 30,
        interval: float = 0.2,
    ) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self.spans()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self._raw.clear()
            self._requests.clear()
            self._metrics.clear()
            self._logs.clear()
            self._errors.clear()
            self._fail_next.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OtlpSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------
# rotel collector
# --------------------------------------------------------------------------


class CollectorError(RuntimeError):
    pass


def find_rotel_agent() -> str:
    """Locate the ``rotel-agent`` binary.

    Order: ``$GYM_AUTOINSTR_ROTEL_AGENT``, ``PATH``, next to ``sys.executable``,
    inside the installed ``rotel`` package (where the PyPI wheel puts it).
    """
    override = os.environ.get("GYM_AUTOINSTR_ROTEL_AGENT")
    candidates: list[str | None] = [override, shutil.which("rotel-agent")]
    candidates.append(str(Path(sys.executable).parent / "rotel-agent"))
    try:
        spec = importlib.util.find_spec("rotel")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(str(Path(location) / "rotel-agent"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CollectorError(
        "rotel-agent binary not found: `pip install rotel` (it ships the binary inside "
        "the rotel package) or set GYM_AUTOINSTR_ROTEL_AGENT"
    )


class Collector:
    """``rotel-agent`` subprocess receiving OTLP gRPC+HTTP, exporting to an ``OtlpSink``."""

    def __init__(
        self,
        log_dir: os.PathLike | str,
        sink: OtlpSink | None = None,
        batch_timeout: str = "100ms",
        retry_initial_backoff: str = "200ms",
        retry_max_backoff: str = "1s",
        retry_max_elapsed: str = "30s",
        extra_args: Sequence[str] = (),
        start_timeout: float = 20.0,
        forward_to: str | None = None,
        forward_headers: str | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._own_sink = sink is None
        self.sink = sink if sink is not None else OtlpSink()
        self.binary = find_rotel_agent()
        self.grpc_port = free_port()
        self.http_port = free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()
        self.batch_timeout = batch_timeout
        self.retry_initial_backoff = retry_initial_backoff
        self.retry_max_backoff = retry_max_backoff
        self.retry_max_elapsed = retry_max_elapsed
        self.extra_args = list(extra_args)
        # A real backend instead of the sink (base URL; rotel appends /v1/traces), with
        # "name=value,..." headers on every export (e.g. MLflow's experiment header).
        self.forward_to = forward_to
        self.forward_headers = forward_headers
        self.start_timeout = start_timeout
        self.log_path = self.log_dir / "rotel-agent.log"
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._starts = 0
        try:
            self.start()
        except BaseException:
            if self._own_sink:
                self.sink.close()
            raise

    # ---- endpoints ----

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        return [
            self.binary,
            "start",
            # receivers
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{self.grpc_port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            # one OTLP exporter, over HTTP/protobuf, to the sink (base URL; rotel
            # appends /v1/traces, /v1/metrics, /v1/logs)
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            self.forward_to or self.sink.url,
            "--otlp-exporter-protocol",
            "http",
            *(["--otlp-exporter-custom-headers", self.forward_headers] if self.forward_headers else []),
            # flush quickly so tests see spans within ~1 s
            "--batch-timeout",
            self.batch_timeout,
            # short retries so fault tests recover quickly
            "--otlp-exporter-retry-initial-backoff",
            self.retry_initial_backoff,
            "--otlp-exporter-retry-max-backoff",
            self.retry_max_backoff,
            "--otlp-exporter-retry-max-elapsed-time",
            self.retry_max_elapsed,
            "--otlp-exporter-request-timeout",
            "5s",
            # keep its files out of the shared /tmp defaults
            "--pid-file",
            str(self.log_dir / "rotel-agent.pid"),
            "--log-file",
            str(self.log_dir / "rotel-agent.daemon.log"),
            *self.extra_args,
        ]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no rotel log>"
        return "\n".join(text.splitlines()[-lines:])

    # ---- lifecycle ----

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise CollectorError("rotel-agent already running")
        # rotel reads ROTEL_* from the environment: keep the caller's out of it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
        env.setdefault("RUST_LOG", "info")
        env.setdefault("NO_COLOR", "1")
        # The wheel's binary embeds Python and links libpythonX.Y.so, which lives in
        # the interpreter's LIBDIR (not on the loader's path for pyenv builds).
        libdir = sysconfig.get_config_var("LIBDIR")
        if libdir:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
        self._starts += 1
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"--- start #{self._starts}: {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self._close_log()
                raise CollectorError(f"rotel-agent exited with {code} during start-up; log tail:\n{self.log_tail()}")
            if _port_open("127.0.0.1", self.grpc_port) and _port_open("127.0.0.1", self.http_port):
                return
            if time.monotonic() >= deadline:
                self._terminate(kill=True)
                raise CollectorError(
                    f"rotel-agent did not open ports {self.grpc_port}/{self.http_port} within "
                    f"{self.start_timeout}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _terminate(self, kill: bool, timeout: float = 10.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        self._close_log()
        return proc.returncode

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the collector (no flush); ports stay reserved for ``restart()``."""
        self._terminate(kill=True)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (rotel flushes pending batches), then close an owned sink."""
        self._terminate(kill=False, timeout=timeout)
        self._proc = None
        if self._own_sink:
            self.sink.close()

    def restart(self) -> None:
        """Stop (if running) and start again on the same ports and sink."""
        self._terminate(kill=False)
        deadline = time.monotonic() + 10
        # wait for the old listeners to disappear before rebinding
        while _port_open("127.0.0.1", self.http_port) or _port_open("127.0.0.1", self.grpc_port):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self.start()

    close = stop

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class SilentCollector:
    """A local TCP listener that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        for conn in self.conns:
            conn.close()
