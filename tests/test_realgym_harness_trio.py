"""The real-Gym harness itself: a bare (uninstrumented) trio per Gym version.

Builds (once, cached) a venv per version, starts agent + model + resources via the
real ``gym env start``, runs rollouts against ``examples/policy_model.py``, stops
with SIGINT and checks nothing is left running.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, RESOURCES, GymTrio

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
def test_bare_trio_rollout(version, tmp_path, policy_model):
    venv = gym_venv(version, with_project=False)
    trio = GymTrio(venv, version, tmp_path / "gym", policy_url=policy_model.url)
    with trio:
        expected = {RESOURCES, AGENT, MODEL} | ({ENVIRONMENT} if trio.has_relay else set())
        servers = trio.server_processes()
        assert set(servers) == expected
        for name, proc in servers.items():
            assert proc.is_running()
            assert any(c.endswith("app.py") for c in proc.cmdline()), (name, proc.cmdline())
        seen = trio.processes()

        _check_result(trio.rollout())
        results = trio.rollouts(8, concurrency=4)
        assert len(results) == 8
        for r in results:
            _check_result(r)

    assert trio.returncode == 0, trio.log_tail()
    assert "NeMo Gym finished!" in trio.log_text()
    assert "DEPRECATED" not in trio.log_text()  # 0.7.0: our relay is the declared one
    time.sleep(0.5)
    alive = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert trio.ray_tmpdir is None
