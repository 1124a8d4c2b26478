"""Metrics in-process: real Gym server classes and FastAPI apps served by real uvicorn, the real
SDK meter provider read by an in-memory reader (``reader``, ``conftest.py``): rollouts,
verifications and model calls by outcome, sampled out or not, event-loop lag, GC pauses and
process metrics.  What Gym's servers wait on and retry: ``test_metrics_limits.py``.
"""

from __future__ import annotations

import time

from fastapi import FastAPI

from gym_autoinstr.advice.ingress import instrument_app
from gym_autoinstr.telemetry import runtime
from tests.advice.test_routes import _agent, _model, _post, _resources
from tests.harness.servers import post_json, serve
from tests.telemetry.metric_points import counts, points


def test_rollouts_and_verifications_by_outcome(instrumented, reader):
    agent = _agent("metrics_agent")
    resources = _resources(name="metrics_resources")
    rollouts_before = counts(reader, "gym.rollout.duration_ms", "nemo.gym.rollout.outcome")
    verify_before = counts(reader, "gym.verify.duration_ms", "nemo.gym.verify.outcome")
    agent_app, resources_app = agent.setup_webserver(), resources.setup_webserver()
    instrument_app(agent_app, "metrics_agent")
    instrument_app(resources_app, "metrics_resources")
    with serve(agent_app) as agent_url, serve(resources_app) as resources_url:
        for _ in range(3):
            assert _post(agent_url + "/run", {"question": "q"})[0] == 200
        assert _post(resources_url + "/verify", {"question": "q"})[0] == 200
        assert _post(resources_url + "/verify", {"question": "boom"})[0] == 500
        assert _post(resources_url + "/seed_session", {})[0] == 200

    def delta(now, before):
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}

    assert delta(counts(reader, "gym.rollout.duration_ms", "nemo.gym.rollout.outcome"), rollouts_before) == {
        "success": 3
    }
    assert delta(counts(reader, "gym.verify.duration_ms", "nemo.gym.verify.outcome"), verify_before) == {
        "success": 1,
        "failure": 1,
    }
    (metric, _), *_ = points(reader, "gym.rollout.duration_ms")
    assert metric.unit == "ms"
    for _, point in points(reader, "gym.rollout.duration_ms"):
        assert 0 < point.sum / point.count < 30_000  # milliseconds, not seconds or ns
    routes = counts(reader, "http.server.request.duration", "http.route")
    assert routes.get("/run", 0) >= 3 and routes.get("/seed_session", 0) >= 1
    in_flight = {
        dict(p.attributes)["nemo.gym.server.name"]: p.value for _, p in points(reader, "gym.server.requests.in_flight")
    }
    assert in_flight["metrics_agent"] == 0 and in_flight["metrics_resources"] == 0


def test_model_calls_by_dialect_and_server_with_time_to_first_byte(instrumented, reader):
    server, _ = _model("metrics_model")
    app = server.setup_webserver()
    instrument_app(app, "metrics_model")
    with serve(app) as base:
        assert _post(base + "/v1/chat/completions", {"question": "q"})[0] == 200
        assert _post(base + "/v1/responses", {"question": "stream"})[0] == 200  # 3 chunks, 50 ms apart
    calls = {
        (dict(p.attributes)["nemo.gym.model.dialect"], dict(p.attributes)["nemo.gym.server.name"]): p
        for _, p in points(reader, "gym.model.call_duration_ms")
    }
    first_bytes = {
        dict(p.attributes)["nemo.gym.model.dialect"]: p
        for _, p in points(reader, "gym.model.time_to_first_byte_ms")
        if dict(p.attributes)["nemo.gym.server.name"] == "metrics_model"
    }
    assert calls[("chat_completions", "metrics_model")].count == 1
    stream = calls[("responses", "metrics_model")]
    assert stream.count == 1 and stream.sum >= 150  # the whole stream: three 50 ms sleeps
    assert first_bytes["responses"].count == 1 and first_bytes["responses"].sum < stream.sum  # headers before the body


