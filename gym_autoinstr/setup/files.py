"""The embedded default: spans to local files when no exporter is configured.

A user who only wants to see where a rollout's time goes should not need a collector
first.  Metrics go the same way, into ``<process>-<pid>.metrics.jsonl`` beside the spans
(one ``ExportMetricsServiceRequest`` per line).  With no
``OTEL_EXPORTER_OTLP_*ENDPOINT`` and no ``OTEL_TRACES_EXPORTER`` set, every Gym process
appends OTLP-JSON lines (the OpenTelemetry Collector file-exporter format: one
``ExportTraceServiceRequest`` per line, ids in hex, enums as integers) to its *own* file
in one run directory, so concurrent processes never interleave.  The orchestrator
resolves the directory once (``GYM_AUTOINSTR_OUTPUT_DIR``, else
``./gym-autoinstr-runs/<run id>``) and passes it down in the environment, because every
server runs from its own working directory.  ``gym-autoinstr view`` reads it.

Each file is bounded (``GYM_AUTOINSTR_FILE_MAX_MB``, default 256): past the bound,
spans are dropped with one message saying so and how to lift it.  An unwritable
directory is reported once; Gym keeps running.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once

OUTPUT_DIR_VARIABLE = settings.OUTPUT_DIR.name
MAX_MB_VARIABLE = settings.FILE_MAX_MB.name
DEFAULT_MAX_MB = settings.FILE_MAX_MB.default
DEFAULT_PARENT = "gym-autoinstr-runs"

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def embedded_default_applies(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    return not any(
        setting.raw(environ)
        for setting in (settings.OTLP_ENDPOINT, settings.OTLP_TRACES_ENDPOINT, settings.TRACES_EXPORTER)
    )


def resolve_output_dir(run_id: str | None, environ: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """The run directory: set once (by the orchestrator, or the user) and inherited."""
    environ = os.environ if environ is None else environ
    configured = settings.OUTPUT_DIR.raw(environ)
    if configured:
        return Path(configured)
    directory = (Path.cwd() / DEFAULT_PARENT / (run_id or f"pid-{os.getpid()}")).resolve()
    environ[OUTPUT_DIR_VARIABLE] = str(directory)
    return directory


def _max_bytes() -> int:
    return int(settings.FILE_MAX_MB.read() * 1024 * 1024)


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants trace and span ids in hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def encode_otlp_json(spans: Sequence[Any]) -> str:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    return json.dumps(_hex_ids(message), separators=(",", ":"))


class OtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP-JSON line per export batch to this process's own file."""

    def __init__(self, directory: Path, file_stem: str) -> None:
        self.directory = Path(directory)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", file_stem).strip("_") or "process"
        self.path = self.directory / f"{safe}-{os.getpid()}.jsonl"
        self.max_bytes = _max_bytes()
        self._written = 0
        self._lock = threading.Lock()
        self._broken = False

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if self._broken or not spans:
            return SpanExportResult.FAILURE if self._broken else SpanExportResult.SUCCESS
        try:
            text = encode_otlp_json(spans)
        except Exception as error:
            warn_once(f"file-encode:{type(error).__name__}", "could not encode spans for %s: %r", self.path, error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.write_line(text) else SpanExportResult.FAILURE

    def write_line(self, text: str) -> bool:
        if self._broken:
            return False
        line = (text + "\n").encode("utf-8")
        with self._lock:
            if self._written + len(line) > self.max_bytes:
                warn_once(
                    "file-full",
                    "trace file %s reached its bound of %.0f MB; further spans of this process are dropped. "
                    "Raise %s, or send spans to a collector with OTEL_EXPORTER_OTLP_ENDPOINT.",
                    self.path,
                    self.max_bytes / 1024 / 1024,
                    MAX_MB_VARIABLE,
                )
                return False
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                # One write of one whole line in append mode: a reader never sees half a batch.
                with open(self.path, "ab") as handle:
                    handle.write(line)
            except OSError as error:
                self._broken = True
                warn_once(
                    "file-unwritable",
                    "cannot write traces to %s (%s); this process's spans are dropped, Gym keeps running. "
                    "Set %s to a writable directory.",
                    self.path,
                    error.strerror or error,
                    OUTPUT_DIR_VARIABLE,
                )
                return False
            self._written += len(line)
        return True

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


METRICS_SUFFIX = ".metrics.jsonl"


def encode_metrics_json(metrics_data: Any) -> str:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return json.dumps(MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True), separators=(",", ":"))


