"""The README's first command's job (examples/demo.py, what ./run-demo runs), end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realgym

REPO = Path(__file__).resolve().parents[2]


def _a_users_environment(**settings: str) -> dict[str, str]:
    """This session's environment as a user's shell would have it: no COLUMNS (pytest sets 80
    for its own terminal, which would make the waterfall fit 80 columns; captured output cuts
    nothing), none of the GYM_AUTOINSTR_*/OTEL_* names in-process tests left behind (a run
    id, an output directory), and the user's own ``settings``."""
    kept = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith(("GYM_AUTOINSTR_", "OTEL_"))}
    return {**kept, **settings}


def test_the_demo_shows_a_multi_process_rollout_as_a_waterfall(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), "--rollouts", "3", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        env=_a_users_environment(GYM_AUTOINSTR_SPAN_GROUPS="all"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # a setting of the user's, which the demo's Gym runs with (every span group: the model-call seam appears)
    assert "your settings, passed to Gym: GYM_AUTOINSTR_SPAN_GROUPS\n" in out
    assert "rollouts [##############################] 3/3" in out  # the progress bar completed
    assert "rewards: [1.0, 1.0, 1.0]" in out
    # three sent one by one and four by the collection job (2 tasks x 2 repeats); three
    # servers, the orchestrator and the collection process, each its own file
    assert "7 rollouts (3 sent one by one, 4 by the collection job) -> 7 traces, 5 trace files" in out
    runs = list((tmp_path / "demo" / "gym-autoinstr-runs").iterdir())
    assert len(runs) == 1 and str(runs[0]) in out  # the collection joined the fleet's run directory
    # the list: the job with its rollouts joined, then the three rollouts sent one by one
    listing = out[out.index(" view ") : out.rindex("$ ")]
    assert "4 linked rollout traces below" in listing and "gym.job" in listing
    assert listing.count("POST → example_single_tool_call_simple_agent /run") == 4
    waterfall = out[out.rindex("$ ") :]
    assert " --trace " in waterfall.splitlines()[0]  # 0.4.0 has no rollout ids (0.5+: --rollout)
    for service in ("example_single_tool_call_simple_agent", "example_single_tool_call ", "policy_model"):
        assert f"nemo-gym/{service}" in waterfall
    for name in ("POST /run", "gym.rollout", "gym.model.responses", "POST → ", "POST /v1/responses", "POST /verify"):
        assert name in waterfall
    assert "total " in waterfall and "| model " in waterfall
    assert "source " in out and "/bin/activate" in out  # how to put gym-autoinstr on PATH
    page = tmp_path / "demo" / "traces.html"
    text = page.read_text()
    # every rollout's trace, the job's own and the start-up trace
    assert text.count('<section class="trace') == 7 + 1 + 1
    assert text.count('<section class="why-slow"') == 1  # the per-server summary from the run's metrics
