"""``gym eval submit`` (Gym 0.7.0) for one benchmark, against our policy model (issue #48, part 1).

The submit config is ``tests/harness/gym_submit.py``'s: no model services, a local Slurm
compute, Gym's collector step off, ``gym`` found on the driver's ``PATH``.  Without a Slurm
cluster (the real cluster's run is ``tests/test_realgym_slurm.py``) these tests:

* check the rendered sbatch script (directives, the driver's ``srun`` line, ``GYM_CMD``);
* the same dry run under ``opentelemetry-instrument``: our prefix in front of Gym's own
  ``GYM_CMD``, and the submitting process's ``gym.submit``.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from tests.harness.gym_submit import DryRun, SubmitJob, serving_venv, write_submit
from tests.harness.trio import AGENT

pytestmark = pytest.mark.realgym


@pytest.fixture
def make_job(tmp_path):
    """``write_submit`` into ``tmp_path``; each job's Ray temp dir removed afterwards."""
    jobs: list[SubmitJob] = []

    def make(policy_url: str, **options) -> SubmitJob:
        job = write_submit(tmp_path / "submit", serving_venv(), policy_url, tmp_path / "jobs", **options)
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


def test_an_instrumented_dry_run_prints_the_driver_command_as_it_would_be_submitted(tmp_path, make_job):
    """Under opentelemetry-instrument the scripts carry our prefix in front of Gym's own GYM_CMD,
    and the submitting process records ``gym.submit`` (a dry run: no ids)."""
    job = make_job("http://127.0.0.1:9/v1")
    plain = dry_run(job)
    env = {**job.environment(), "GYM_AUTOINSTR_JOB_TRACE": "single", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    done = subprocess.run(
        [str(job.venv / "bin" / "opentelemetry-instrument"), "--", *job.argv(dry_run=True)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rendered = DryRun(done.stdout, job.benchmark)
    at = rendered.gym_cmd.index("sh")
    assert rendered.gym_cmd[at + 1] == "-c" and rendered.gym_cmd[at + 3] == "gym-autoinstr"
    # Gym's own command, untouched behind ours (each submission has a run directory of its own)
    assert rendered.gym_cmd[at + 4 :] == [w.replace(str(plain.run_dir), str(rendered.run_dir)) for w in plain.gym_cmd]
    carried = dict(item.split("=", 1) for item in rendered.gym_cmd[1:at])
    assert rendered.gym_cmd[0] == "env"
    # no exporter configured: the embedded files go into the job directory; the submission's context rides
    assert carried.pop("GYM_AUTOINSTR_OUTPUT_DIR") == f"{rendered.job_dir}/gym-autoinstr"
    submitted = carried.pop("GYM_AUTOINSTR_SUBMIT_TRACEPARENT")
    # what the user set; not our distro's default OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi, set in the
    # submitting process by its start-up (the image's own value stands in the job)
    assert carried == {"GYM_AUTOINSTR_JOB_TRACE": "single", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    assert rendered.driver_line == plain.driver_line.replace(str(plain.run_dir), str(rendered.run_dir))
    # said once on the submitting side: where the job would write its traces (no note: nothing submitted)
    assert (
        "gym-autoinstr: INFO: the Slurm jobs would write their traces into their job directories: "
        f"{job.benchmark}: {rendered.job_dir}/gym-autoinstr." in done.stderr
    ), done.stderr[-3000:]
    assert not list((tmp_path / "gym-autoinstr-runs").rglob("submission-*.json"))

    # the dry run's gym.submit, in the submitting process's own files (./gym-autoinstr-runs/<run id>)
    from gym_autoinstr.setup.files import read_path

    (submit,) = [s for s in read_path(tmp_path / "gym-autoinstr-runs") if s["name"] == "gym.submit"]
    assert (submit["kind"], submit["parent_span_id"]) == ("PRODUCER", None)
    assert submit["attributes"] == {
        "nemo.gym.submit.executor": "slurm",
        "nemo.gym.submit.dry_run": True,
        "nemo.gym.submit.cluster": "local",
        "nemo.gym.submit.benchmarks": 1,
    }
    version, trace_id, span_id, flags = submitted.split("-")
    assert (version, trace_id, span_id) == ("00", submit["trace_id"], submit["span_id"])
    assert int(flags, 16) & 1  # sampled
