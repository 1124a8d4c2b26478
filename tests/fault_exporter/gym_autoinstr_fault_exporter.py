"""Test only: a span exporter whose every export raises (a broken third-party exporter)."""

from opentelemetry.sdk.trace.export import SpanExporter

MESSAGE = "fault-exporter: export refused"


class RaisingSpanExporter(SpanExporter):
    def export(self, spans):
        raise RuntimeError(MESSAGE)

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
