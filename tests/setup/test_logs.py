"""Log export settings and trace ids on Gym's own log lines, in-process."""

from __future__ import annotations

import io
import logging

from opentelemetry.sdk.trace import TracerProvider

from gym_autoinstr.setup import logs


def test_gyms_own_switch_is_honoured_and_ours_wins():
    assert logs.requested({}) == []
    assert logs.requested({"NEMO_GYM_OTEL_LOGS_ENABLED": "false"}) == []
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert logs.requested({"NEMO_GYM_OTEL_LOGS_ENABLED": "true", **endpoint}) == ["otlp"]
    assert logs.requested({"NEMO_GYM_OTEL_LOGS_ENABLED": "true"}) == ["files"]  # the embedded default
    assert logs.requested({"NEMO_GYM_OTEL_LOGS_ENABLED": "true", "OTEL_LOGS_EXPORTER": "none"}) == []
    assert logs.requested({"OTEL_LOGS_EXPORTER": "console,otlp"}) == ["console", "otlp"]


def test_a_line_written_inside_a_span_ends_with_its_ids_and_others_are_unchanged():
    stream = io.StringIO()
    logger = logging.getLogger("gym-line-test")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    ours = object()
    logs._correlate_lines(logger, ours)
    logs._correlate_lines(logger, ours)  # wrapped once, however often uvicorn starts
    tracer = TracerProvider().get_tracer("test")
    logger.warning("outside")
    with tracer.start_as_current_span("POST /run") as span:
        logger.warning("inside")
        ids = span.get_span_context()
    lines = stream.getvalue().splitlines()
    assert lines == ["WARNING: outside", f"WARNING: inside trace_id={ids.trace_id:032x} span_id={ids.span_id:016x}"]
