"""``gym eval submit`` (Gym 0.7.0) for one benchmark, against our policy model (issue #48, part 1).

The submit config is ``tests/harness/gym_submit.py``'s: no model services, a local Slurm
compute, Gym's collector step off, ``gym`` found on the driver's ``PATH``.  Without a Slurm
cluster (the real cluster's run is ``tests/test_realgym_slurm.py``) these tests:

* check the rendered sbatch script (directives, the driver's ``srun`` line, ``GYM_CMD``);
* submit for real through a stand-in ``sbatch`` (it only answers a job id), and check what
  the submit stages and records: ``job.sh``, the manifest, the resolved config.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.gym_submit import DryRun, SubmitJob, write_submit
from tests.harness.trio import AGENT

pytestmark = pytest.mark.realgym

VERSION = "0.7.0"
# gym eval run (serving) prepares its data through train_data_utils, which imports mlflow (via
# gitlab_utils) and datasets (via hf_utils): base requirements of nemo-gym that the minimal test
# venv leaves out. mlflow-skinny has all of mlflow that Gym imports.
EXTRA = ["mlflow-skinny>=3.16.1", "datasets"]


@pytest.fixture
def make_job(tmp_path):
    """``write_submit`` into ``tmp_path``; each job's Ray temp dir removed afterwards."""
    jobs: list[SubmitJob] = []

    def make(policy_url: str, **options) -> SubmitJob:
        venv = gym_venv(VERSION, extra=EXTRA)
        job = write_submit(tmp_path / "submit", venv, policy_url, tmp_path / "jobs", **options)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.cleanup()


def dry_run(job: SubmitJob) -> DryRun:
    done = subprocess.run(job.argv(dry_run=True), env=job.environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return DryRun(done.stdout, job.benchmark)


def driver_step_env(driver_line: str) -> dict[str, str]:
    """The ``env K=V ... srun`` prefix of the driver's line: what the step adds to the job's environment."""
    words = shlex.split(driver_line)
    assert words[0] == "env", driver_line
    pairs = words[1 : words.index("srun")]
    return dict(pair.split("=", 1) for pair in pairs)


def test_dry_run_renders_the_driver_step(make_job):
    job = make_job("http://127.0.0.1:9/v1", repeats=3, parallel=3)
    venv = job.venv
    rendered = dry_run(job)
    assert not job.run_dirs()  # a dry run stages and submits nothing

    job_dir = rendered.job_dir
    assert job_dir.parent == rendered.run_dir and job_dir.name == job.benchmark
    assert rendered.run_dir.parent == job.output_path and rendered.run_dir.name.startswith("gym-job-")
    assert {
        "--job-name=gym-tiny",
        "--account=root",
        "--partition=debug",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--time=00:20:00",
    } <= set(rendered.directives)

    # the driver step: one srun, our env in front, the job's GYM_CMD array as its command
    words = shlex.split(rendered.driver_line)
    srun = words[words.index("srun") :]
    assert srun[:2] == ["srun", "--overlap"]
    assert srun[-2:] == ["--output=logs/driver-$SLURM_JOB_ID.log", "${GYM_CMD[@]}"]
    # Pyxis options whatever the config says: the cluster must accept them
    assert "--container-image=python:3.12" in srun and "--no-container-mount-home" in srun
    assert f"--container-mounts={job_dir}:{job_dir}" in srun
    env = driver_step_env(rendered.driver_line)
    assert env == job.driver_env()
    assert env["PATH"].split(os.pathsep)[0] == str(venv / "bin")

    # GYM_CMD: `gym eval run` (serving: no --no-serve) with the benchmark's run args, the
    # job's absolute output path and what the submit adds (capture, require_complete)
    assert rendered.gym_cmd[:3] == ["gym", "eval", "run"]
    args = rendered.gym_cmd[3:]
    assert "--no-serve" not in args
    assert set(args) == {
        f"+output_jsonl_fpath={job_dir}/artifacts/rollouts.jsonl",
        "+observability_enabled=True",
        f"+config_paths=[{job.trio.config_path}]",
        "+split=validation",
        f"+agent_name={AGENT}",
        "+num_repeats=3",
        "+num_samples_in_parallel=3",
        f"+uv_venv_dir={job.trio.workdir}",
        "+skip_venv_if_present=True",
        "+upload_rollouts_to_wandb=False",
        f"+model_call_capture_dir={job_dir}/model-calls",
        "+require_complete=True",
    }
    assert len(args) == len(set(args))


def test_a_submit_stages_the_script_and_records_the_job(tmp_path, make_job):
    """The submit side, up to sbatch: a stand-in sbatch on PATH records its call and answers a job id."""
    job = make_job("http://127.0.0.1:9/v1")
    fake = tmp_path / "fake-slurm"
    fake.mkdir()
    calls = tmp_path / "sbatch-calls"
    (fake / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 4242\n')
    (fake / "sbatch").chmod(0o755)
    env = job.environment()
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    done = subprocess.run(job.argv(), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    printed = json.loads(done.stdout)  # --json: the SubmissionRecord
    (run_dir,) = job.run_dirs()
    assert job.record(run_dir) == printed
    assert printed["run_dir"] == str(run_dir) and printed["cluster"] == "local" and printed["hostname"] is None
    assert printed["executor"] == "slurm"
    assert printed["benchmarks"] == [
        {"benchmark": job.benchmark, "job_dir": str(job.job_dir(run_dir)), "job_id": "4242", "error": None}
    ]
    # the local index, under the submit's XDG_CACHE_HOME
    assert json.loads((job.workdir / "cache" / "nemo-gym" / "jobs" / f"{run_dir.name}.json").read_text()) == printed
    assert (run_dir / "resolved-config.yaml").is_file()

    script = job.script_path(run_dir)
    assert calls.read_text().split() == ["--parsable", str(script)]
    assert oct(script.stat().st_mode & 0o777) == "0o600"
    assert (job.job_dir(run_dir) / "logs").is_dir() and (job.job_dir(run_dir) / "artifacts").is_dir()
    text = script.read_text()
    assert f"#SBATCH --chdir={job.job_dir(run_dir)}" in text
    assert f"+output_jsonl_fpath={job.rollouts_path(run_dir)}" in text
    assert not job.rollouts_path(run_dir).exists()  # nothing ran
