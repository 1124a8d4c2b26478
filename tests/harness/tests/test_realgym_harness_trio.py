"""The real-Gym harness itself: a bare (uninstrumented) trio per Gym version.

The session's bare run of each version (tests/harness/bare.py: a venv built once,
agent + model + resources via the real ``gym env start`` with its own Ray, rollouts
against ``examples/policy_model.py``, a SIGINT): every server ran its ``app.py``, every
rollout is right, Gym finished cleanly and nothing is left running.
"""

from __future__ import annotations

import psutil
import pytest

from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, RESOURCES

pytestmark = pytest.mark.realgym

VERSIONS = ["0.4.0", "0.7.0"]


def _check_result(result: dict) -> None:
    assert result["reward"] == 1.0
    output = result["response"]["output"]
    calls = [o for o in output if o.get("type") == "function_call"]
    assert [c["name"] for c in calls] == ["get_weather"]
    outs = [o for o in output if o.get("type") == "function_call_output"]
    assert len(outs) == 1 and outs[0]["call_id"] == calls[0]["call_id"]
    assert "San Francisco" in outs[0]["output"]  # the resources server's tool answer
    assert output[-1]["type"] == "message" and output[-1]["role"] == "assistant"


@pytest.mark.parametrize("version", VERSIONS)
def test_bare_trio_rollout(version, bare_gym):
    run = bare_gym(version)  # started, served nine rollouts, stopped with SIGINT (tests/harness/bare.py)
    expected = {RESOURCES, AGENT, MODEL} | ({ENVIRONMENT} if version >= "0.7" else set())
    assert set(run.servers) == expected
    for name, cmdline in run.servers.items():
        assert any(c.endswith("app.py") for c in cmdline), (name, cmdline)
    assert len(run.results) == 9
    for r in run.results:
        _check_result(r)

    log = run.shutdown.log
    assert run.shutdown.returncode == 0, log[-3000:]
    assert "NeMo Gym finished!" in log
    assert "DEPRECATED" not in log  # 0.7.0: our relay is the declared one
    alive = [p for p in run.processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert run.ray_tmpdir_left is None
