"""Metrics from a real Gym fleet: real `gym env start` under real `opentelemetry-instrument`,
exporting to a real collector (rotel); Gym 0.4.0 and 0.7.0.

One fleet per version serves every case (module-scoped): six rollouts, three at a time,
with Gym's own aiohttp pool knob cut to one connection per destination so that requests
queue for a slot, and log export opted in with Gym's own variable.  Then Gym is stopped
as a user stops it (SIGINT) and the cases read what the collector received.  The embedded
file default's metrics are checked on the file-default run of ``tests/test_realgym_trace.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio
from tests.harness.traces import otel_env

pytestmark = pytest.mark.realgym

ROLLOUTS = 6


def _points(sink) -> list[dict]:
    from tests.harness.collector import _attrs

    points = []
    for request in sink.metrics_requests():
        for resource_metrics in request.resource_metrics:
            service = _attrs(resource_metrics.resource.attributes).get("service.name")
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        points.append({
                            "name": metric.name, "unit": metric.unit, "kind": kind, "service": service,
                            "attributes": _attrs(point.attributes),
                            "value": point.count if kind == "histogram" else (point.as_int or point.as_double),
                            "sum": getattr(point, "sum", None), "max": getattr(point, "max", None),
                            "time": point.time_unix_nano,
                        })
    return points


def _last(points: list[dict], name: str) -> dict:
    """The latest cumulative point per (service, attributes)."""
    latest: dict = {}
    for p in sorted((p for p in points if p["name"] == name), key=lambda p: p["time"]):
        latest[(p["service"], json.dumps(p["attributes"], sort_keys=True))] = p
    return latest


@pytest.fixture(scope="module", params=["0.4.0", "0.7.0"])
def fleet(request, tmp_path_factory, policy_model):
    from tests.harness.collector import Collector

    version = request.param
    tmp = tmp_path_factory.mktemp(f"metrics-{version}")
    with Collector(log_dir=tmp / "collector") as collector:
        # logs opted in the way Gym's users opt in, and uvicorn's access lines for 200s on
        env = otel_env(collector, "http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="500", NEMO_GYM_OTEL_LOGS_ENABLED="true")
        trio = GymTrio(gym_venv(version), version, tmp / "gym", policy_url=policy_model.url, instrument=True, env=env,
                       extra_config={"global_aiohttp_connector_limit_per_host": 1, "uvicorn_logging_show_200_ok": True})
        with trio:
            trio.rollouts(ROLLOUTS, concurrency=3)
            agent = f"nemo-gym/{AGENT}"
            assert collector.sink.wait_for(lambda _: sum(
                p["value"] for p in _last(_points(collector.sink), "gym.rollout.duration_ms").values()
                if p["service"] == agent) == ROLLOUTS, timeout=30), trio.log_tail()
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
        (f"nemo-gym/{RESOURCES}", "success", ROLLOUTS)}


def test_model_calls_by_dialect_and_server(fleet):
    _, _, points = fleet
    calls = list(_last(points, "gym.model.call_duration_ms").values())
    # the example agent calls the model server's /v1/responses twice per rollout
    assert {(p["service"], p["attributes"]["nemo.gym.model.dialect"], p["attributes"]["nemo.gym.server.name"], p["value"])
            for p in calls} == {(f"nemo-gym/{MODEL}", "responses", MODEL, 2 * ROLLOUTS)}
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
    assert waits, "three concurrent rollouts over one connection per destination: some requests must queue"
    assert {p["unit"] for p in waits} == {"ms"}
    destinations = {p["attributes"]["nemo.gym.http.destination.server.name"] for p in waits}
    upstream = trio.policy_url.split("//", 1)[1].split("/", 1)[0]  # the model endpoint is not a Gym server
    assert destinations <= set(trio.server_names) | {upstream}
    # the first hop over one connection queues (on 0.7 the relay's calls to the agent;
    # the agent, fed one rollout at a time, then has no second call to queue)
    assert destinations & set(trio.server_names)
    # CLIENT spans name their callee the same way
    callees = {s["attributes"].get("nemo.gym.http.destination.server.name") for s in sink.spans() if s["kind"] == "CLIENT"
               and s["resource"]["service.name"] == f"nemo-gym/{AGENT}"}
    assert {MODEL, RESOURCES} <= callees


def test_runtime_metrics_from_every_server(fleet):
    trio, _, points = fleet
    servers = {f"nemo-gym/{n}" for n in trio.server_names}
    for name, unit in (("gym.event_loop.lag_ms", "ms"), ("gym.gc.pause_duration_ms", "ms"),
                       ("gym.gc.collections_total", "{collection}"), ("process.cpu.time", "s"),
                       ("process.memory.usage", "By"), ("process.thread.count", "{thread}"),
                       ("process.open_file_descriptor.count", "{file_descriptor}")):
        found = [p for p in points if p["name"] == name]
        assert servers <= {p["service"] for p in found}, name
        assert {p["unit"] for p in found} == {unit}, name
    lag = [p for p in points if p["name"] == "gym.event_loop.lag_ms"]
    assert all(p["value"] > 0 for p in lag)
    memory = [p["value"] for p in points if p["name"] == "process.memory.usage"]
    assert min(memory) > 20 * 1024 * 1024
    assert not [p for p in points if p["name"].startswith("system.")]  # host-wide metrics stay off
    assert not [p for p in points if "reward" in p["name"] or "accuracy" in p["name"]]


def test_log_lines_of_a_rollout_carry_its_trace_id(fleet):
    from tests.harness.collector import _attrs

    trio, sink, _ = fleet
    records = []
    for request in sink.logs_requests():
        for resource_logs in request.resource_logs:
            service = _attrs(resource_logs.resource.attributes).get("service.name")
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    records.append((service, record.body.string_value, record.trace_id.hex(), record.span_id.hex()))
    agent = f"nemo-gym/{AGENT}"
    run_lines = [r for r in records if r[0] == agent and '"POST /run HTTP' in r[1]]
    assert len(run_lines) == ROLLOUTS, records[:20]  # uvicorn's access line of each rollout's /run
    server_spans = {(s["trace_id"], s["span_id"]) for s in sink.spans()
                    if s["kind"] == "SERVER" and s["name"] == "POST /run" and s["resource"]["service.name"] == agent}
    assert {(r[2], r[3]) for r in run_lines} == server_spans  # logged inside that request's SERVER span


def test_startup_spans_for_every_server_with_stages(fleet):
    trio, sink, _ = fleet
    spans = sink.spans()
    (root,) = [s for s in spans if s["name"] == "gym.startup"]
    assert root["resource"]["service.name"] == "nemo-gym/orchestrator" and root["parent_span_id"] is None
    per_server = {s["attributes"]["nemo.gym.server.name"]: s for s in spans if s["name"] == "gym.startup.server"}
    assert set(per_server) == set(trio.server_names)
    for name, spawned in per_server.items():
        assert (spawned["trace_id"], spawned["parent_span_id"]) == (root["trace_id"], root["span_id"])
        assert root["start_ns"] <= spawned["start_ns"] < spawned["end_ns"] <= root["end_ns"]
        # inside the server: its own span, child of the orchestrator's span for it, with the stages
        (inside,) = [s for s in spans if s["name"] == "gym.server.startup" and s["resource"]["service.name"] == f"nemo-gym/{name}"]
        assert (inside["trace_id"], inside["parent_span_id"]) == (root["trace_id"], spawned["span_id"])
        assert inside["attributes"]["nemo.gym.server.name"] == name
        assert inside["end_ns"] <= spawned["end_ns"]  # ready before the health poll that found it ready
        stages = {s["name"]: s for s in spans if s["parent_span_id"] == inside["span_id"]}
        assert set(stages) == {"gym.server.startup.venv_setup", "gym.server.startup.interpreter_start",
                               "gym.server.startup.imports", "gym.server.startup.uvicorn_startup"}
        ordered = sorted(stages.values(), key=lambda s: s["start_ns"])
        assert [s["name"].rsplit(".", 1)[1] for s in ordered] == ["venv_setup", "interpreter_start", "imports", "uvicorn_startup"]
        assert inside["start_ns"] <= ordered[0]["start_ns"] and ordered[-1]["end_ns"] <= inside["end_ns"]
        for before, after in zip(ordered, ordered[1:]):
            assert before["end_ns"] <= after["start_ns"]