def metric_exporter(directory: Path, file_stem: str) -> Any:
    """A ``MetricExporter`` appending OTLP-JSON lines to this process's own metrics file."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class OtlpJsonMetricFileExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self.lines = OtlpJsonFileExporter(directory, file_stem)
            self.lines.path = self.lines.path.with_suffix(METRICS_SUFFIX)

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            try:
                line = encode_metrics_json(metrics_data)
            except Exception as error:
                warn_once(
                    f"file-metrics-encode:{type(error).__name__}",
                    "could not encode metrics for %s: %r",
                    self.lines.path,
                    error,
                )
                return MetricExportResult.FAILURE
            ok = self.lines.write_line(line)
            return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    return OtlpJsonMetricFileExporter()


LOGS_SUFFIX = ".logs.jsonl"


def log_exporter(directory: Path, file_stem: str) -> Any:
    """A ``LogExporter`` appending OTLP-JSON lines (trace and span ids in hex) to this
    process's own logs file."""
    from gym_autoinstr.fastpath import contract

    logs_export = contract.load(contract.LOGS_SDK_EXPORT)
    LogExporter, LogExportResult = logs_export.LogExporter, logs_export.LogExportResult  # noqa: N806 - classes

    class OtlpJsonLogFileExporter(LogExporter):
        def __init__(self) -> None:
            self.lines = OtlpJsonFileExporter(directory, file_stem)
            self.lines.path = self.lines.path.with_suffix(LOGS_SUFFIX)

        def export(self, batch: Any) -> Any:
            from google.protobuf.json_format import MessageToDict

            encode_logs = contract.load(contract.LOG_ENCODER).encode_logs

            try:
                line = json.dumps(
                    _hex_ids(MessageToDict(encode_logs(batch), use_integers_for_enums=True)), separators=(",", ":")
                )
            except Exception as error:
                warn_once(
                    f"file-logs-encode:{type(error).__name__}",
                    "could not encode logs for %s: %r",
                    self.lines.path,
                    error,
                )
                return LogExportResult.FAILURE
            return LogExportResult.SUCCESS if self.lines.write_line(line) else LogExportResult.FAILURE

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return OtlpJsonLogFileExporter()


# ---------------------------------------------------------------------------- reading


def _value(any_value: dict) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in any_value:
            return any_value[key]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    if "kvlistValue" in any_value:
        return {kv["key"]: _value(kv.get("value", {})) for kv in any_value["kvlistValue"].get("values", [])}
    return None


def _attributes(key_values: list[dict] | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for kv in key_values or ():
        value = kv.get("value") or {}
        text = value.get("stringValue")  # most attributes: read without the general walk
        attributes[kv["key"]] = text if text is not None else _value(value)
    return attributes


_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _enum(value: Any, table: dict[int, str], prefix: str) -> str:
    if isinstance(value, int):
        return table.get(value, str(value))
    if isinstance(value, str):
        return value.removeprefix(prefix)
    return table[0]


def spans_from_request(request: dict) -> Iterator[dict]:
    """Flatten one OTLP-JSON ``ExportTraceServiceRequest`` into span dicts."""
    for resource_spans in request.get("resourceSpans", ()):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            scope = scope_spans.get("scope", {}).get("name", "")
            for span in scope_spans.get("spans", ()):
                yield {
                    "trace_id": span.get("traceId", ""),
                    "span_id": span.get("spanId", ""),
                    "parent_span_id": span.get("parentSpanId") or None,
                    "name": span.get("name", ""),
                    "kind": _enum(span.get("kind", 0), _KINDS, "SPAN_KIND_"),
                    "start_ns": int(span.get("startTimeUnixNano", 0)),
                    "end_ns": int(span.get("endTimeUnixNano", 0)),
                    "status": _enum(span.get("status", {}).get("code", 0), _STATUS, "STATUS_CODE_"),
                    "attributes": _attributes(span.get("attributes")),
                    "resource": resource,
                    "scope": scope,
                    "links": [
                        {"trace_id": link.get("traceId", ""), "span_id": link.get("spanId", "")}
                        for link in span.get("links", ())
                    ],
                }


def json_lines(lines: Iterable[str], source: str = "") -> Iterator[dict]:
    """The OTLP-JSON requests of a ``.jsonl`` file (spans, metrics or logs), one per line;
    a line that is not JSON (a write cut short) is skipped with one message."""
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            warn_once(
                f"read:{source}:{number}", "skipping %s line %d: not JSON (a partial write?)", source or "input", number
            )


def read_lines(lines: Iterable[str], source: str = "") -> Iterator[dict]:
    for request in json_lines(lines, source):
        yield from spans_from_request(request)


def read_path(path: Path) -> list[dict]:
    """Spans from a run directory, a file, or ``-`` for standard input."""
    import sys

    if str(path) == "-":
        return list(read_lines(iter(sys.stdin), "stdin"))
    files = (
        sorted(p for p in path.rglob("*.jsonl") if not p.name.endswith((METRICS_SUFFIX, LOGS_SUFFIX)))
        if path.is_dir()
        else [path]
    )
    spans: list[dict] = []
    for file in files:
        with open(file, encoding="utf-8") as handle:
            spans.extend(read_lines(handle, str(file)))
    return spans
