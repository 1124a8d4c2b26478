"""gym-autoinstr beside the generic OpenTelemetry stack, in the same Gym venv.

opentelemetry-distro plus the contrib FastAPI and aiohttp-client instrumentors are
installed next to us.  Whichever distro ``opentelemetry-instrument`` picks, a rollout
is still one trace with one CLIENT span per logical request (aiohttp-client neither
adds its own nor re-parents the callee), exactly one SERVER span per request, and every
process reports its Gym identity.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.harness.collector import Collector
from tests.harness.traces import expected_services, otel_env, rollout_traces, service_of
from tests.harness.trio import AGENT, GymTrio

pytestmark = pytest.mark.realgym

GENERIC_STACK = [
    "opentelemetry-distro",
    "opentelemetry-instrumentation-fastapi",
    "opentelemetry-instrumentation-aiohttp-client",
]


@pytest.mark.parametrize(
    "selection",
    [
        # the generic stack's distro and configurator win the first-found race
        {"OTEL_PYTHON_DISTRO": "distro", "OTEL_PYTHON_CONFIGURATOR": "configurator"},
        # ours wins
        {"OTEL_PYTHON_DISTRO": "gym_autoinstr"},
    ],
    ids=["generic-distro-selected", "our-distro-selected"],
)
def test_one_trace_and_no_duplicate_hops_beside_the_generic_stack(selection, tmp_path, policy_model):
    version = "0.4.0"
    with Collector(log_dir=tmp_path / "collector") as collector:
        env = otel_env(collector, "http/protobuf", **selection)
        trio = GymTrio.for_version(
            version, tmp_path / "gym", policy_model.url, venv_extra=GENERIC_STACK, instrument=True, env=env
        )
        with trio:
            results = [trio.rollout() for _ in range(2)]
            run_service = f"nemo-gym/{AGENT}"
            assert collector.sink.wait_for(lambda spans: len(rollout_traces(spans, run_service)) >= 2, timeout=30), (
                sorted({(service_of(s), s["name"], s["scope"]) for s in collector.sink.spans()})
            )
        assert all(r["reward"] == 1.0 for r in results)
        log = trio.log_text()
        spans = collector.sink.spans()

    expected_distro = selection["OTEL_PYTHON_DISTRO"]
    assert f"tracing Gym: distro={expected_distro}" in log  # the orchestrator says which distro is active
    assert "Error in sitecustomize" not in log and "Failed to auto initialize" not in log

    traces = rollout_traces(spans, run_service)
    assert len(traces) == 2
    for trace in traces.values():
        by_id = {s["span_id"]: s for s in trace}
        assert {service_of(s) for s in trace} == expected_services(trio)
        # the aiohttp-client instrumentor never adds a CLIENT span inside Gym's requests
        clients = [s for s in trace if s["kind"] == "CLIENT"]
        assert {s["scope"] for s in clients} == {"gym_autoinstr"}
        servers = [s for s in trace if s["kind"] == "SERVER"]
        # calls to Gym servers (the upstream policy model is not instrumented)
        hops = [s for s in clients if not s["attributes"]["url.full"].startswith(policy_model.base)]
        assert len(hops) == 6  # seed_session, agent /v1/responses, 2 model calls, tool, verify
        # exactly one SERVER span per inbound request, each the child of its hop's CLIENT span
        assert len(servers) == len(hops) + 1
        assert Counter(s["parent_span_id"] for s in servers if s["parent_span_id"]) == Counter(
            s["span_id"] for s in hops
        )
        for span in servers:
            if span["parent_span_id"]:
                assert by_id[span["parent_span_id"]]["kind"] == "CLIENT"
