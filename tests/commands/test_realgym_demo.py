"""The README's first command's job (examples/demo.py, what ./run-demo runs), end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realgym

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_shows_a_multi_process_rollout_as_a_waterfall(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), "--rollouts", "3", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        # output captured, no terminal: `view` cuts nothing (pytest sets COLUMNS=80 for its own
        # terminal, which would make the waterfall fit 80 columns)
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "rollouts [##############################] 3/3" in out  # the progress bar completed
    assert "rewards: [1.0, 1.0, 1.0]" in out
    # three servers, and the orchestrator's start-up spans (group startup, in the default preset)
    assert "3 rollouts -> 3 traces, 4 trace files (one per process)" in out
    waterfall = out[out.index("$ gym-autoinstr view") :]
    for service in ("example_single_tool_call_simple_agent", "example_single_tool_call ", "policy_model"):
        assert f"nemo-gym/{service}" in waterfall
    for name in ("POST /run", "gym.rollout", "POST → ", "POST /v1/responses", "POST /verify"):
        assert name in waterfall
    assert "total " in waterfall and "| model " in waterfall
    page = tmp_path / "demo" / "traces.html"
    text = page.read_text()
    assert text.count('<section class="trace') == 4  # all three rollouts' traces and the start-up trace
    assert text.count('<section class="why-slow"') == 1  # the per-server summary from the run's metrics
    runs = list((tmp_path / "demo" / "gym-autoinstr-runs").iterdir())
    assert len(runs) == 1 and str(runs[0]) in out
