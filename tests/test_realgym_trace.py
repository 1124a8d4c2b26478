"""One rollout, one trace: real Gym processes, real ``opentelemetry-instrument``, a real
collector (rotel) forwarding OTLP to the test's sink.

Each test starts the real ``gym env start`` (agent + model + resources, plus the 0.7
relay) under ``opentelemetry-instrument`` with this project installed in the Gym venv,
runs rollouts against the deterministic policy model in ``examples/``, and asserts on
the trace the collector delivered.
"""

from __future__ import annotations

import signal
import time

import pytest

from gym_autoinstr.setup.files import METRICS_SUFFIX, segment_files, segment_lines, span_segments
from tests.harness.collector import Collector
from tests.harness.metrics import latest, metric_points
from tests.harness.traces import (
    assert_one_connected_trace,
    expected_services,
    otel_env,
    received_upstream,
    reset_upstream,
    rollout_traces,
    service_of,
    strip_ids,
)
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym


# The flagship fleets: each version's default setup (a collector, Gym's own Ray), read by
# more than one test below; made once per module (``flagship``).
FLAGSHIP_PROTOCOL = {"0.4.0": "http/protobuf", "0.7.0": "grpc"}


class FlagshipRun:
    """What one instrumented fleet produced: three rollouts one by one, then four at two
    at once, with metrics exported every 500 ms, read after Gym's shutdown."""

    def __init__(self, trio: GymTrio, results: list[dict], upstream: list[dict], spans, points) -> None:
        self.trio = trio  # stopped; its configuration and log are still there
        self.results = results
        self.upstream = upstream
        self.spans = spans
        self.points = points
        self.log = trio.log_text()
        self.run_service = f"nemo-gym/{ENVIRONMENT if trio.has_relay else AGENT}"


@pytest.fixture(scope="module")
def flagship(policy_model, tmp_path_factory):
    runs: dict[str, FlagshipRun] = {}

    def run(version: str) -> FlagshipRun:
        if version not in runs:
            runs[version] = _flagship_run(version, policy_model, tmp_path_factory.mktemp(f"flagship-{version}"))
        return runs[version]

    return run


def _flagship_run(version: str, policy_model, workdir) -> FlagshipRun:
    reset_upstream(policy_model)
    with Collector(log_dir=workdir / "collector") as collector:
        env = otel_env(collector, FLAGSHIP_PROTOCOL[version], OTEL_METRIC_EXPORT_INTERVAL="500")
        trio = GymTrio.for_version(version, workdir / "gym", policy_model.url, env=env, instrument=True, own_ray=True)
        run_service = f"nemo-gym/{ENVIRONMENT if trio.has_relay else AGENT}"
        with trio:
            results = [trio.rollout() for _ in range(3)]
            results += trio.rollouts(4, concurrency=2)
            assert collector.sink.wait_for(lambda spans: len(rollout_traces(spans, run_service)) >= 7, timeout=30), (
                f"spans received: {sorted({(service_of(s), s['name']) for s in collector.sink.spans()})}\n"
                + trio.log_tail(40)
            )
            # the fleet gauge has been exported (the orchestrator's reading after spawn)
            assert collector.sink.wait_for(
                lambda _: any(
                    p["name"] == "gym.servers.active" and p["value"] == len(trio.server_names)
                    for p in metric_points(collector.sink)
                ),
                timeout=15,
            )
            upstream = received_upstream(policy_model)
        return FlagshipRun(trio, results, upstream, collector.sink.spans(), metric_points(collector.sink))


@pytest.mark.parametrize("version", ["0.4.0", "0.7.0"])
def test_a_rollout_is_one_trace_across_every_server_process(version, flagship, bare_gym):
    run = flagship(version)
    assert "Error in sitecustomize" not in run.log
    assert "Failed to auto initialize" not in run.log

    spans = run.spans
    traces = rollout_traces(spans, run.run_service)
    assert len(traces) == len(run.results) == 7  # seven rollouts, seven traces
    for trace in traces.values():
        assert_one_connected_trace(trace, run.trio)

    # the traceparent reached the OpenAI-compatible upstream, in the rollout's trace
    upstream_traces = {r["traceparent"].split("-")[1] for r in run.upstream if r.get("traceparent")}
    assert set(traces) <= upstream_traces
    assert len([r for r in run.upstream if r["path"].endswith("/responses")]) == 2 * 7

    # only Gym's work reaches the backend: every span comes from a Gym process
    assert {service_of(s) for s in spans} <= expected_services(run.trio) | {"nemo-gym/orchestrator"}
    assert not [s for s in spans if "healthz" in s["name"] or s["attributes"].get("url.path") == "/"]
    # no query string in any attribute
    assert not [s for s in spans for v in s["attributes"].values() if isinstance(v, str) and "?" in v]

    # distinct instances, one run id shared by the fleet
    assert len({s["resource"]["service.instance.id"] for s in spans}) == len({service_of(s) for s in spans})
    assert len({s["resource"].get("nemo.gym.run.id") for s in spans}) == 1

    # the rollout's result is the same as without instrumentation (the session's bare run)
    bare_result = bare_gym(version).results[0]
    assert all(strip_ids(r) == strip_ids(bare_result) for r in run.results)


