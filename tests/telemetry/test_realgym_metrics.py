"""Metrics from a real Gym fleet: real `gym env start` under real `opentelemetry-instrument`,
exporting to a real collector (rotel); Gym 0.4.0 and 0.7.0.

One fleet per version serves every case (module-scoped): six rollouts, three at a time,
with Gym's own aiohttp pool knob cut to two connections per destination so that requests
queue for a slot, the model server's own semaphore (``max_concurrent_requests``) at one,
the policy model dropping the first two model calls' connections (Gym retries each after
0.5 s, inside that semaphore: the other rollouts' calls queue behind it), and log export
opted in with Gym's own variable, and the orchestrator's memory sampler opted in.  Then Gym is stopped
as a user stops it (SIGINT) and the cases read what the collector received.  The embedded
file default's metrics are checked on the file-default run of ``tests/test_realgym_trace.py``.
"""

from __future__ import annotations

import re

import pytest

from tests.harness.metrics import latest as _last
from tests.harness.metrics import log_records
from tests.harness.metrics import metric_points as _points
from tests.harness.traces import drop_upstream, otel_env, reset_upstream
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym

ROLLOUTS = 6


# The policy model drops this many model calls' connections unanswered: Gym's model
# server sends each again (its retry on a server disconnect).
DROPS = 2
MODEL_SITE = "SimpleModelServer._semaphore"  # openai_model's max_concurrent_requests


@pytest.fixture(scope="module", params=["0.4.0", "0.7.0"])
def fleet(request, tmp_path_factory, policy_model):
    from tests.harness.collector import Collector

    version = request.param
    tmp = tmp_path_factory.mktemp(f"metrics-{version}")
    with Collector(log_dir=tmp / "collector") as collector:
        # logs opted in the way Gym's users opt in, and uvicorn's access lines for 200s on
        env = otel_env(
            collector,
            "http/protobuf",
            OTEL_METRIC_EXPORT_INTERVAL="500",
            NEMO_GYM_OTEL_LOGS_ENABLED="true",
            GYM_AUTOINSTR_FLEET_MEMORY="true",
        )
        trio = GymTrio.for_version(
            version,
            tmp / "gym",
            policy_url=policy_model.url,
            instrument=True,
            env=env,
            extra_config={
                "global_aiohttp_connector_limit_per_host": 2,
                "uvicorn_logging_show_200_ok": True,
                MODEL: {"max_concurrent_requests": 1},
            },
        )
        reset_upstream(policy_model)
        with trio:
            drop_upstream(policy_model, DROPS)
            trio.rollouts(ROLLOUTS, concurrency=3)
            agent = f"nemo-gym/{AGENT}"
            assert collector.sink.wait_for(
                lambda _: (
                    sum(
                        p["value"]
                        for p in _last(_points(collector.sink), "gym.rollout.duration_ms").values()
                        if p["service"] == agent
                    )
                    == ROLLOUTS
                ),
                timeout=30,
            ), trio.log_tail()
            trio.stop()
        yield trio, collector.sink, _points(collector.sink)


def test_rollout_and_verify_durations_count_what_was_sent(fleet):
    trio, _, points = fleet
    rollouts = list(_last(points, "gym.rollout.duration_ms").values())
    assert {p["service"] for p in rollouts} == {f"nemo-gym/{AGENT}"}
    assert {p["unit"] for p in rollouts} == {"ms"}
    assert {p["attributes"]["nemo.gym.rollout.outcome"]: p["value"] for p in rollouts} == {"success": ROLLOUTS}
    assert all(0 < p["sum"] / p["value"] < 60_000 for p in rollouts)  # milliseconds
    verify = list(_last(points, "gym.verify.duration_ms").values())
    assert {(p["service"], p["attributes"]["nemo.gym.verify.outcome"], p["value"]) for p in verify} == {
        (f"nemo-gym/{RESOURCES}", "success", ROLLOUTS)
    }


def test_model_calls_by_dialect_and_server(fleet):
    _, _, points = fleet
    calls = list(_last(points, "gym.model.call_duration_ms").values())
    # the example agent calls the model server's /v1/responses twice per rollout
    assert {
        (p["service"], p["attributes"]["nemo.gym.model.dialect"], p["attributes"]["nemo.gym.server.name"], p["value"])
        for p in calls
    } == {(f"nemo-gym/{MODEL}", "responses", MODEL, 2 * ROLLOUTS)}
    first_bytes = list(_last(points, "gym.model.time_to_first_byte_ms").values())
    assert [p["value"] for p in first_bytes] == [2 * ROLLOUTS]
    assert first_bytes[0]["sum"] <= calls[0]["sum"]


def test_in_flight_returns_to_zero_on_every_server(fleet):
    trio, _, points = fleet
    in_flight = _last(points, "gym.server.requests.in_flight")
    by_server = {p["attributes"]["nemo.gym.server.name"]: p["value"] for p in in_flight.values()}
    assert set(by_server) == set(trio.server_names)
    assert set(by_server.values()) == {0}
    assert {p["service"] for p in in_flight.values()} == {f"nemo-gym/{n}" for n in trio.server_names}


