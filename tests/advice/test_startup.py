"""Server-side start-up spans, in-process: the span a server reports at its lifespan
start-up joins the orchestrator's span for it (context from the environment) and holds
the stages in order."""

from __future__ import annotations

import time

import pytest
from opentelemetry import trace

from gym_autoinstr.advice import startup
from gym_autoinstr.telemetry import groups
from gym_autoinstr.telemetry.spans import STARTUP_MARKS


@pytest.fixture
def fresh_marks():
    saved = dict(STARTUP_MARKS)
    STARTUP_MARKS.clear()
    yield STARTUP_MARKS
    STARTUP_MARKS.clear()
    STARTUP_MARKS.update(saved)


def test_a_server_reports_its_startup_under_the_orchestrators_span(spans, fresh_marks, monkeypatch):
    monkeypatch.setattr(groups, "ENABLED", groups.PRESETS["default"])
    orchestrator_span = trace.get_tracer("test").start_span("gym.startup.server")
    context = orchestrator_span.get_span_context()
    monkeypatch.setenv(startup.TRACEPARENT_VARIABLE, f"00-{context.trace_id:032x}-{context.span_id:016x}-01")
    spawned = time.time_ns() - 5_000_000_000  # 5 s ago: before this process existed
    monkeypatch.setenv(startup.SPAWN_VARIABLE, str(spawned))
    fresh_marks["configured"] = time.time_ns() - 3_000_000
    fresh_marks["instrumented"] = time.time_ns() - 2_000_000
    fresh_marks["run_webserver"] = time.time_ns() - 1_000_000
    startup.report_server_startup("my_server")
    startup.report_server_startup("my_server")  # once per process
    orchestrator_span.end()
    finished = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("gym.server.startup")}
    inside = finished.pop("gym.server.startup")
    assert inside.parent.span_id == context.span_id and inside.context.trace_id == context.trace_id
    assert inside.attributes["nemo.gym.server.name"] == "my_server"
    assert inside.start_time == spawned
    ordered = sorted(finished.values(), key=lambda s: s.start_time)
    assert [s.name.rsplit(".", 1)[1] for s in ordered] == [
        "venv_setup",
        "interpreter_start",
        "imports",
        "uvicorn_startup",
    ]
    assert all(s.parent.span_id == inside.context.span_id for s in ordered)
    assert ordered[0].start_time == spawned and ordered[-1].end_time == inside.end_time
    for before, after in zip(ordered, ordered[1:]):
        assert before.end_time == after.start_time


def test_the_startup_group_off_reports_nothing(spans, fresh_marks, monkeypatch):
    monkeypatch.setattr(groups, "ENABLED", frozenset({groups.SERVER}))
    startup.report_server_startup("my_server")
    assert [s for s in spans.get_finished_spans() if s.name.startswith("gym.server.startup")] == []