def _assert_failures_only_trace(
    trace_id: str, trace: list[dict], trio: GymTrio, upstream: list[dict], policy_model
) -> None:
    """``GYM_AUTOINSTR_CLIENT_SPANS=failures``: each callee's SERVER span hangs directly
    under the caller's span, the rollout is still one connected trace, and the only CLIENT
    spans left are the model server's calls to its upstream (not a Gym server)."""
    assert_one_connected_trace(trace, trio, server_parents=("SERVER", "INTERNAL"))
    clients = [s for s in trace if s["kind"] == "CLIENT"]
    to_upstream = [r for r in upstream if (r.get("traceparent") or "").split("-")[1:2] == [trace_id]]
    assert len(clients) == len(to_upstream) == 2  # the model server's two calls upstream
    for span in clients:
        assert service_of(span) == f"nemo-gym/{MODEL}"
        assert span["attributes"]["url.full"].startswith(policy_model.base)
        assert span["attributes"]["http.response.status_code"] == 200


def test_failures_only_shape_has_no_client_span_between_gym_servers(tmp_path, policy_model, collector):
    """The failures-only shape (``GYM_AUTOINSTR_CLIENT_SPANS=failures``) on 0.7: the relay's call to
    the agent loses its CLIENT span too.  (0.4.0's failures-only shape: the ratio-sampler test.)"""
    version = "0.7.0"
    reset_upstream(policy_model)
    env = otel_env(collector, "http/protobuf", GYM_AUTOINSTR_CLIENT_SPANS="failures")
    trio = GymTrio.for_version(version, tmp_path / "gym", policy_url=policy_model.url, instrument=True, env=env)
    with trio:
        results = [trio.rollout() for _ in range(2)]
        assert collector.sink.wait_for(
            lambda spans: len(rollout_traces(spans, f"nemo-gym/{ENVIRONMENT}")) >= 2, timeout=30
        ), trio.log_tail(40)
        upstream = received_upstream(policy_model)
    assert all(r["reward"] == 1.0 for r in results)
    traces = rollout_traces(collector.sink.spans(), f"nemo-gym/{ENVIRONMENT}")
    assert len(traces) == 2
    for trace_id, trace in traces.items():
        _assert_failures_only_trace(trace_id, trace, trio, upstream, policy_model)


