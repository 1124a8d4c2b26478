"""Every Gym pointcut resolves exactly where the table says, on every release (issue 3).

The table in ``gym_autoinstr/pointcuts.py`` declares, per pointcut, the releases its
target exists in.  Here each release from 0.2.0 to 0.7.0 is imported for real and
instrumented by the real ``GymInstrumentor`` (post-import hooks), through ``gym-autoinstr
doctor --json``: the same code path a user runs.  The test is driven by the table, so a
pointcut added to it is checked on every release without touching this file.

Cost: two host venvs (Python 3.12 and 3.13) hold Gym's third-party deps once; each
release is a ``pip install --no-deps --target`` directory put first on ``PYTHONPATH``
(see ``tests/harness/gym_targets.py``).  Warm, the whole matrix takes seconds; cold,
about two minutes.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from gym_autoinstr.commands.doctor import is_gym_module
from gym_autoinstr.pointcuts import POINTCUTS, version_applies

pytestmark = pytest.mark.realgym

RELEASES = ("0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.5.1", "0.6.0", "0.7.0")
GYM_POINTCUTS = [p for p in POINTCUTS if is_gym_module(p.module)]

# Modules a release from PyPI cannot import at all, whatever is installed beside it: their
# targets cannot be checked there (and no wheel user reaches them).
UNIMPORTABLE = {
    ("0.2.0", "nemo_gym.cli"): "No module named 'scripts'",  # hf_utils imports the repo's scripts/, not in the wheel
}


# -- every release, for real -------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from tests.harness import gym_targets

    def doctor(release):
        scratch = tmp_path_factory.mktemp(f"gym-{release}")
        result = gym_targets.run_doctor(release, cwd=str(scratch))
        try:
            report = json.loads(result.stdout)
        except ValueError:
            report = None
        return release, (result, report, scratch)

    for release in RELEASES:  # install serially (pip, shared locks), then import in parallel
        gym_targets.gym_target(release)
        gym_targets.support_directory(release)
    with ThreadPoolExecutor(max_workers=min(len(RELEASES), os.cpu_count() or 2)) as pool:
        return dict(pool.map(doctor, RELEASES))


@pytest.mark.parametrize("release", RELEASES)
def test_each_gym_pointcut_is_applied_or_absent_as_declared(reports, release):
    result, report, scratch = reports[release]
    assert report is not None, f"doctor printed no JSON (exit {result.returncode}):\n{result.stderr[-3000:]}"
    assert report["gym"]["version"] == release  # the target really shadows the host's Gym
    by_name = {row["name"]: row for row in report["pointcuts"]}
    for pointcut in GYM_POINTCUTS:
        row = by_name.get(pointcut.name)
        assert row is not None, f"{pointcut.name} not reported by name"
        broken = UNIMPORTABLE.get((release, pointcut.module))
        if broken:
            assert row["resolved"] is False and broken in row["reason"], row
            continue
        assert "failed" not in (row["reason"] or ""), (
            f"{pointcut.name}: {row['reason']} (a dependency missing in the host venv?)"
        )
        if pointcut.optional:
            expected = version_applies(pointcut.versions, release)
            assert row["resolved"] is expected, (
                f"{pointcut.name} ({pointcut.module}.{pointcut.attribute}, versions {pointcut.versions!r}) "
                f"{'resolved' if row['resolved'] else 'is absent: ' + str(row['reason'])} on nemo-gym {release}"
            )
        else:
            assert row["resolved"], f"{pointcut.name} must resolve on every release; on {release}: {row['reason']}"
    assert report["ok"], [p for p in report["problems"] if p["severity"] == "error"]
    assert not list(scratch.iterdir()), "importing Gym left files in the working directory"