def test_the_server_group_off_still_gives_metrics(instrumented, reader, spans, monkeypatch):
    from gym_autoinstr.telemetry import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset())
    agent = _agent("untraced_agent")
    app = agent.setup_webserver()
    instrument_app(app, "untraced_agent")
    before = counts(reader, "gym.rollout.duration_ms").get(None, 0)
    with serve(app) as base:
        assert _post(base + "/run", {"question": "q"})[0] == 200
    assert spans.get_finished_spans() == ()
    assert counts(reader, "gym.rollout.duration_ms").get(None, 0) == before + 1


def test_each_rollouts_reward_is_recorded_with_its_agent_span_or_not(instrumented, reader, spans, monkeypatch):
    """``gym.rollout.reward``: one point per /run, read off the agent's answer, whether the
    rollout's seam records a span (its group on) or not (off: the reward is still read)."""
    from gym_autoinstr.telemetry import groups

    agent = _agent("rewarding_agent")
    app = agent.setup_webserver()
    instrument_app(app, "rewarding_agent")

    def recorded():
        found = [
            p
            for _, p in points(reader, "gym.rollout.reward")
            if dict(p.attributes)["gen_ai.agent.name"] == "rewarding_agent"
        ]
        return sum(p.count for p in found), sum(p.sum for p in found), [dict(p.attributes) for p in found]

    with serve(app) as base:
        assert _post(base + "/run", {"question": "q"})[0] == 200
        monkeypatch.setattr(groups, "ENABLED", frozenset())
        assert _post(base + "/run", {"question": "q"})[0] == 200
    count, total, attribute_sets = recorded()
    assert (count, total) == (2, 2.0)  # the test agent's reward is 1.0
    assert attribute_sets == [{"gen_ai.agent.name": "rewarding_agent", "nemo.gym.mask_sample": False}]
    (metric, _), *_ = points(reader, "gym.rollout.reward")
    assert metric.unit == "1"


def test_a_request_whose_caller_was_sampled_out_is_measured_without_a_span(instrumented, reader, spans):
    from opentelemetry import trace

    app = FastAPI()
    seen: list = []

    @app.post("/dropped_caller")
    async def handler(body: dict):
        seen.append(trace.get_current_span().get_span_context())
        return {}

    assert instrument_app(app, "dropped_caller_server")
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    before = counts(reader, "http.server.request.duration", "http.route").get("/dropped_caller", 0)
    with serve(app) as base:
        for _ in range(3):
            assert post_json(base + "/dropped_caller", {}, {"traceparent": f"00-{trace_id}-{parent_id}-00"})[0] == 200
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []
    assert counts(reader, "http.server.request.duration", "http.route").get("/dropped_caller", 0) == before + 3
    ((read_trace, read_span, sampled),) = {
        (format(c.trace_id, "032x"), format(c.span_id, "016x"), c.trace_flags.sampled) for c in seen
    }
    assert read_trace == trace_id and read_span != parent_id and not sampled  # one span id of its own (W3C)
    in_flight = {
        dict(p.attributes)["nemo.gym.server.name"]: p.value for _, p in points(reader, "gym.server.requests.in_flight")
    }
    assert in_flight["dropped_caller_server"] == 0


def test_a_handler_blocking_the_loop_shows_as_event_loop_lag(instrumented, reader, monkeypatch):
    monkeypatch.setenv(runtime.LAG_INTERVAL_ENV, "100")  # a reading every 100 ms: the 200 ms block below is seen
    app = FastAPI()

    @app.post("/block")
    async def block(body: dict):
        time.sleep(0.2)  # synchronous work on the event loop
        return {}

    instrument_app(app, "blocking_server")
    with serve(app) as base:
        time.sleep(0.3)  # the probe is running
        before = max((p.max for _, p in points(reader, "gym.event_loop.lag_ms")), default=0.0)
        assert before < 150, "the loop was already lagging before the block; cannot tell"
        assert _post(base + "/block", {})[0] == 200
        time.sleep(0.3)
    lag = [p for _, p in points(reader, "gym.event_loop.lag_ms")]
    assert lag and max(p.max for p in lag) >= 100  # a 200 ms block delays a 100 ms sleep by >= 100 ms
    (metric, _), *_ = points(reader, "gym.event_loop.lag_ms")
    assert metric.unit == "ms"


