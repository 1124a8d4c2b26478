"""A real traced trio on the oldest OpenTelemetry the project declares (issue #46).

The in-process suite runs on the floor in ``tests/test_sdk_matrix.py``; this runs what
only real processes show: ``gym env start`` under ``opentelemetry-instrument`` with
every OpenTelemetry package at the floor (``tests/harness/otel_versions.py``: contrib
0.60b0, which takes its sitecustomize off ``PYTHONPATH`` for good, so the spawned
servers are traced only because our start-up hook puts it back), three rollouts, one
connected trace each across the agent, model and resources processes.  The venv is the
matrix's floor venv (Gym 0.4.0), shared with ``test_sdk_matrix.py``.
"""

from __future__ import annotations

import pytest

from tests.harness import otel_versions
from tests.harness.traces import (
    assert_one_connected_trace,
    expected_services,
    otel_env,
    reset_upstream,
    rollout_traces,
    service_of,
)
from tests.harness.trio import AGENT, GymTrio

pytestmark = pytest.mark.realgym


def test_a_rollout_is_one_trace_on_the_floor_versions(tmp_path, policy_model, collector):
    venv = otel_versions.otel_venv("floor")
    floor = otel_versions.FLOOR
    versions = otel_versions.installed(venv)
    assert all(floor.matches(n, v) for n, v in versions.items()), versions
    reset_upstream(policy_model)
    trio = GymTrio(
        venv,
        otel_versions.GYM_RELEASE,
        tmp_path / "gym",
        policy_url=policy_model.url,
        instrument=True,
        env=otel_env(collector, "http/protobuf"),
    )
    run_service = f"nemo-gym/{AGENT}"
    with trio:
        for _ in range(3):
            trio.rollout()
        assert collector.sink.wait_for(lambda spans: len(rollout_traces(spans, run_service)) >= 3, timeout=30), (
            f"spans received: {sorted({(service_of(s), s['name']) for s in collector.sink.spans()})}\n"
            + trio.log_tail(40)
        )
    assert "Error in sitecustomize" not in trio.log_text()
    assert "Failed to auto initialize" not in trio.log_text()

    spans = collector.sink.spans()
    traces = rollout_traces(spans, run_service)
    assert len(traces) == 3  # three rollouts, three traces
    for trace in traces.values():
        # every server process in it, each callee's SERVER span under its caller's CLIENT
        assert_one_connected_trace(trace, trio)
        roots = [s for s in trace if s["parent_span_id"] is None]
        assert [(r["kind"], r["name"], service_of(r)) for r in roots] == [("SERVER", "POST /run", run_service)]
        by_id = {s["span_id"]: s for s in trace}
        assert all(s["parent_span_id"] in by_id for s in trace if s["parent_span_id"] is not None)
    # every span from a Gym process: the servers were traced, not only the orchestrator
    assert {service_of(s) for s in spans} <= expected_services(trio) | {"nemo-gym/orchestrator"}
    assert expected_services(trio) <= {service_of(s) for s in spans}
