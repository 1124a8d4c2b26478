"""The benchmark's reports of saved runs (``./run-benchmarks --across``): arithmetic on
results shaped as ``--json`` writes them; and its ``--help``, which builds nothing.  No trio
is started here."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks.run import across_report

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = {
    "run": "",
    "attribution": "--attribution",
    "instructions": "--instructions",
    "trio_instructions": "--trio-instructions",
}


@pytest.mark.parametrize("mode", MODES)
def test_every_modes_options_are_declared_with_the_standard_library_alone(mode):
    # -S: no site-packages (no psutil, no Gym, no OpenTelemetry), as a python3 outside any venv
    result = subprocess.run(
        [sys.executable, "-S", "-m", "benchmarks.options", mode, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: run-benchmarks {MODES[mode]}".rstrip() + " [-h]")


def test_run_benchmarks_help_builds_nothing(tmp_path):
    cache = tmp_path / "cache"  # where tools/runner-venv would build the runner venv
    for arguments in (["--help"], ["--quick", "-h"], ["--attribution", "--help"]):
        result = subprocess.run(
            [str(REPO / "run-benchmarks"), *arguments],
            env={**os.environ, "GYM_AUTOINSTR_TEST_CACHE": str(cache)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0 and result.stdout.startswith("usage: run-benchmarks"), result.stderr
    assert not cache.exists()


def _run(bare: list, off: list, default: list, sampled: list, together: list | None = None) -> dict:
    def row(key, cpu):
        return {"key": key, "cpu_ms": cpu, "bare_cpu_ms": bare}

    results = {
        "variants": [{"key": "bare", "cpu_ms": bare}, row("off", off), row("default", default), row("sampled", sampled)]
    }
    if together is not None:  # windows: (bare, default, sampled) CPU per rollout
        results["sampled_together"] = {
            key: [{"n": 100, "cpu_ms": w[i], "set": 0} for w in together]
            for i, key in enumerate(("bare", "default", "sampled"))
        }
    return results


def _close(got: float, want: float) -> bool:
    return abs(got - want) < 5e-4  # (the report prints three decimals)


def test_across_runs_splits_a_dropped_rollouts_overhead_into_span_groups_off_and_the_dropped_path():
    # run a: off +0.2, default +1.0, sampled +0.5 ms in every repetition; run b: +0.0, +2.0, +0.4
    a = _run(
        [10.0, 11.0, 12.0],
        [10.2, 11.2, 12.2],
        [11.0, 12.0, 13.0],
        [10.5, 11.5, 12.5],
        together=[(10.0, 11.0, 10.2), (10.0, 11.0, 10.2), (10.0, 11.0, 10.2)],
    )
    b = _run(
        [10.0, 10.0, 10.0],
        [10.0, 10.0, 10.0],
        [12.0, 12.0, 12.0],
        [10.4, 10.4, 10.4],
        together=[(10.0, 12.0, 10.6), (10.0, 12.0, 10.6), (10.0, 12.0, 10.6)],
    )
    text = across_report([("a", a), ("b", b), ("other", {"variants": {"not": "a run"}})])
    lines = text.splitlines()
    row_a = next(line for line in lines if line.startswith("| a |"))
    assert [c.strip() for c in row_a.split("|")[2:9]] == ["3", "+0.20", "+1.00", "+0.50", "0.200", "0.300", "0.500"]
    row_b = next(line for line in lines if line.startswith("| b |"))
    assert [c.strip() for c in row_b.split("|")[6:9]] == ["0.000", "0.200", "0.200"]
    assert any(line.startswith("| other |") and "left out" in line for line in lines)
    pooled = {line.split(":")[0]: float(line.split(": ")[1].split()[0]) for line in lines if line.startswith("- ")}
    # ratio of sums over all six repetitions: off 0.6/9.0, dropped (1.5-0.6 + 1.2)/9.0, sampled 2.7/9.0
    assert _close(pooled["- span groups off over traced"], 0.6 / 9.0)
    assert _close(pooled["- the dropped path (sampled out - off) over traced"], 2.1 / 9.0)
    assert _close(pooled["- a sampled-out rollout over a traced one (target <= 0.20)"], 2.7 / 9.0)
    together = next(v for k, v in pooled.items() if k.startswith("- the same, loaded together (6 windows of 2 run(s))"))
    assert _close(together, (3 * 0.2 + 3 * 0.6) / (3 * 1.0 + 3 * 2.0))
    # capacity, pooled: bare's CPU over the variant's, summed over both runs' repetitions
    capacity = {k.split(" (")[0]: v for k, v in pooled.items() if k.startswith(("- off (", "- default ("))}
    assert _close(capacity["- default"], 63.0 / 72.0) and _close(capacity["- off"], 63.0 / 63.6)
