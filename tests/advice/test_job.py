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

from gym_autoinstr import attributes as attr
from gym_autoinstr._log import forget_said
from gym_autoinstr.advice import job
from tests.harness.servers import run_async, serve

pytest.importorskip("nemo_gym")


@pytest.fixture(autouse=True)
def _default_job_trace(monkeypatch):
    """``GYM_AUTOINSTR_JOB_TRACE`` unset: each rollout its own trace (a test may set it)."""
    monkeypatch.delenv(job.JOB_TRACE_VARIABLE, raising=False)


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


def test_each_rollout_is_a_root_linked_to_the_job_which_counts_them(instrumented, spans):
    app = _agent_app()
    with serve(app) as base:
        _collect(base, [{}, {}, {"fail": True}])
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.parent is None
    attributes = dict(job_span.attributes)
    assert re.fullmatch(r"[0-9a-f]{32}", attributes.pop(attr.JOB_ID))
    assert attributes == {
        attr.JOB_TRACE: "per_rollout",
        attr.JOB_ENTRY: "run_from_config",
        attr.JOB_NUM_REPEATS: 3,
        attr.JOB_ROLLOUTS_SENT: 3,
        attr.JOB_ROLLOUTS_FAILED: 1,
    }
    runs = _runs(finished)
    assert len(runs) == 3 and len({r.context.trace_id for r in runs}) == 3
    for run in runs:
        assert run.parent is None and run.context.trace_id != job_span.context.trace_id
        assert [link.context for link in run.links] == [job_span.context]
        assert run.attributes[attr.JOB_ID] == job_span.attributes[attr.JOB_ID]
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
    assert job_span.attributes[attr.JOB_TRACE] == "single" and job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 2
    runs = _runs(finished)
    assert len(runs) == 2
    assert all(r.parent.span_id == job_span.context.span_id and not r.links for r in runs)
    assert {s.context.trace_id for s in finished} == {job_span.context.trace_id}


def test_an_embedders_open_span_parents_the_job_and_its_rollouts(instrumented, spans):
    with serve(_agent_app()) as base:
        with trace.get_tracer("embedder").start_as_current_span("train.step") as step:
            _collect(base, [{}, {}])
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.parent.span_id == step.get_span_context().span_id
    assert job_span.attributes[attr.JOB_TRACE] == "embedded"
    runs = _runs(finished)
    assert len(runs) == 2 and all(r.parent.span_id == job_span.context.span_id and not r.links for r in runs)
    assert {s.context.trace_id for s in finished} == {step.get_span_context().trace_id}


def test_a_bad_job_trace_value_warns_once_naming_the_fix(caplog):
    forget_said()
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "one-trace"}) is job.JobTrace.PER_ROLLOUT
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "one-trace"}) is job.JobTrace.PER_ROLLOUT
    warnings = [r.getMessage() for r in caplog.records if "one-trace" in r.getMessage()]
    assert len(warnings) == 1
    assert job.JOB_TRACE_VARIABLE in warnings[0] and "=single" in warnings[0] and "per_rollout" in warnings[0]
    assert job.job_trace_mode({}) is job.JobTrace.PER_ROLLOUT
    assert job.job_trace_mode({job.JOB_TRACE_VARIABLE: "SINGLE"}) is job.JobTrace.SINGLE


def _examples(base: str, bodies: list[dict]):
    """What run_examples does on 0.7.0: an iterator whose rollout tasks start at the first
    ``next``, yielding awaitables the caller awaits."""
    from nemo_gym import server_utils

    async def post(body: dict) -> dict:
        response = await server_utils.request("POST", f"{base}/run", json=body)
        return await response.json()

    def run_examples(rows):
        def started():
            tasks = [asyncio.ensure_future(post(row)) for row in rows]
            yield from asyncio.as_completed(tasks)

        return started()

    return run_examples


def test_run_examples_opens_one_job_per_call_ending_with_its_last_rollout(instrumented, spans):
    with serve(_agent_app()) as base:
        run_examples = _examples(base, [])

        async def caller():
            results = [await future for future in job.run_examples_advice(run_examples, None, ([{}, {}],), {})]
            # before the last await the job was open; now it has ended
            return results

        assert run_async(caller()) == [{"reward": 1.0}] * 2
    finished = spans.get_finished_spans()
    (job_span,) = _by_name(finished, "gym.job")
    assert job_span.parent is None and job_span.attributes[attr.JOB_ENTRY] == "run_examples"
    assert job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 2 and attr.JOB_NUM_REPEATS not in job_span.attributes
    runs = _runs(finished)
    assert len(runs) == 2 and all(
        r.parent is None and [link.context for link in r.links] == [job_span.context] for r in runs
    )
    assert all(r.end_time <= job_span.end_time for r in runs)


