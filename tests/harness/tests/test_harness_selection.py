"""The selection recorder (tests/harness/selection.py) counts what pytest did, test by test.

tests/test_sdk_matrix.py compares these outcomes across the OpenTelemetry range, the newest
end's possibly from the main session's recorder: a failure, an error or a skip must come out
as such, and a test out of the selection (``slow``, ``realgym``) not at all.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

from tests.harness import gym_targets, selection

REPO = pathlib.Path(__file__).resolve().parents[3]

CONFTEST = """
import pathlib
from tests.harness import selection

def pytest_addoption(parser):
    selection.addoption(parser)

def pytest_configure(config):
    selection.register(config, pathlib.Path({repo!r}))
"""

TESTS = """
import pytest

def test_passes():
    pass

def test_fails():
    assert False

def test_skips():
    pytest.skip("not here")

@pytest.mark.xfail(strict=True)
def test_xfails():
    assert False

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_setup_error(broken):
    pass

@pytest.fixture
def breaks_after():
    yield
    raise RuntimeError("teardown")

def test_teardown_error(breaks_after):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_params(n):
    assert n == 1

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.realgym
def test_real():
    pass
"""


def _session(tmp_path, *args):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: x\n    realgym: x\n")
    (tmp_path / "conftest.py").write_text(CONFTEST.format(repo=str(REPO)))
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(TESTS))
    out = tmp_path / "out.json"
    env = gym_targets.clean_environment(PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", selection.OPTION, str(out), *args]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), result.stdout + result.stderr
    return json.loads(out.read_text())


def test_each_outcome_as_pytest_reports_it_and_only_the_selection(tmp_path):
    data = _session(tmp_path)
    assert data["outcomes"] == {
        "test_sample.py::test_passes": "passed",
        "test_sample.py::test_fails": "failure",
        "test_sample.py::test_skips": "skipped",
        "test_sample.py::test_xfails": "skipped",
        "test_sample.py::test_setup_error": "error",
        "test_sample.py::test_teardown_error": "error",
        "test_sample.py::test_params[1]": "passed",
        "test_sample.py::test_params[2]": "failure",
    }
    assert sorted(data["collected"]) == sorted(data["outcomes"])
    assert data["complete"] is True


def test_a_session_stopped_early_is_not_complete(tmp_path):
    data = _session(tmp_path, "-x")
    assert len(data["collected"]) == 8
    assert data["outcomes"] == {"test_sample.py::test_passes": "passed", "test_sample.py::test_fails": "failure"}
    assert data["complete"] is False


def test_a_collection_lists_the_selection_and_runs_nothing(tmp_path):
    data = _session(tmp_path, "--collect-only", "-m", selection.SELECTION)
    assert len(data["collected"]) == 8 and "test_sample.py::test_slow" not in data["collected"]
    assert data["outcomes"] == {} and data["complete"] is False


def test_under_xdist_the_controller_records_every_worker_s_tests(tmp_path):
    """Two pytest-xdist workers, a file each: the same outcomes as one process records (a
    ``slow`` test of another file left out), and the selection as every worker collected it."""
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_slow_elsewhere():\n    pass\n\n"
        "def test_passes_elsewhere():\n    pass\n"
    )
    data = _session(tmp_path, "-n", "2", "--dist", "loadfile")
    alone = _session(tmp_path)
    assert data["outcomes"] == alone["outcomes"]
    assert alone["outcomes"]["test_other.py::test_passes_elsewhere"] == "passed"
    assert "test_other.py::test_slow_elsewhere" not in alone["outcomes"]
    assert sorted(data["collected"]) == sorted(alone["collected"]) == sorted(alone["outcomes"])
    assert data["complete"] is True