def _wait_exited(process, timeout: float = 20) -> None:
    """Until the server has exited (a zombie counts: Gym, its parent, reaps it later)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise AssertionError(f"server {process.pid} still running {timeout}s after the signal")


def _server_spans_for(spans: list[dict], service: str) -> list[dict]:
    return [s for s in spans if s["kind"] == "SERVER" and service_of(s) == service]


def test_a_ratio_sampler_at_the_servers_keeps_each_rollout_whole_or_not_at_all(tmp_path, policy_model, collector):
    """Every server under ``parentbased_traceidratio`` at 1/2 and no caller context: the
    agent's ``POST /run`` is the root, decided at the ingress before its span is made.
    A kept rollout is one connected trace across every server; a dropped one leaves no
    span anywhere, yet its decision still reaches the model's upstream (an unsampled
    ``traceparent`` on each of its calls), and Gym's answers are unchanged.  The fleet
    runs the failures-only shape too (``GYM_AUTOINSTR_CLIENT_SPANS=failures``, 0.4.0): each kept
    rollout has no CLIENT span between Gym servers (one fleet for both settings)."""
    reset_upstream(policy_model)
    env = otel_env(
        collector,
        "http/protobuf",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0.5",
        GYM_AUTOINSTR_CLIENT_SPANS="failures",
    )
    trio = GymTrio.for_version("0.4.0", tmp_path / "gym", policy_url=policy_model.url, instrument=True, env=env)
    n = 30
    with trio:
        results = [trio.rollout() for _ in range(n)]
        upstream = received_upstream(policy_model)
    # stopping the trio flushed every server's spans
    assert collector.sink.wait_for(lambda spans: rollout_traces(spans, f"nemo-gym/{AGENT}"), timeout=30), trio.log_tail(
        40
    )
    time.sleep(2)
    spans = collector.sink.spans()
    traces = rollout_traces(spans, f"nemo-gym/{AGENT}")
    # Binomial(30, 1/2): outside 3..27 has probability ~1e-5
    assert 3 <= len(traces) <= 27, len(traces)
    for trace_id, trace in traces.items():
        _assert_failures_only_trace(trace_id, trace, trio, upstream, policy_model)
    # the model server's upstream calls: two per rollout, each rollout its own trace id,
    # sampled exactly for the kept ones
    calls = [r for r in upstream if r["path"].endswith("/responses")]
    assert len(calls) == 2 * n and all(r.get("traceparent") for r in calls)
    flags: dict[str, set[int]] = {}
    for r in calls:
        _, trace_id, _, flag = r["traceparent"].split("-")
        flags.setdefault(trace_id, set()).add(int(flag, 16) & 0x01)
    assert len(flags) == n and all(len(f) == 1 for f in flags.values())
    assert {t for t, f in flags.items() if f == {1}} == set(traces)
    # a dropped rollout left nothing anywhere, and no /run but the kept ones' was recorded
    dropped = {t for t, f in flags.items() if f == {0}}
    assert not [s for s in spans if s["trace_id"] in dropped]
    assert sum(s["name"] == "POST /run" for s in spans) == len(traces)
    assert all(r == results[0] or strip_ids(r) == strip_ids(results[0]) for r in results)


def test_completed_requests_and_every_uvicorn_worker_are_flushed_when_servers_stop(tmp_path, policy_model, collector):
    """A long batch delay means only the exit flush can deliver.  SIGTERM the model
    server, SIGINT the resources server, then Gym's own shutdown for the rest.  The fleet
    is Gym 0.7's with ``num_workers: 2`` on its relay (the one example server that supports
    workers): the main process serves nothing; each worker re-imports the entrypoint and
    re-enters run_webserver, and only the workers' own exit flush can deliver their spans.
    The relay's admission limit (``max_concurrent_episodes``, an asyncio semaphore each
    worker's server makes) is observed in each worker, not in the idle main process."""
    version = "0.7.0"
    env = otel_env(collector, "grpc", OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_METRIC_EXPORT_INTERVAL="500")
    trio = GymTrio.for_version(
        version,
        tmp_path / "gym",
        policy_url=policy_model.url,
        instrument=True,
        env=env,
        extra_config={ENVIRONMENT: {"num_workers": 2, "max_concurrent_episodes": 2, "queue_timeout_seconds": 60}},
    )
    n = 12
    with trio:
        relay_processes = trio.all_server_processes()[ENVIRONMENT]
        results = trio.rollouts(n, concurrency=6)
        assert all(r["reward"] == 1.0 for r in results)
        time.sleep(0.5)
        assert collector.sink.spans() == []  # nothing exported yet: the batch delay holds them
        servers = trio.server_processes()
        servers[MODEL].send_signal(signal.SIGTERM)
        servers[RESOURCES].send_signal(signal.SIGINT)
        for process in (servers[MODEL], servers[RESOURCES]):
            _wait_exited(process)
        model_spans = lambda spans: len(_server_spans_for(spans, f"nemo-gym/{MODEL}")) >= 2 * n  # noqa: E731
        assert collector.sink.wait_for(model_spans, timeout=10)
    # Gym's own shutdown (SIGINT to `gym env start`) stopped the agent and the relay
    spans = collector.sink.spans()
    assert len(_server_spans_for(spans, f"nemo-gym/{MODEL}")) == 2 * n  # two model calls per rollout
    # seed_session + get_weather + verify per rollout
    assert len(_server_spans_for(spans, f"nemo-gym/{RESOURCES}")) == 3 * n
    assert len(relay_processes) >= 3  # the main process and its two workers
    relay = f"nemo-gym/{ENVIRONMENT}"
    runs = [s for s in _server_spans_for(spans, relay) if s["name"] == "POST /run"]
    assert len(runs) == n  # every rollout's root, exported at worker exit
    # served by instrumented worker processes (distinct instances, never the idle main one)
    assert 1 <= len({s["resource"]["service.instance.id"] for s in runs}) <= 2
    # each worker's CLIENT span to the agent parents the agent's SERVER span: one trace
    by_id = {s["span_id"]: s for s in spans}
    agent_runs = [s for s in _server_spans_for(spans, f"nemo-gym/{AGENT}") if s["name"] == "POST /run"]
    assert len(agent_runs) == n
    for span in agent_runs:
        parent = by_id[span["parent_span_id"]]
        assert parent["kind"] == "CLIENT" and service_of(parent) == relay
        assert by_id[parent["parent_span_id"]] in runs
    # the admission limit, from both workers (two processes, never a third: the main one)
    points = [p for p in metric_points(collector.sink) if p["service"] == relay]
    site = {"nemo.gym.concurrency.site": "LegacyAgentEnvironmentServer._admission", "nemo.gym.server.name": ENVIRONMENT}
    limits = [p for p in points if p["name"] == "gym.concurrency.limit" and p["attributes"] == site]
    assert {p["value"] for p in limits} == {2}, sorted({p["name"] for p in points})
    assert len({p["instance"] for p in limits}) == 2
    assert {s["resource"]["service.instance.id"] for s in runs} <= {p["instance"] for p in limits}
    for instance in {p["instance"] for p in limits}:  # each worker's last reading: nothing held
        last = max(
            (p for p in points if p["name"] == "gym.concurrency.active" and p["instance"] == instance),
            key=lambda p: p["time"],
        )
        assert last["value"] == 0


