"""Two collection jobs of one real fleet, as two checkpoints' evaluation runs: the same
tasks, each task's reward known (the graded resources server returns the row's own), the
second job's verify slower.  What ``compare`` and ``export`` are checked against: Gym's
own output rows of each job.

``run_two_jobs(fleet)`` runs them on a ``JobFleet`` (tests/harness/jobs.py) and returns a
``TwoJobs``; the session fixture ``campaign_jobs`` (tests/conftest.py) does it once.  Both
jobs write to the fleet's one run directory (``fleet.files``), beside every other job the
session's tests ran there: a job is told apart by its id (``nemo.gym.job.id``)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.harness.jobs import JobFleet, output_rows
from tests.harness.traces import job_spans

TASKS, REPEATS = 30, 3
SLOWER_MS = 40.0  # the second job's verify, longer by this much


def reward_before(task: int) -> float:
    return (task % 5) / 4  # 0, 0.25, 0.5, 0.75, 1, 0, ...


def reward_after(task: int) -> float:
    """Better on every third task, worse on the next, the same on the rest."""
    before = reward_before(task)
    if task % 3 == 0:
        return min(1.0, before + 0.25)
    if task % 3 == 1:
        return max(0.0, before - 0.25)
    return before


@dataclass
class Job:
    job_id: str
    rows: list[dict]  # Gym's output file, a row per rollout
    start_ns: int


@dataclass
class TwoJobs:
    fleet: JobFleet
    before: Job
    after: Job

    @property
    def files(self):
        return self.fleet.files


def _job(fleet: JobFleet, reward, delay_ms: float) -> Job:
    row = fleet.trio.default_row()
    rows = [
        # (a row's own "row" makes it a task of its own: Gym's driver groups identical rows)
        {**row, "verifier_metadata": {"reward": reward(task), "row": task, "delay_ms": delay_ms}}
        for task in range(TASKS)
    ]
    start_ns, output = fleet.collect(rows=rows, repeats=REPEATS, parallel=8)
    written = output_rows(output)
    assert len(written) == TASKS * REPEATS
    (job,) = job_spans(fleet.wait_for_rollouts(start_ns, len(written)))
    return Job(str(job["attributes"]["nemo.gym.job.id"]), written, start_ns)


def run_two_jobs(fleet: JobFleet) -> TwoJobs:
    return TwoJobs(fleet, _job(fleet, reward_before, 0.0), _job(fleet, reward_after, SLOWER_MS))