def test_the_lag_probes_interval_is_configurable_and_a_bad_value_is_named(monkeypatch, caplog):
    monkeypatch.delenv(runtime.LAG_INTERVAL_ENV, raising=False)
    assert runtime.lag_interval_s() == runtime.LAG_INTERVAL_S
    monkeypatch.setenv(runtime.LAG_INTERVAL_ENV, "2500")
    assert runtime.lag_interval_s() == 2.5
    for bad in ("fast", "0", "-5", "nan"):
        monkeypatch.setenv(runtime.LAG_INTERVAL_ENV, bad)
        assert runtime.lag_interval_s() == runtime.LAG_INTERVAL_S, bad
    assert any(runtime.LAG_INTERVAL_ENV in r.getMessage() and "'fast'" in r.getMessage() for r in caplog.records)


def _lag_readings(reader) -> int:
    """Lag readings so far (cumulative: other tests' servers may have read before)."""
    return sum(p.count for _, p in points(reader, "gym.event_loop.lag_ms"))


def test_a_longer_lag_interval_means_fewer_readings(instrumented, reader, monkeypatch):
    monkeypatch.setenv(runtime.LAG_INTERVAL_ENV, "400")
    app = FastAPI()
    instrument_app(app, "slow_probe_server")
    before = _lag_readings(reader)
    with serve(app):
        time.sleep(1.0)
    assert (
        1 <= _lag_readings(reader) - before <= 4
    )  # after 100, 200, then 400 ms sleeps over ~1 s (100 ms would give ~10)


def test_the_probe_reads_soon_after_start_then_once_per_interval(instrumented, reader, monkeypatch):
    """Default interval (1 s): the first sleeps are 100, 200, 400 ms, so a server that
    lives half a second reports lag; a flat 1 s would give none, a flat 100 ms about five."""
    monkeypatch.delenv(runtime.LAG_INTERVAL_ENV, raising=False)
    assert runtime.LAG_INTERVAL_S >= 1.0
    app = FastAPI()
    instrument_app(app, "short_lived_server")
    before = _lag_readings(reader)
    with serve(app):
        time.sleep(0.5)  # readings at ~0.1 s and ~0.3 s after the lifespan started
        seen = _lag_readings(reader) - before
    assert 1 <= seen <= 3, seen  # (1: a loaded host may wake the second one late)


def test_a_flush_records_the_gc_pauses_the_probe_has_not_drained_yet(reader):
    import gc

    from gym_autoinstr.setup import flush

    before = counts(reader, "gym.gc.pause_duration_ms", "nemo.gym.gc.generation").get(2, 0)
    gc.collect(2)
    assert runtime._pauses, "the GC callback queued no pause"
    assert flush.flush(5.0, reason="test")
    assert counts(reader, "gym.gc.pause_duration_ms", "nemo.gym.gc.generation").get(2, 0) >= before + 1


def test_gc_pauses_and_collections_by_generation(reader):
    import gc

    before = counts(reader, "gym.gc.pause_duration_ms", "nemo.gym.gc.generation").get(2, 0)
    gc.collect()
    gc.collect(2)
    runtime.drain_gc_pauses()  # what each server's loop probe does at every reading
    after = counts(reader, "gym.gc.pause_duration_ms", "nemo.gym.gc.generation")
    assert after.get(2, 0) >= before + 2
    collections = {
        dict(p.attributes)["nemo.gym.gc.generation"]: p.value for _, p in points(reader, "gym.gc.collections_total")
    }
    assert collections[2] == gc.get_stats()[2]["collections"]


def test_process_metrics(reader):
    names = {
        metric.name: metric
        for metric, _ in points(reader, "process.cpu.time")
        + points(reader, "process.memory.usage")
        + points(reader, "process.thread.count")
        + points(reader, "process.open_file_descriptor.count")
    }
    assert set(names) == {
        "process.cpu.time",
        "process.memory.usage",
        "process.thread.count",
        "process.open_file_descriptor.count",
    }
    modes = {dict(p.attributes).get("cpu.mode") for _, p in points(reader, "process.cpu.time")}
    assert modes == {"user", "system"}
    ((_, memory),) = points(reader, "process.memory.usage")
    assert memory.value > 10 * 1024 * 1024  # bytes of this interpreter