def test_run_examples_inside_run_from_config_opens_no_second_job(instrumented, spans):
    with serve(_agent_app()) as base:
        run_examples = _examples(base, [])

        async def driver(config):  # 0.4.0's run_from_config calls run_examples
            return [await f for f in job.run_examples_advice(run_examples, None, ([{}],), {})]

        run_async(job.run_from_config_advice(driver, None, (SimpleNamespace(num_repeats=1),), {}))
    (job_span,) = _by_name(spans.get_finished_spans(), "gym.job")
    assert job_span.attributes[attr.JOB_ENTRY] == "run_from_config" and job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 1


def test_our_own_rootless_ray_execute_is_not_an_embedders_span(instrumented, spans):
    """In a Ray actor, a ray.execute of ours with nothing upstream: the job starts its own
    trace, linked to it; a span the actor opens below it is an embedder's again."""
    from opentelemetry import context as otel_context

    from gym_autoinstr.advice import ray_actor
    from gym_autoinstr.telemetry.spans import tracer

    execute = tracer().start_span("ray.execute GymActor.run_rollouts", kind=SpanKind.CONSUMER)
    token = otel_context.attach(ray_actor.mark_rootless(execute, trace.set_span_in_context(execute)))
    try:
        assert ray_actor.rootless_call() is execute and ray_actor.caller_is_rootless()
        with serve(_agent_app()) as base:
            _collect(base, [{}, {}])
            with trace.get_tracer("embedder").start_as_current_span("rl.gym.run_rollouts") as outer:
                assert ray_actor.rootless_call() is None and not ray_actor.caller_is_rootless()
                _collect(base, [{}])
    finally:
        otel_context.detach(token)
        execute.end()
    finished = spans.get_finished_spans()
    rooted, nested = sorted(_by_name(finished, "gym.job"), key=lambda s: s.start_time)
    assert rooted.parent is None and [link.context for link in rooted.links] == [execute.get_span_context()]
    assert rooted.attributes[attr.JOB_TRACE] == "per_rollout"
    runs = [r for r in _runs(finished) if r.links]
    assert len(runs) == 2 and all(
        r.parent is None and [link.context for link in r.links] == [rooted.context] for r in runs
    )
    assert nested.parent.span_id == outer.get_span_context().span_id and nested.attributes[attr.JOB_TRACE] == "embedded"
    (under,) = [r for r in _runs(finished) if not r.links]
    assert under.parent.span_id == nested.context.span_id


# -- run_examples' iterator bookkeeping: every way a caller can be done with it --------------


def _job_spans(spans):
    return _by_name(spans.get_finished_spans(), "gym.job")


def test_an_iterator_dropped_before_its_first_next_still_ends_its_job(instrumented, spans):
    import gc

    iterator = job.run_examples_advice(lambda rows: iter(rows), None, ([],), {})
    assert not _job_spans(spans)
    del iterator
    gc.collect()
    (job_span,) = _job_spans(spans)
    assert job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 0 and job_span.status.is_ok


def test_an_error_from_gyms_iterator_marks_and_ends_the_job(instrumented, spans):
    def run_examples(rows):
        def rows_checked():  # 0.7.0 validates rows at the first next
            raise KeyError("agent_ref")
            yield

        return rows_checked()

    with pytest.raises(KeyError):
        list(job.run_examples_advice(run_examples, None, ([{}],), {}))
    (job_span,) = _job_spans(spans)
    assert job_span.status.status_code.name == "ERROR" and job_span.attributes["error.type"] == "KeyError"


