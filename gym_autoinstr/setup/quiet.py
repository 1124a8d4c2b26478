"""One line per cause for the OpenTelemetry SDK's own export complaints.

With the collector down, slow or misbehaving, the SDK's exporters and batch processors
log every retry and every failed batch: several lines per second per process, for as
long as the fault lasts, in the middle of Gym's log.  ``install()`` puts a filter on
those loggers that lets the first record of each cause through (logger + message
template, so "transient error, retrying" and "failed to export" are separate causes)
and counts the rest; the first repeat adds one line of our own saying so.  The counts
are in ``COUNTS`` (logger name, template) -> records seen.
"""

from __future__ import annotations

import logging
import threading

from gym_autoinstr._log import warn_once

# Loggers the SDK's export path writes to (each module logs on its own logger, and a
# logger's filters see only records created on it, so each one gets the filter).
LOGGER_PREFIXES = ("opentelemetry.exporter", "opentelemetry.sdk")
KNOWN_LOGGERS = (
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)

COUNTS: dict[tuple[str, str], int] = {}
_lock = threading.Lock()


class FirstOfEachCause(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        key = (record.name, template)
        with _lock:
            seen = COUNTS.get(key, 0) + 1
            COUNTS[key] = seen
        if seen == 1:
            return True
        if seen == 2:
            warn_once(
                "otel-log-repeats",
                "OpenTelemetry keeps reporting export problems (first report above, from %s); "
                "repeats are counted, not logged. Check the collector at OTEL_EXPORTER_OTLP_ENDPOINT.",
                record.name,
            )
        return False


_FILTER = FirstOfEachCause()


def install() -> None:
    """Filter every SDK/exporter logger that exists now, and the known ones."""
    names = set(KNOWN_LOGGERS)
    names.update(n for n in list(logging.Logger.manager.loggerDict) if n.startswith(LOGGER_PREFIXES))
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
