"""The declared OpenTelemetry range is the tested range (issue #46).

``pyproject.toml`` accepts OpenTelemetry from a floor (1.39.0 / contrib 0.60b0) up to the
next major.  Here the whole in-process selection (``-m "not realgym and not slow"``) runs
as a pytest subprocess in two venvs built by ``tests/harness/otel_versions.py``: one with
every OpenTelemetry package at the floor, one at the newest release on the index.  Both
runs must pass, and a test may not be skipped at one end of the range only (a skip that
hides a version difference is a failure here).

Cost: the two runs go concurrently (each about as long as the selection alone; under
pytest-xdist a subprocess runs on as many workers as this session); the venvs are cached
(cold: under a minute each to build).  When this session runs on the newest
end's venv (the runner venv, when it holds the newest set: the usual case in CI) and has
run the whole selection (this module's tests run last: ``tests/conftest.py``; under
pytest-xdist they wait for the other workers' tests of the selection), the newest end's
outcomes are this session's own (``tests/harness/selection.py``) and only the floor
runs as a subprocess; the whole selection is what a collection of it in that venv lists
(a few seconds, beside the floor run).  A session that runs part of the selection (this
module alone, say) runs the newest end as a subprocess too.
"""

from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import gym_targets, otel_versions, ports, selection

pytestmark = pytest.mark.slow

REPO = otel_versions.gym_install.REPO_ROOT
ENDS = ("floor", "newest")
TIMEOUT = 40 * 60


def _pytest(venv: pathlib.Path, workdir: pathlib.Path, name: str, *args: str):
    """pytest on the selection in ``venv`` (this checkout's code): its process and what it wrote."""
    written = workdir / f"{name}.json"
    command = [
        str(venv / "bin" / "python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "-m",
        selection.SELECTION,
        "--basetemp",
        str(workdir / f"{name}-tmp"),
        selection.OPTION,
        str(written),
        *args,
    ]
    env = gym_targets.clean_environment(PYTHONPATH=str(REPO))
    index, count = ports.share()  # this worker's ports, shared among the subprocess's workers
    env[ports.SHARE_VARIABLE] = f"{index}/{count}"
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "--collect-only" not in args:  # as this session runs: on every core
        command += ["-n", workers]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    return result, selection.read(written)


def _run(end: str, by: str, data: dict, result: subprocess.CompletedProcess | None = None) -> dict:
    return {
        "end": end,
        "by": by,
        "returncode": None if result is None else result.returncode,
        "output": "" if result is None else f"{result.stdout[-4000:]}\n{result.stderr[-2000:]}",
        "collected": data.get("collected", []),
        "outcomes": data.get("outcomes", {}),
        "installed": otel_versions.installed(otel_versions.otel_venv(end)),
    }


def _subprocess_run(end: str, workdir: pathlib.Path, why: str = "") -> dict:
    result, data = _pytest(otel_versions.otel_venv(end), workdir, end)
    return _run(end, "a pytest subprocess" + (f" (not this session: {why})" if why else ""), data, result)


def _this_session(recorder: selection.Recorder, workdir: pathlib.Path) -> tuple[dict | None, str]:
    """The newest end's run as this session's own outcomes, when they stand for one: this
    session runs on the newest end's venv, as a subprocess would, and has run the whole
    selection (what a collection of it in that venv lists) to the end.  Else None, and why."""
    venv = otel_versions.otel_venv("newest")
    if pathlib.Path(sys.prefix).resolve() != venv.resolve():
        return None, f"this session runs on {sys.prefix}, the newest set's venv is {venv}"
    if recorder.unlike_subprocess:
        return None, recorder.unlike_subprocess
    if not recorder.code_is_this_checkout():
        return None, "this session imports another checkout's gym_autoinstr"
    result, whole = _pytest(venv, workdir, "newest-collection", "--collect-only")
    if result.returncode != 0 or not whole.get("collected"):
        return None, f"collecting the selection failed: {result.stdout[-1000:]}{result.stderr[-1000:]}"
    if set(whole["collected"]) != set(recorder.collected):
        ran, left = len(set(recorder.collected) & set(whole["collected"])), len(whole["collected"])
        return None, f"this session runs {ran} of the selection's {left} tests"
    # (under pytest-xdist: until the other workers' tests of the selection have run too)
    if not recorder.live_outcomes(timeout=TIMEOUT):
        return None, "some test of the selection in this session has not run to its end"
    data = {"collected": recorder.collected, "outcomes": dict(recorder.outcomes)}
    return _run("newest", "this session (the runner venv is the newest set's)", data), ""


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sdk-matrix")
    for end in ENDS:  # build serially (pip, the shared cache), then run concurrently
        otel_versions.otel_venv(end)
    with ThreadPoolExecutor(max_workers=len(ENDS)) as pool:
        floor = pool.submit(_subprocess_run, "floor", workdir)
        newest, why = _this_session(selection.recorder(request.config), workdir)
        if newest is None:
            newest = _subprocess_run("newest", workdir, why)
        return {"floor": floor.result(), "newest": newest}


def _summary(run: dict) -> str:
    counts = collections.Counter(run["outcomes"].values())
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "(no outcomes)"


@pytest.mark.parametrize("end", ENDS)
def test_in_process_selection_passes(runs, end):
    run = runs[end]
    wanted = otel_versions.otel_set(end)
    wrong = {n: v for n, v in run["installed"].items() if not wanted.matches(n, v)}
    assert not wrong, f"{end}: not of {wanted}: {wrong}"
    bad = sorted(f"{kind}: {name}" for name, kind in run["outcomes"].items() if kind in ("failure", "error"))
    assert run["returncode"] in (0, None) and not bad, (
        f"OpenTelemetry {wanted} ({end}, run by {run['by']}): {_summary(run)}, exit {run['returncode']}\n"
        + "\n".join(bad)
        + f"\n--- output tail ---\n{run['output']}"
    )
    never_ran = sorted(set(run["collected"]) - set(run["outcomes"]))
    assert not never_ran, f"{end}: collected, never ran: {never_ran[:20]}"
    passed = [n for n, o in run["outcomes"].items() if o == "passed"]
    assert len(passed) > 100, f"{end} (run by {run['by']}): only {len(passed)} tests passed: {_summary(run)}"


def test_no_test_is_skipped_at_one_end_only(runs):
    floor, newest = (runs[end]["outcomes"] for end in ENDS)
    assert floor and newest, "a run wrote no outcomes"
    assert set(floor) == set(newest), sorted(set(floor) ^ set(newest))[:20]
    one_sided = sorted(n for n in floor if (floor[n] == "skipped") != (newest[n] == "skipped"))
    assert not one_sided, f"skipped at one end of the range only: {one_sided}"