def test_with_nothing_configured_spans_go_to_one_file_per_process(tmp_path, policy_model):
    """The embedded default: no endpoint, no exporter, no collector."""
    from gym_autoinstr.setup.files import read_path

    version = "0.4.0"
    trio = GymTrio.for_version(version, tmp_path / "gym", policy_url=policy_model.url, instrument=True)
    with trio:
        trio.rollouts(3, concurrency=1)
    log = trio.log_text()
    runs = list((tmp_path / "gym" / "gym-autoinstr-runs").iterdir())
    assert len(runs) == 1  # one run directory for the whole fleet, keyed by the run id
    run_dir = runs[0]
    assert f"exporters=files:{run_dir}" in log  # the location is printed once at start
    processes = sorted([f"nemo-gym_{name}" for name in trio.server_names] + ["nemo-gym_orchestrator"])
    span_files = span_segments(run_dir)
    # each process's own files: the servers, and the orchestrator's start-up spans; each
    # gzipped when its process exited (Gym stops its servers with SIGINT: a clean exit)
    assert sorted({p.name.rsplit("-", 1)[0] for p in span_files}) == processes
    assert all(p.name.endswith(".jsonl.gz") for p in span_files)
    # metrics land beside the spans; the agent's count every rollout
    metric_files = segment_files(run_dir, METRICS_SUFFIX)
    assert sorted({p.name.rsplit("-", 1)[0] for p in metric_files}) == processes
    # (its newest segment: the points are cumulative)
    assert _rollouts_in_metrics_file([p for p in metric_files if p.name.startswith(f"nemo-gym_{AGENT}-")][-1]) == 3
    spans = read_path(run_dir)
    traces = rollout_traces(spans, f"nemo-gym/{AGENT}")
    assert len(traces) == 3
    for trace in traces.values():
        assert_one_connected_trace(trace, trio)
    assert {s["resource"]["nemo.gym.run.id"] for s in spans} == {run_dir.name}


def _rollouts_in_metrics_file(path) -> int:
    """``gym.rollout.duration_ms``'s count in the last (cumulative) line of a metrics file."""
    import json

    count = 0
    for resource_metrics in json.loads(list(segment_lines(path))[-1])["resourceMetrics"]:
        for scope_metrics in resource_metrics["scopeMetrics"]:
            for metric in scope_metrics["metrics"]:
                if metric["name"] == "gym.rollout.duration_ms":
                    count += sum(int(p["count"]) for p in metric["histogram"]["dataPoints"])
    return count


def test_server_duration_by_route_and_the_fleet_gauge(flagship):
    run = flagship("0.4.0")
    points = run.points
    durations = [p for p in points if p["name"] == "http.server.request.duration"]
    # the model server's /v1/responses: two requests per rollout, counted by route, method and status
    model = [p for p in durations if p["service"] == f"nemo-gym/{MODEL}"]
    assert {
        (
            p["attributes"]["http.route"],
            p["attributes"]["http.request.method"],
            p["attributes"]["http.response.status_code"],
        )
        for p in model
    } == {("/v1/responses", "POST", 200)}
    assert max(p["value"] for p in model) == 2 * len(run.results)
    resources = {p["attributes"]["http.route"] for p in durations if p["service"] == f"nemo-gym/{RESOURCES}"}
    assert resources == {"/seed_session", "/get_weather", "/verify"}
    # the fleet gauge: written by the orchestrator only, N after spawn and 0 at shutdown
    gauge = [p for p in points if p["name"] == "gym.servers.active"]
    assert {p["service"] for p in gauge} == {"nemo-gym/orchestrator"}
    assert gauge[0]["value"] == 3 and gauge[-1]["value"] == 0
    # the one outcome metric: gym.rollout.reward (issue #53), a point per rollout; no accuracy
    assert {p["name"] for p in points if "reward" in p["name"] or "accuracy" in p["name"]} == {"gym.rollout.reward"}
    rewards = latest(points, "gym.rollout.reward")
    assert sum(p["value"] for p in rewards.values()) == len(run.results)
    assert sum(p["sum"] for p in rewards.values()) == sum(r["reward"] for r in run.results)
