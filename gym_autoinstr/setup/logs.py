"""Opt-in export of Gym's Python log records as OpenTelemetry logs, with trace ids.

Off unless ``OTEL_LOGS_EXPORTER`` names an exporter (``otlp``, ``console``, ``files``) or
Gym's own ``NEMO_GYM_OTEL_LOGS_ENABLED`` is true (then: OTLP with an endpoint, the run
directory's ``<process>-<pid>.logs.jsonl`` otherwise).  A record logged while a span is
current (a rollout's request) carries that span's trace and span ids.

The handler goes on the root logger at configuration, and on uvicorn's own loggers
(``uvicorn.error``, ``uvicorn.access``: they do not propagate) once uvicorn has set its
logging up, at the app's lifespan start-up.  Records of OpenTelemetry's own loggers are
not exported (an export failure must not loop into another export).

With logs opted in, Gym's own log lines (the stream handlers of those loggers: what Gym
prints to its console and log files) also end in `` trace_id=<32 hex> span_id=<16 hex>``
when a span is current as they are written (a rollout's request), and are unchanged
otherwise: a line in a server's log can be looked up in the backend, and back.  Each
handler's formatter is wrapped, not replaced; ``GYM_AUTOINSTR_LOG_CORRELATION=false``
leaves the lines alone while still exporting the records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import contract

LOGS_SUFFIX = ".logs.jsonl"
UVICORN_LOGGERS = ("uvicorn.error", "uvicorn.access")


@dataclass(slots=True)
class _LogsState:
    handler: Any = None  # our LoggingHandler on the root logger, once logs are exported
    correlate: bool = False  # trace and span ids go into log lines (GYM_AUTOINSTR_LOG_CORRELATION)


_state = _LogsState()


class _WithTraceIds(logging.Formatter):
    """The handler's own formatter, plus the current trace and span ids when there are any."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        try:
            from opentelemetry import trace

            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                return f"{line} trace_id={span_context.trace_id:032x} span_id={span_context.span_id:016x}"
        except Exception:
            pass
        return line

    def __getattr__(self, name: str) -> Any:  # formatTime, datefmt, ... as the wrapped one has them
        return getattr(self.inner, name)


def _correlate_lines(logger: logging.Logger, ours: Any) -> None:
    for handler in logger.handlers:
        if handler is ours or not isinstance(handler, logging.StreamHandler):
            continue
        if not isinstance(handler.formatter, _WithTraceIds):
            handler.setFormatter(_WithTraceIds(handler.formatter))


def exported() -> bool:
    """Whether this process exports logs (a logger provider of ours is set)."""
    return _state.handler is not None


def requested(environ: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    raw = (settings.LOGS_EXPORTER.raw(environ) or "").strip().lower()
    names = [n.strip() for n in raw.split(",") if n.strip() and n.strip() != "none"]
    if names:
        return names
    if not raw and settings.GYM_LOGS_ENABLED.read(environ):
        from gym_autoinstr.setup import files

        return ["files" if files.embedded_default_applies(environ) else "otlp"]
    return []


class _NotOurs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(("opentelemetry", "gym_autoinstr"))


def _exporter(name: str, who: Any, otlp_protocol: Callable[[], str]) -> Any:
    if name == "otlp":
        protocol = (settings.OTLP_LOGS_PROTOCOL.raw() or otlp_protocol()).strip().lower()
        grpc = protocol == "grpc"
        return contract.load(
            contract.OTLP_GRPC_LOG_EXPORTER if grpc else contract.OTLP_HTTP_LOG_EXPORTER
        ).OTLPLogExporter()
    if name == "console":
        return contract.load(contract.LOGS_SDK_EXPORT).ConsoleLogExporter()
    if name == "files":
        from gym_autoinstr.setup import files, identity

        who = who or identity.detect()
        return files.log_exporter(files.resolve_output_dir(identity.run_id()), identity.service_name(who))
    warn_once(
        f"logs-exporter:{name}",
        "OTEL_LOGS_EXPORTER=%r is not supported here (otlp, console, files, none); no logs from it.",
        name,
    )
    return None


def configure(resource: Any, who: Any = None, *, otlp_protocol: Callable[[], str]) -> bool:
    """Set up the logger provider and the handler when logs were asked for.
    ``otlp_protocol``: the configurator's OTLP protocol for traces, the default for logs
    (asked only when an OTLP log exporter is made)."""
    names = requested()
    if not names:
        return False
    sdk_logs = contract.load(contract.LOGS_SDK)
    LoggerProvider, LoggingHandler = sdk_logs.LoggerProvider, sdk_logs.LoggingHandler  # noqa: N806 - classes
    BatchLogRecordProcessor = contract.load(contract.LOGS_SDK_EXPORT).BatchLogRecordProcessor  # noqa: N806

    try:
        set_logger_provider = contract.load(contract.LOGS_API).set_logger_provider
    except (ImportError, AttributeError):  # older SDKs
        set_logger_provider = sdk_logs.set_logger_provider

    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    exporters = 0
    for name in names:
        try:
            exporter = _exporter(name, who, otlp_protocol)
        except Exception as error:
            warn_once(f"logs-exporter-error:{name}", "log exporter %r could not be created: %r", name, error)
            continue
        if exporter is not None:
            provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=1000))
            exporters += 1
    if not exporters:
        return False
    set_logger_provider(provider)

    class GymLoggingHandler(LoggingHandler):
        def flush(self) -> None:
            # logging.shutdown() flushes every handler at exit, when the SDK's flush would
            # start a thread (refused then) and could wait on a dead collector; the
            # time-boxed flush at exit (flush.py) covers the logger provider instead.
            pass

    handler = GymLoggingHandler(level=logging.NOTSET, logger_provider=provider)
    handler.addFilter(_NotOurs())
    root = logging.getLogger()
    root.addHandler(handler)
    _state.handler = handler
    _state.correlate = settings.LOG_CORRELATION.read()
    if _state.correlate:
        _correlate_lines(root, handler)
    return True


def attach_to_uvicorn() -> None:
    """uvicorn's loggers do not propagate to the root: give them the handler too."""
    handler = _state.handler
    if handler is None:
        return
    try:
        for name in UVICORN_LOGGERS:
            logger = logging.getLogger(name)
            if handler not in logger.handlers:
                logger.addHandler(handler)
            if _state.correlate:
                _correlate_lines(logger, handler)
        if _state.correlate:
            _correlate_lines(logging.getLogger(), handler)
    except Exception as error:
        warn_once("logs-uvicorn", "uvicorn's log lines are not exported: %r", error)
