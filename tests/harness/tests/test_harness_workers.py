"""How ``./run-tests`` splits the suite between pytest-xdist workers (``tests/conftest.py``):
a file's tests on one worker (its module fixtures start once), the files sharing a session
fixture on one worker, and each worker its own ports (``tests/harness/ports.py``)."""

import os
import pathlib
import re
import subprocess
import sys

from tests import conftest
from tests.harness import gym_targets, ports

REPO = pathlib.Path(__file__).resolve().parents[3]
# (collection order; the file with the fewest tests first: xdist alone would hand it out last)
FILES = ["tests/harness/tests/test_harness_ports.py", "tests/test_docs.py", "tests/commands/test_slow.py"]


def test_a_file_runs_on_one_worker_and_files_go_out_in_collection_order():
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist", "loadfile"]
    command += FILES
    env = gym_targets.clean_environment(PYTHONPATH=str(REPO))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    ran = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] (?:PASSED|SKIPPED|FAILED|ERROR) (tests/[^:]+)::", done.stdout)
    assert ran, done.stdout[-3000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, path in ran:
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == set(FILES)
    assert all(len(on) == 1 for on in workers.values()), workers
    assert len({worker for on in workers.values() for worker in on}) == 2  # (and both workers had work)
    # files are handed out in collection order: the first file is the first its worker ran
    (first_worker,) = workers[FILES[0]]
    assert next(path for worker, path in ran if worker == first_worker) == FILES[0]


def test_the_files_sharing_the_slurm_cluster_and_the_sshd_share_a_group():
    sharing = ["test_harness_slurm.py", "test_harness_ssh.py", "test_realgym_slurm.py"]
    assert {conftest.worker_group(REPO / "tests" / "harness" / "tests" / name) for name in sharing} == {"slurm"}
    groups = {conftest.worker_group(REPO / path) for path in FILES}
    assert len(groups) == len(FILES) and "slurm" not in groups


def test_two_workers_never_draw_the_same_port(monkeypatch):
    drawn = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        monkeypatch.delenv(ports.SHARE_VARIABLE, raising=False)
        drawn[worker] = set(ports._candidates())
    assert drawn["gw0"] and drawn["gw1"] and not drawn["gw0"] & drawn["gw1"]
    # a pytest run inside a worker (the SDK matrix) splits that worker's share again
    monkeypatch.setenv(ports.SHARE_VARIABLE, "{}/{}".format(*ports.share()))  # gw1 of 2
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    inner = set(ports._candidates())
    assert inner and inner < drawn["gw1"]
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw0"
