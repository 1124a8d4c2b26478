"""The embedded default: spans to local files when no exporter is configured.

A user who only wants to see where a rollout's time goes should not need a collector
first.  With no ``OTEL_EXPORTER_OTLP_*ENDPOINT`` and no ``OTEL_TRACES_EXPORTER`` set
(or ``files`` among its names), every Gym process appends OTLP-JSON lines (the
OpenTelemetry Collector file-exporter format: one ``ExportTraceServiceRequest`` per
line, ids in hex, enums as integers) to its *own* files in one run directory, so
concurrent processes never interleave; metrics and logs go beside them
(``.metrics.jsonl``, ``.logs.jsonl``).  The orchestrator resolves the directory once
(``GYM_AUTOINSTR_OUTPUT_DIR``, else ``./gym-autoinstr-runs/<run id>``) and passes it down
in the environment, because every server runs from its own working directory.
``gym-autoinstr view`` reads it.

The files are rotated segments, gzipped once closed, under one disk budget for the run
(``segments.py``); each process keeps a note beside them (``notes.py``) with its span
counts and what it lost.  The spans arrive already encoded as JSON text
(``fastpath/wire_json.py``, through the encoding batch processor); with the fast path
off they are encoded here the SDK's way.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath.wire_json import decoded as _value
from gym_autoinstr.setup import segments

OUTPUT_DIR_VARIABLE = settings.OUTPUT_DIR.name
DEFAULT_PARENT = segments.DEFAULT_PARENT
SPANS_SUFFIX = ".jsonl"
METRICS_SUFFIX = ".metrics.jsonl"
LOGS_SUFFIX = ".logs.jsonl"

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")

# Every writer of this process, closed (open segments gzipped) at exit.
WRITERS: list[segments.SegmentWriter] = []


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


def process_stem(file_stem: str) -> str:
    """``<service>-<pid>``, made safe for a file name: every file of this process starts so."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", file_stem).strip("_") or "process"
    return f"{safe}-{os.getpid()}"


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
    """The SDK's way (its protobuf message, protobuf's JSON mapping): for spans that did
    not come through the encoding processor (the fast path off)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    return json.dumps(_hex_ids(message), separators=(",", ":"))


class OtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP-JSON line per export batch to this process's segments.  A batch
    may come already encoded (``accepts_json``: the encoding processor hands its JSON
    text) or as spans.  ``failure_reason`` says why the last export failed."""

    accepts_json = True

    def __init__(self, directory: Path, file_stem: str, suffix: str = SPANS_SUFFIX) -> None:
        self.directory = Path(directory)
        self.writer = segments.SegmentWriter(self.directory, process_stem(file_stem), suffix)
        WRITERS.append(self.writer)

    @property
    def path(self) -> Path:
        """The segment written now."""
        return self.writer.path

    @property
    def failure_reason(self) -> str | None:
        return self.writer.failure_reason

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        payload = getattr(spans, "payload", None)  # the encoding processor's batch: text already
        facts = None
        if type(payload) is str:
            text, facts = payload, getattr(spans, "facts", None)
        else:
            try:
                text = encode_otlp_json(spans)
            except Exception as error:
                warn_once(f"file-encode:{type(error).__name__}", "could not encode spans for %s: %r", self.path, error)
                self.writer.failure_reason = "encode_failed"
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.writer.write_line(text, facts) else SpanExportResult.FAILURE

    def write_line(self, text: str) -> bool:
        return self.writer.write_line(text)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def seal_writers(deadline: float) -> None:
    """The process is ending: every writer's open segment closed and gzipped, if there is
    time before ``deadline`` (monotonic)."""
    for writer in list(WRITERS):
        try:
            writer.seal(deadline)
        except Exception as error:
            warn_once("file-seal", "could not close %s: %r", writer.path, error)


def encode_metrics_json(metrics_data: Any) -> str:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return json.dumps(MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True), separators=(",", ":"))


