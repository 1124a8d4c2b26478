"""The declared OpenTelemetry range is the tested range (issue #46).

``pyproject.toml`` accepts OpenTelemetry from a floor (1.39.0 / contrib 0.60b0) up to the
next major.  Here the whole in-process selection (``-m "not realgym and not slow"``) runs
as a pytest subprocess in two venvs built by ``tests/harness/otel_versions.py``: one with
every OpenTelemetry package at the floor, one at the newest release on the index.  Both
runs must pass, and a test may not be skipped at one end of the range only (a skip that
hides a version difference is a failure here).

Cost: the two runs go concurrently (each about as long as the selection alone); the venvs
are cached (cold: a few minutes each to build).
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import gym_targets, otel_versions

pytestmark = pytest.mark.slow

REPO = otel_versions.gym_install.REPO_ROOT
ENDS = ("floor", "newest")
TIMEOUT = 40 * 60


def _run_selection(end: str, workdir) -> dict:
    venv = otel_versions.otel_venv(end)
    python = str(venv / "bin" / "python")
    report = workdir / f"{end}.xml"
    command = [
        python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "-m",
        "not realgym and not slow",
        "--basetemp",
        str(workdir / f"{end}-tmp"),
        "--junitxml",
        str(report),
    ]
    env = gym_targets.clean_environment(PYTHONPATH=str(REPO))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    outcomes: dict[str, str] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
            outcomes[name] = kinds.pop() if kinds else "passed"
    return {"end": end, "result": result, "outcomes": outcomes, "installed": otel_versions.installed(venv)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sdk-matrix")
    for end in ENDS:  # build serially (pip, the shared cache), then run concurrently
        otel_versions.otel_venv(end)
    with ThreadPoolExecutor(max_workers=len(ENDS)) as pool:
        return {r["end"]: r for r in pool.map(lambda end: _run_selection(end, workdir), ENDS)}


def _summary(run: dict) -> str:
    lines = run["result"].stdout.strip().splitlines()
    return lines[-1] if lines else "(no output)"


@pytest.mark.parametrize("end", ENDS)
def test_in_process_selection_passes(runs, end):
    run = runs[end]
    wanted = otel_versions.otel_set(end)
    wrong = {n: v for n, v in run["installed"].items() if not wanted.matches(n, v)}
    assert not wrong, f"{end}: not of {wanted}: {wrong}"
    result = run["result"]
    bad = [line for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    assert result.returncode == 0, (
        f"OpenTelemetry {wanted} ({end}): {_summary(run)}\n"
        + "\n".join(bad)
        + f"\n--- output tail ---\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
    )
    passed = [n for n, o in run["outcomes"].items() if o == "passed"]
    assert len(passed) > 100, f"{end}: only {len(passed)} tests passed: {_summary(run)}"


def test_no_test_is_skipped_at_one_end_only(runs):
    floor, newest = (runs[end]["outcomes"] for end in ENDS)
    assert floor and newest, "a run wrote no report"
    assert set(floor) == set(newest), sorted(set(floor) ^ set(newest))[:20]
    one_sided = sorted(n for n in floor if (floor[n] == "skipped") != (newest[n] == "skipped"))
    assert not one_sided, f"skipped at one end of the range only: {one_sided}"
