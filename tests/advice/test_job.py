"""The job advice and the rollouts it dispatches, in-process: Gym's real
``server_utils.request`` against a real local HTTP server, inside ``gym.job``.

The real collection driver on real Gym fleets is ``test_realgym_job.py``; here each shape
(per-rollout roots, the opt-in, an embedder's span) and the counts are checked quickly,
including a failed rollout, which a healthy trio never produces.
"""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gym_autoinstr._log import forget_said
from gym_autoinstr.advice import job
from tests.servers import run_async, serve

pytest.importorskip("nemo_gym")


def _agent_app() -> FastAPI:
    app = FastAPI()
    app.state.traceparents = []

    @app.post("/run")
    async def run(request: Request):
        app.state.traceparents.append(request.headers.get("traceparent"))
        body = await request.json()
        return JSONResponse({"reward": 1.0}, status_code=500 if body.get("fail") else 200)

    @app.post("/aggregate_metrics")
    async def aggregate():
        return {}

    return app


def _collect(base: str, bodies: list[dict], *, repeats: int = 3) -> None:
    """What Gym's driver does inside run_from_config: concurrent /run posts, then one
    /aggregate_metrics call, run through the job advice."""
    from nemo_gym import server_utils

    async def post(path: str, body: dict) -> None:
        response = await server_utils.request("POST", f"{base}{path}", json=body)
        await response.read()

    async def driver(config) -> str:
        await asyncio.gather(*(post("/run", body) for body in bodies))
        await post("/aggregate_metrics", {})
        return "results"

    config = SimpleNamespace(num_repeats=repeats)
    assert run_async(job.run_from_config_advice(driver, None, (config,), {})) == "results"


def _by_name(finished, name: str):
    return [s for s in finished if s.name == name]


def _runs(finished):
    return [s for s in finished if s.kind == SpanKind.CLIENT and s.attributes["url.full"].endswith("/run")]


def test_each_rollout_is_a_root_linked_to_the_job_which_counts_them(instrumented, spans, monkeypatch):
    monkeypatch.delenv(job.JOB_TRACE_VARIABLE, raising=False)
    app = _agent_app()
    with serve(app) as base:
        _collect(base, [{}, {}, {"fail": True}])
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.parent is None
    attributes = dict(job_span.attributes)
    assert re.fullmatch(r"[0-9a-f]{32}", attributes.pop(job.JOB_ID))
    assert attributes == {
        job.JOB_TRACE: "per_rollout", job.NUM_REPEATS: 3, job.ROLLOUTS_SENT: 3, job.ROLLOUTS_FAILED: 1,
    }
    runs = _runs(finished)
    assert len(runs) == 3 and len({r.context.trace_id for r in runs}) == 3
    for run in runs:
        assert run.parent is None and run.context.trace_id != job_span.context.trace_id
        assert [link.context for link in run.links] == [job_span.context]
        assert run.attributes[job.JOB_ID] == job_span.attributes[job.JOB_ID]
    # the servers receive each rollout's own trace id, not the job's
    received = {int(tp.split("-")[1], 16) for tp in app.state.traceparents}
    assert received == {r.context.trace_id for r in runs}
    # the job's other calls stay in the job's trace
    (aggregate,) = [s for s in finished if s.attributes.get("url.full", "").endswith("/aggregate_metrics")]
    assert aggregate.parent.span_id == job_span.context.span_id and not aggregate.links


def test_opt_in_keeps_one_trace_per_job(instrumented, spans, monkeypatch):
    monkeypatch.setenv(job.JOB_TRACE_VARIABLE, " Single ")
    with serve(_agent_app()) as base:
        _collect(base, [{}, {}])
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.attributes[job.JOB_TRACE] == "single" and job_span.attributes[job.ROLLOUTS_SENT] == 2
    runs = _runs(finished)
    assert len(runs) == 2
    assert all(r.parent.span_id == job_span.context.span_id and not r.links for r in runs)
    assert {s.context.trace_id for s in finished} == {job_span.context.trace_id}


def test_an_embedders_open_span_parents_the_job_and_its_rollouts(instrumented, spans, monkeypatch):
    monkeypatch.delenv(job.JOB_TRACE_VARIABLE, raising=False)
    with serve(_agent_app()) as base:
        with trace.get_tracer("embedder").start_as_current_span("train.step") as step:
            _collect(base, [{}, {}])
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.parent.span_id == step.get_span_context().span_id
    assert job_span.attributes[job.JOB_TRACE] == "embedded"
    runs = _runs(finished)
    assert len(runs) == 2 and all(r.parent.span_id == job_span.context.span_id and not r.links for r in runs)
    assert {s.context.trace_id for s in finished} == {step.get_span_context().trace_id}


def test_a_bad_job_trace_value_warns_once_naming_the_fix(caplog):
    forget_said()
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "one-trace"}) == job.PER_ROLLOUT
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "one-trace"}) == job.PER_ROLLOUT
    warnings = [r.getMessage() for r in caplog.records if "one-trace" in r.getMessage()]
    assert len(warnings) == 1
    assert job.JOB_TRACE_VARIABLE in warnings[0] and "=single" in warnings[0] and "per_rollout" in warnings[0]
    assert job.job_trace_mode({}) == job.PER_ROLLOUT
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "SINGLE"}) == job.SINGLE