def test_closing_early_closes_gyms_iterator_and_the_job_ends_with_its_last_awaited_rollout(instrumented, spans):
    closed, kept = [], []
    with serve(_agent_app()) as base:
        started = _examples(base, [])

        def run_examples(rows):
            def gyms():
                try:
                    yield from started(rows)
                finally:
                    closed.append(True)

            kept.append(gyms())  # referenced elsewhere too (as tqdm keeps 0.4.0's): only a close closes it
            return kept[-1]

        async def caller():
            iterator = job.run_examples_advice(run_examples, None, ([{}, {}, {}],), {})
            first = next(iterator)
            iterator.close()
            assert closed == [True] and not _job_spans(spans)  # a yielded rollout is still pending
            return await first

        assert run_async(caller()) == {"reward": 1.0}
    (job_span,) = _job_spans(spans)
    assert job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 3  # 0.7.0-like: all three tasks started at the first next
    assert all(r.end_time <= job_span.end_time for r in _runs(spans.get_finished_spans()))


def test_a_rollout_awaitable_dropped_unawaited_does_not_keep_the_job_open(instrumented, spans):
    import gc
    import warnings

    async def one_rollout():
        return {"reward": 1.0}

    iterator = job.run_examples_advice(lambda rows: (one_rollout() for _ in rows), None, ([{}, {}],), {})
    awaitables = list(iterator)
    assert not _job_spans(spans)
    assert run_async(awaitables[0]) == {"reward": 1.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "never awaited", as without us
        del awaitables, iterator
        gc.collect()
    assert len(_job_spans(spans)) == 1


def test_tasks_pass_through_unchanged_and_settle_when_done(instrumented, spans):
    async def caller():
        async def rollout(n):
            await asyncio.sleep(0.01 * n)
            return n

        tasks = [asyncio.ensure_future(rollout(n)) for n in (1, 2)]
        yielded = list(job.run_examples_advice(lambda rows: iter(tasks), None, ([{}, {}],), {}))
        assert [a is b for a, b in zip(yielded, tasks)] == [True, True]
        assert not _job_spans(spans)
        return [await t for t in yielded]

    assert run_async(caller()) == [1, 2]
    assert len(_job_spans(spans)) == 1


def test_concurrent_jobs_count_and_link_only_their_own_rollouts(instrumented, spans):
    with serve(_agent_app()) as base:
        run_examples = _examples(base, [])

        async def caller():
            first = job.run_examples_advice(run_examples, None, ([{}, {}],), {})
            second = job.run_examples_advice(run_examples, None, ([{}, {}, {}],), {})
            # interleaved: a next of one, then of the other, all awaited together
            awaitables = [next(first), next(second)] + list(first) + list(second)
            return await asyncio.gather(*awaitables)

        assert run_async(caller()) == [{"reward": 1.0}] * 5
    finished = spans.get_finished_spans()
    jobs = {s.attributes[attr.JOB_ROLLOUTS_SENT]: s for s in _by_name(finished, "gym.job")}
    assert sorted(jobs) == [2, 3]
    for sent, job_span in jobs.items():
        linked = [r for r in _runs(finished) if [link.context for link in r.links] == [job_span.context]]
        assert len(linked) == sent and all(r.end_time <= job_span.end_time for r in linked)


# -- the job's size: on gym.job, and in a note in the run directory --------------------------


def _job_notes(directory) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in sorted(directory.glob("job-*.json"))]


def test_the_rows_gyms_driver_hands_run_examples_are_the_jobs_size_on_its_span_and_in_a_note(
    instrumented, spans, monkeypatch, tmp_path
):
    """Gym's driver up to 0.5.x: run_from_config hands every row (rows x repeats) to
    run_examples before the first dispatch."""
    import os
    import time

    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path))
    seen_at_dispatch = []
    with serve(_agent_app()) as base:
        run_examples = _examples(base, [])

        async def driver(config):
            iterator = job.run_examples_advice(run_examples, None, ([{}, {}, {}],), {})
            seen_at_dispatch.extend(_job_notes(tmp_path))  # before any rollout went out
            return [await f for f in iterator]

        before = time.time()
        run_async(job.run_from_config_advice(driver, None, (SimpleNamespace(num_repeats=3),), {}))
    (job_span,) = _by_name(spans.get_finished_spans(), "gym.job")
    assert job_span.attributes[attr.JOB_ROLLOUTS_EXPECTED] == 3 and job_span.attributes[attr.JOB_ROLLOUTS_SENT] == 3
    job_id = job_span.attributes[attr.JOB_ID]
    (note,) = seen_at_dispatch
    assert note == {"job_id": job_id, "expected": 3, "started": note["started"], "pid": os.getpid()}
    assert before <= note["started"] <= time.time()
    assert [p.name for p in tmp_path.iterdir()] == [f"job-{job_id}.json"]  # nothing left aside