def metric_exporter(directory: Path, file_stem: str) -> Any:
    """A ``MetricExporter`` appending OTLP-JSON lines to this process's metrics segments."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class OtlpJsonMetricFileExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self.lines = OtlpJsonFileExporter(directory, file_stem, METRICS_SUFFIX)

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


def log_exporter(directory: Path, file_stem: str) -> Any:
    """A ``LogExporter`` appending OTLP-JSON lines (trace and span ids in hex) to this
    process's logs segments."""
    from gym_autoinstr.fastpath import contract

    logs_export = contract.load(contract.LOGS_SDK_EXPORT)
    LogExporter, LogExportResult = logs_export.LogExporter, logs_export.LogExportResult  # noqa: N806 - classes

    class OtlpJsonLogFileExporter(LogExporter):
        def __init__(self) -> None:
            self.lines = OtlpJsonFileExporter(directory, file_stem, LOGS_SUFFIX)

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


def _is_kind(name: str, suffix: str) -> bool:
    """Whether a file name is a segment (plain or gzipped) of ``suffix``'s kind."""
    if name.startswith("."):
        return False
    name = name.removesuffix(segments.GZ)
    if suffix == SPANS_SUFFIX:
        return name.endswith(SPANS_SUFFIX) and not name.endswith((METRICS_SUFFIX, LOGS_SUFFIX))
    return name.endswith(suffix)


def segment_files(directory: Path, suffix: str = SPANS_SUFFIX, recursive: bool = True) -> list[Path]:
    """Every segment of one kind under ``directory`` (spans by default), each process's in
    order; where a closed segment's gzip is complete, it alone (its plain file is on its way out)."""
    try:
        found = [p for p in (directory.rglob("*") if recursive else directory.iterdir()) if _is_kind(p.name, suffix)]
    except OSError:
        return []
    names = {str(p) for p in found}
    kept = [p for p in found if not (not p.name.endswith(segments.GZ) and f"{p}{segments.GZ}" in names)]
    return sorted(kept, key=lambda p: (str(p.parent), *segments.segment_key(p)))


def span_segments(directory: Path) -> list[Path]:
    return segment_files(directory, SPANS_SUFFIX)


def segment_lines(path: Path, skip: int = 0) -> Iterator[str]:
    """The lines of one segment, plain or gzipped, from byte ``skip`` on (of its plain
    text).  A plain segment gzipped meanwhile is read from its ``.gz``; a gzip cut short
    by a crash ends where it was cut, said once."""

    def cut(where: Path) -> None:
        warn_once(
            f"read-cut:{where}", "%s ends early (the process was killed while writing it?): read up to there", where
        )

    try:
        handle = segments.open_text(path, cut)
    except FileNotFoundError:
        zipped = path.with_name(path.name + segments.GZ)
        if path.name.endswith(segments.GZ) or not zipped.exists():
            return
        path, handle = zipped, segments.open_text(zipped, cut)
    if skip and not path.name.endswith(segments.GZ):
        handle.seek(skip)  # (text mode: a byte offset from tell() is a valid cookie for utf-8)
        skip = 0
    with_close = handle if hasattr(handle, "close") else None
    try:
        for line in handle:
            if skip:
                size = len(line.encode("utf-8"))
                if size <= skip:
                    skip -= size
                    continue
                line, skip = line.encode("utf-8")[skip:].decode("utf-8", "replace"), 0
            yield line
    finally:
        if with_close is not None:
            with_close.close()


def read_path(path: Path) -> list[dict]:
    """Spans from a run directory (every segment, plain or gzipped), a file, or ``-`` for
    standard input."""
    import sys

    if str(path) == "-":
        return list(read_lines(iter(sys.stdin), "stdin"))
    files = span_segments(path) if path.is_dir() else [path]
    spans: list[dict] = []
    for file in files:
        spans.extend(read_lines(segment_lines(file), str(file)))
    return spans