def test_pool_waits_name_the_destination_server(fleet):
    trio, sink, points = fleet
    waits = list(_last(points, "gym.http.connection_pool.queue_duration_ms").values())
    assert waits, "three concurrent rollouts over two connections per destination: some requests must queue"
    assert {p["unit"] for p in waits} == {"ms"}
    destinations = {p["attributes"]["nemo.gym.http.destination.server.name"] for p in waits}
    upstream = trio.policy_url.split("//", 1)[1].split("/", 1)[0]  # the model endpoint is not a Gym server
    assert destinations <= set(trio.server_names) | {upstream}
    # the first hop over two connections queues (on 0.7 the relay's calls to the agent;
    # the agent, fed two rollouts at a time, then has no third call to queue)
    assert destinations & set(trio.server_names)
    # CLIENT spans name their callee the same way
    callees = {
        s["attributes"].get("nemo.gym.http.destination.server.name")
        for s in sink.spans()
        if s["kind"] == "CLIENT" and s["resource"]["service.name"] == f"nemo-gym/{AGENT}"
    }
    assert {MODEL, RESOURCES} <= callees


def test_runtime_metrics_from_every_server(fleet):
    trio, _, points = fleet
    servers = {f"nemo-gym/{n}" for n in trio.server_names}
    for name, unit in (
        ("gym.event_loop.lag_ms", "ms"),
        ("gym.gc.pause_duration_ms", "ms"),
        ("gym.gc.collections_total", "{collection}"),
        ("process.cpu.time", "s"),
        ("process.memory.usage", "By"),
        ("process.thread.count", "{thread}"),
        ("process.open_file_descriptor.count", "{file_descriptor}"),
    ):
        found = [p for p in points if p["name"] == name]
        assert servers <= {p["service"] for p in found}, name
        assert {p["unit"] for p in found} == {unit}, name
    lag = [p for p in points if p["name"] == "gym.event_loop.lag_ms"]
    assert all(p["value"] > 0 for p in lag)
    memory = [p["value"] for p in points if p["name"] == "process.memory.usage"]
    assert min(memory) > 20 * 1024 * 1024
    assert not [p for p in points if p["name"].startswith("system.")]  # host-wide metrics stay off
    # the one outcome metric is ours, gym.rollout.reward (issue #53): from the agent alone
    outcome = {(p["name"], p["service"]) for p in points if "reward" in p["name"] or "accuracy" in p["name"]}
    assert {name for name, _ in outcome} <= {"gym.rollout.reward"}
    assert {service for _, service in outcome} <= {f"nemo-gym/{AGENT}"}


def test_log_lines_of_a_rollout_carry_its_trace_id(fleet):
    trio, sink, _ = fleet
    records = [(r["service"], r["body"], r["trace_id"], r["span_id"]) for r in log_records(sink)]
    agent = f"nemo-gym/{AGENT}"
    run_lines = [r for r in records if r[0] == agent and '"POST /run HTTP' in r[1]]
    assert len(run_lines) == ROLLOUTS, records[:20]  # uvicorn's access line of each rollout's /run
    server_spans = {
        (s["trace_id"], s["span_id"])
        for s in sink.spans()
        if s["kind"] == "SERVER" and s["name"] == "POST /run" and s["resource"]["service.name"] == agent
    }
    assert {(r[2], r[3]) for r in run_lines} == server_spans  # logged inside that request's SERVER span


def test_startup_spans_for_every_server_with_stages(fleet):
    trio, sink, _ = fleet
    assert_startup_spans(sink.spans(), trio)


def assert_startup_spans(spans: list[dict], trio: GymTrio) -> None:
    (root,) = [s for s in spans if s["name"] == "gym.startup"]
    assert root["resource"]["service.name"] == "nemo-gym/orchestrator" and root["parent_span_id"] is None
    per_server = {s["attributes"]["nemo.gym.server.name"]: s for s in spans if s["name"] == "gym.startup.server"}
    assert set(per_server) == set(trio.server_names)
    for name, spawned in per_server.items():
        assert (spawned["trace_id"], spawned["parent_span_id"]) == (root["trace_id"], root["span_id"])
        assert root["start_ns"] <= spawned["start_ns"] < spawned["end_ns"] <= root["end_ns"]
        # inside the server: its own span, child of the orchestrator's span for it, with the stages
        (inside,) = [
            s
            for s in spans
            if s["name"] == "gym.server.startup" and s["resource"]["service.name"] == f"nemo-gym/{name}"
        ]
        assert (inside["trace_id"], inside["parent_span_id"]) == (root["trace_id"], spawned["span_id"])
        assert inside["attributes"]["nemo.gym.server.name"] == name
        assert inside["end_ns"] <= spawned["end_ns"]  # ready before the health poll that found it ready
        stages = {s["name"]: s for s in spans if s["parent_span_id"] == inside["span_id"]}
        assert set(stages) == {
            "gym.server.startup.venv_setup",
            "gym.server.startup.interpreter_start",
            "gym.server.startup.imports",
            "gym.server.startup.uvicorn_startup",
        }
        ordered = sorted(stages.values(), key=lambda s: s["start_ns"])
        assert [s["name"].rsplit(".", 1)[1] for s in ordered] == [
            "venv_setup",
            "interpreter_start",
            "imports",
            "uvicorn_startup",
        ]
        assert inside["start_ns"] <= ordered[0]["start_ns"] and ordered[-1]["end_ns"] <= inside["end_ns"]
        for before, after in zip(ordered, ordered[1:]):
            assert before["end_ns"] <= after["start_ns"]


