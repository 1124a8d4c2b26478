"""A Ray task's exception surfacing in the caller marks the caller's current span: a real
local Ray (one node, started in-process), the real instrumentor.  The two-node cluster
and a Gym-style submitter under ``opentelemetry-instrument``: ``test_realgym_ray.py``."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest
from opentelemetry import trace


@pytest.fixture(scope="module")
def local_ray(instrumented):
    ray = pytest.importorskip("ray")
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="rayc")  # short: Ray's socket paths have a length limit
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir, _node_ip_address="127.0.0.1")
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
        shutil.rmtree(temp_dir, ignore_errors=True)


# A builtin class: the worker unpickles the task's exception without importing this module.
TaskFailed = LookupError


def _tasks(ray):
    @ray.remote
    def fails(secret):
        raise TaskFailed(secret)

    @ray.remote
    def answers(x):
        return x + 1

    return fails, answers


def _caller_spans(spans) -> dict:
    return {s.name: s for s in spans.get_finished_spans() if s.name.startswith("caller.")}


def test_ray_get_marks_the_callers_span_with_the_tasks_error_type(local_ray, spans):
    ray = local_ray
    fails, answers = _tasks(ray)
    tracer = trace.get_tracer("tests")
    received = {}
    for label, call in (
        ("one", lambda: ray.get(fails.remote("secret-canary"))),
        ("list", lambda: ray.get([answers.remote(1), fails.remote("secret-canary")])),
        ("ok", lambda: ray.get(answers.remote(1))),
    ):
        with tracer.start_as_current_span(f"caller.{label}"):
            try:
                received[label] = call()
            except TaskFailed as error:  # Ray's RayTaskError(TaskFailed): still the caller's class
                received[label] = (type(error).__name__, isinstance(error, ray.exceptions.RayTaskError))
    assert received == {
        "one": ("RayTaskError(LookupError)", True),
        "list": ("RayTaskError(LookupError)", True),
        "ok": 2,
    }
    by_name = _caller_spans(spans)
    expected_type = "LookupError"  # the task's own class, not Ray's RayTaskError(LookupError)
    for label in ("one", "list"):
        span = by_name[f"caller.{label}"]
        assert span.status.status_code is trace.StatusCode.ERROR, label
        assert span.attributes["error.type"] == expected_type
        assert "secret-canary" not in (span.status.description or "")
    assert by_name["caller.ok"].status.status_code is trace.StatusCode.UNSET
    assert "error.type" not in by_name["caller.ok"].attributes


def test_await_ref_marks_the_awaiting_coroutines_span(local_ray, spans):
    ray = local_ray
    fails, answers = _tasks(ray)
    tracer = trace.get_tracer("tests")

    async def main():
        results = {}
        ready = fails.remote("secret-canary")
        ray.wait([ready], timeout=120)  # already failed when awaited
        for label, ref in (
            ("await", fails.remote("secret-canary")),
            ("await_ok", answers.remote(2)),
            ("await_ready", ready),
        ):
            with tracer.start_as_current_span(f"caller.{label}"):
                try:
                    results[label] = await ref
                except TaskFailed:
                    results[label] = "raised"
        return results

    assert asyncio.run(main()) == {"await": "raised", "await_ok": 3, "await_ready": "raised"}
    by_name = _caller_spans(spans)
    for label in ("await", "await_ready"):
        span = by_name[f"caller.{label}"]
        assert span.status.status_code is trace.StatusCode.ERROR, label
        assert span.attributes["error.type"] == "LookupError"
    assert by_name["caller.await_ok"].status.status_code is trace.StatusCode.UNSET


def test_with_the_ray_group_off_nothing_is_marked(local_ray, spans, monkeypatch):
    from gym_autoinstr.telemetry import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset())
    ray = local_ray
    fails, _ = _tasks(ray)
    with trace.get_tracer("tests").start_as_current_span("caller.off"):
        with pytest.raises(TaskFailed):
            ray.get(fails.remote("secret-canary"))
    span = _caller_spans(spans)["caller.off"]
    assert span.status.status_code is trace.StatusCode.UNSET and "error.type" not in span.attributes