def test_on_gym_0_6_and_later_the_size_is_the_materialized_inputs_line_count(
    instrumented, spans, monkeypatch, tmp_path
):
    """0.6+'s driver dispatches through a private helper: the size is counted from the
    materialized input file (a line per rollout) at the first dispatch, off Gym's loop; the
    note is there from the job's start, its size null until then."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(run_dir))
    materialized = tmp_path / "rollouts.materialized_inputs.jsonl"
    at_start = []

    async def driver(config):
        at_start.extend(_job_notes(run_dir))
        materialized.write_text('{"row": 1}\n' * 4)  # what Gym writes before dispatching
        from nemo_gym import server_utils

        for _ in range(4):
            response = await server_utils.request("POST", f"{base}/run", json={})
            await response.read()
        for _ in range(200):  # the count runs on a thread of ours
            if _job_notes(run_dir)[0]["expected"] is not None:
                break
            await asyncio.sleep(0.01)

    with serve(_agent_app()) as base:
        config = SimpleNamespace(num_repeats=2, materialized_jsonl_fpath=materialized, resume_from_cache=False)
        run_async(job.run_from_config_advice(driver, None, (config,), {}))
    (job_span,) = _by_name(spans.get_finished_spans(), "gym.job")
    assert [n["expected"] for n in at_start] == [None]
    assert at_start[0]["job_id"] == job_span.attributes[attr.JOB_ID]
    (note,) = _job_notes(run_dir)
    assert note["expected"] == 4 == job_span.attributes[attr.JOB_ROLLOUTS_EXPECTED]
    assert note["started"] == at_start[0]["started"]


def test_a_job_resumed_from_gyms_cache_or_with_unknown_rows_has_no_size(instrumented, spans, monkeypatch, tmp_path):
    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path))
    materialized = tmp_path / "inputs.jsonl"
    materialized.write_text("{}\n" * 5)
    with serve(_agent_app()) as base:
        _collect(base, [{}, {}])  # a config without a materialized file
        config = SimpleNamespace(num_repeats=1, materialized_jsonl_fpath=materialized, resume_from_cache=True)

        async def driver(config):
            from nemo_gym import server_utils

            await (await server_utils.request("POST", f"{base}/run", json={})).read()

        run_async(job.run_from_config_advice(driver, None, (config,), {}))
    jobs = _by_name(spans.get_finished_spans(), "gym.job")
    assert len(jobs) == 2 and all(attr.JOB_ROLLOUTS_EXPECTED not in j.attributes for j in jobs)
    notes = _job_notes(tmp_path)
    assert sorted(n["job_id"] for n in notes) == sorted(j.attributes[attr.JOB_ID] for j in jobs)
    assert [n["expected"] for n in notes] == [None, None]


def test_an_embedders_run_examples_job_has_its_rows_as_its_size(instrumented, spans, monkeypatch, tmp_path):
    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path))
    with serve(_agent_app()) as base:
        started = _examples(base, [])

        def run_examples(examples):  # Gym's own parameter name, passed by keyword
            return started(examples)

        async def caller():
            return [await f for f in job.run_examples_advice(run_examples, None, (), {"examples": [{}, {}]})]

        run_async(caller())
    (job_span,) = _by_name(spans.get_finished_spans(), "gym.job")
    assert job_span.attributes[attr.JOB_ROLLOUTS_EXPECTED] == 2
    (note,) = _job_notes(tmp_path)
    assert note["job_id"] == job_span.attributes[attr.JOB_ID] and note["expected"] == 2


def test_no_note_without_a_run_directory_and_an_unwritable_one_never_reaches_gym(
    instrumented, spans, monkeypatch, tmp_path, caplog
):
    import logging

    monkeypatch.delenv("GYM_AUTOINSTR_OUTPUT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with serve(_agent_app()) as base:
        _collect(base, [{}])
        assert list(tmp_path.iterdir()) == []
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(blocker / "run"))  # under a file: cannot be made
        with caplog.at_level(logging.DEBUG, logger="gym_autoinstr"):
            _collect(base, [{}, {}])
    jobs = _by_name(spans.get_finished_spans(), "gym.job")
    assert [j.attributes[attr.JOB_ROLLOUTS_SENT] for j in jobs] == [1, 2]
    assert any("job-" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
