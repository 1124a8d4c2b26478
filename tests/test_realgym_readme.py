"""The README's "Tracing your own Gym, step by step", run as written, in the demo's venv.

Step 2 starts the servers under ``opentelemetry-instrument gym env start``; step 3 runs
``opentelemetry-instrument ng_collect_rollouts`` from the same directory, as another
process (another terminal, for a user), with nothing configured; step 4 views the run
directory.  The collection's ``gym.job`` and the rollouts it sent end up in the one run
directory, joined, and the collection process says where it writes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gym_autoinstr.setup.files import read_path
from tests.harness.traces import by_trace, job_spans, linked_rollout_roots, service_of
from tests.harness.trio import AGENT, GymTrio

pytestmark = pytest.mark.realgym

ROWS, REPEATS = 2, 2
REPO = Path(__file__).resolve().parents[1]


def _readme_steps() -> list[str]:
    """The commands of the README's "Your own Gym, traced" block, comments and arguments aside."""
    block = (REPO / "README.md").read_text().split("## Your own Gym, traced", 1)[1].split("```", 2)[1]
    return [" ".join(line.split("#")[0].split()[:2]) for line in block.strip().splitlines()]


def test_the_readme_steps_join_a_collection_job_to_its_rollouts_in_one_run_directory(tmp_path, policy_model):
    # what this test runs is what the README says, in its order
    assert _readme_steps() == [
        "gym-autoinstr doctor",
        "opentelemetry-instrument gym",
        "opentelemetry-instrument ng_collect_rollouts",
        "gym-autoinstr view",
    ]
    trio = GymTrio.for_version("0.4.0", tmp_path / "gym", policy_url=policy_model.url, instrument=True)
    venv = trio.venv  # what ./run-demo runs
    rows = tmp_path / "rows.jsonl"
    output = tmp_path / "rollouts.jsonl"
    with trio:
        rows.write_text("".join(json.dumps(trio.default_row()) + "\n" for _ in range(ROWS)))
        collect = subprocess.run(
            [
                str(venv / "bin" / "opentelemetry-instrument"),
                str(venv / "bin" / "ng_collect_rollouts"),
                f"+config_paths=[{trio.config_path}]",
                f"+agent_name={AGENT}",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={output}",
                f"+num_repeats={REPEATS}",
                "+upload_rollouts_to_wandb=false",
            ],
            cwd=trio.workdir,  # the directory `gym env start` runs from
            env=trio.environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    assert len(output.read_text().splitlines()) == ROWS * REPEATS  # Gym collected them all

    (run_dir,) = (trio.workdir / "gym-autoinstr-runs").iterdir()  # one run directory, no pid-N beside it
    assert f"exporters=files:{run_dir}" in trio.log_text()  # the orchestrator said where, once
    said = [line for line in collect.stderr.splitlines() if "beside the servers of run" in line]
    assert len(said) == 1 and str(run_dir) in said[0] and run_dir.name in said[0], collect.stderr[-2000:]

    spans = read_path(run_dir)
    assert {s["resource"].get("nemo.gym.run.id") for s in spans} == {run_dir.name}
    (job,) = job_spans(spans)
    roots = linked_rollout_roots(spans, job)
    assert len(roots) == ROWS * REPEATS
    traces = by_trace(spans)
    for root in roots:
        services = {service_of(s) for s in traces[root["trace_id"]]}
        assert service_of(root) in services and f"nemo-gym/{AGENT}" in services and len(services) >= 4

    # honest timings: a SERVER span ends when its response is sent, so never after the
    # CLIENT span of the caller that waited for it (one host, one clock)
    by_id = {s["span_id"]: s for s in spans}
    served = [
        (s, by_id[s["parent_span_id"]])
        for s in spans
        if s["kind"] == "SERVER" and by_id.get(s["parent_span_id"], {}).get("kind") == "CLIENT"
    ]
    assert len(served) >= 6 * ROWS * REPEATS  # /run, seed, the agent's own call, 2 model calls, tool, verify
    late = [(s["name"], s["end_ns"] - c["end_ns"]) for s, c in served if s["end_ns"] > c["end_ns"]]
    assert not late, late

    # step 4, as the README writes it (no path): the newest run, the job with its rollouts, joined
    assert _readme_steps()[-1] == "gym-autoinstr view"
    view = subprocess.run(
        [str(venv / "bin" / "gym-autoinstr"), "view"],
        cwd=trio.workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},  # pytest's 80 columns would cut the job line
    )
    assert view.returncode == 0, view.stderr
    assert f"the newest run, gym-autoinstr-runs/{run_dir.name}" in view.stderr
    assert f"{ROWS * REPEATS} linked rollout traces" in view.stdout, view.stdout[:3000]
