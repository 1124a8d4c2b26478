"""The W3C trace-context test suite, unmodified, passes against a real Gym server, with the
fast path on and off (``tests/harness/w3c_suite.py``; ``tools/w3c-suite`` runs the same).

The suite is w3c/trace-context's ``test/`` folder.  It is not ours to commit, and it is not
published on PyPI or npm; CI reaches neither GitHub nor anything but those registries.  So
this test runs only where ``GYM_AUTOINSTR_W3C_SUITE`` names a copy of that folder, and
skips, saying so, everywhere else.  What the suite found is also in
``test_w3c_conformance.py`` (``SUITE_CASES``), which runs everywhere.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.w3c_suite import GYM_VERSION, SUITE_ENV, run_suite, suite_dir_problem

pytestmark = pytest.mark.realgym

# The suite's tests at STRICT_LEVEL=2 and SPEC_LEVEL=2 (37 of Level 1, 3 "advanced", 1 of
# Level 2); fewer would mean a part of it was not run.
AT_LEAST = 41


@pytest.fixture(scope="module")
def suite_dir() -> pathlib.Path:
    named = os.environ.get(SUITE_ENV)
    if not named:
        pytest.skip(
            f"the W3C trace-context test suite is not here: set {SUITE_ENV} to a copy of the test/ folder "
            "of github.com/w3c/trace-context (not on PyPI or npm, so CI cannot get it; "
            "test_w3c_conformance.py's SUITE_CASES hold what it found)"
        )
    path = pathlib.Path(named).resolve()
    problem = suite_dir_problem(path)
    if problem:
        pytest.fail(f"{SUITE_ENV}: {problem}")
    return path


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast path on", "fast path off"])
def test_the_w3c_suite_passes_against_a_real_gym_server(suite_dir, fast_path, tmp_path):
    run = run_suite(suite_dir, gym_venv(GYM_VERSION), tmp_path, fast_path=fast_path)
    assert not run.failed, f"{run.summary()}\n\n{run.output[-6000:]}"
    assert run.counted >= AT_LEAST, run.summary()