def test_gyms_own_log_lines_of_a_rollout_end_with_its_trace_id(fleet):
    """What the agent prints to Gym's log for each rollout's /run (uvicorn's access line)
    ends with that request's trace and span ids; the health polls outside any span don't."""
    trio, sink, _ = fleet
    agent = f"nemo-gym/{AGENT}"
    server_spans = {
        (s["trace_id"], s["span_id"])
        for s in sink.spans()
        if s["kind"] == "SERVER" and s["name"] == "POST /run" and s["resource"]["service.name"] == agent
    }
    assert len(server_spans) == ROLLOUTS
    lines = trio.log_text().splitlines()
    ids = re.compile(r" trace_id=([0-9a-f]{32}) span_id=([0-9a-f]{16})$")
    on_lines = {m.groups() for line in lines if '"POST /run HTTP' in line for m in [ids.search(line)] if m}
    assert server_spans <= on_lines, [line for line in lines if "POST /run" in line][:10]
    assert not [line for line in lines if '"GET / HTTP' in line and "trace_id=" in line]


def test_retries_counted_by_gyms_reason_on_the_model_server(fleet):
    trio, _, points = fleet
    retries = list(_last(points, "gym.http.retry_total").values())
    assert {
        (
            p["service"],
            p["attributes"]["nemo.gym.http.retry_reason"],
            p["attributes"]["nemo.gym.http.internal"],
            p["value"],
        )
        for p in retries
    } == {(f"nemo-gym/{MODEL}", "server_disconnected", False, DROPS)}
    assert not [p for p in points if p["name"] == "gym.http.timeout_total" and p["value"]]  # nothing timed out


def test_new_connections_by_destination(fleet):
    trio, _, points = fleet
    connects = {
        (p["service"], p["attributes"]["nemo.gym.http.destination.server.name"]): p["value"]
        for p in _last(points, "gym.http.connection_pool.connect_total").values()
    }
    upstream = trio.policy_url.split("//", 1)[1].split("/", 1)[0]
    assert connects[(f"nemo-gym/{AGENT}", MODEL)] >= 1 and connects[(f"nemo-gym/{AGENT}", RESOURCES)] >= 1
    # every dropped call's connection is gone: the model server opened a new one for each resend
    assert connects[(f"nemo-gym/{MODEL}", upstream)] >= DROPS + 1


def test_the_model_servers_semaphore_limit_and_waits(fleet):
    """openai_model's own ``max_concurrent_requests`` semaphore, at one, under three
    concurrent rollouts: the limit, nothing held or waiting once done, and waits recorded."""
    trio, _, points = fleet
    model = f"nemo-gym/{MODEL}"
    site = {"nemo.gym.concurrency.site": MODEL_SITE, "nemo.gym.server.name": MODEL}
    gauges = {
        p["name"]: p["value"]
        for name in (
            "gym.concurrency.limit",
            "gym.concurrency.active",
            "gym.concurrency.available",
            "gym.concurrency.queue_depth",
        )
        for p in _last(points, name).values()
        if p["service"] == model and p["attributes"] == site
    }
    assert gauges == {
        "gym.concurrency.limit": 1,
        "gym.concurrency.active": 0,
        "gym.concurrency.available": 1,
        "gym.concurrency.queue_depth": 0,
    }
    assert max(p["value"] for p in points if p["name"] == "gym.concurrency.active" and p["service"] == model) <= 1
    waits = [p for p in _last(points, "gym.concurrency.queue_wait_duration_ms").values()]
    assert {(p["service"], p["unit"]) for p in waits} == {(model, "ms")}
    assert [p["attributes"] for p in waits] == [site]
    assert 0 < waits[0]["value"] < 2 * ROLLOUTS  # some of the 12 model calls queued behind another


def test_the_orchestrator_samples_each_servers_process_tree_memory(fleet):
    trio, _, points = fleet
    memory = [p for p in points if p["name"] == "gym.server.process_tree.memory.usage"]
    assert {p["service"] for p in memory} == {"nemo-gym/orchestrator"}
    assert {p["unit"] for p in memory} == {"By"}
    by_server = {}
    for p in memory:
        by_server.setdefault(p["attributes"]["nemo.gym.server.name"], []).append(p["value"])
    assert set(by_server) == set(trio.server_names)
    # sampled from the spawn (a shell) on: once serving, a Python server with its imports
    assert all(min(values) > 0 and max(values) > 30 * 1024 * 1024 for values in by_server.values()), by_server
