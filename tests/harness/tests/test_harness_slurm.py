"""The Slurm test cluster (tests/harness/slurm.py) runs what Gym 0.7's ``gym eval submit``
submits, and what Slurm does with the environment under ``SBATCH_EXPORT=NONE``.

The findings, on Slurm 22.05 (Debian 12), which the product's design relies on:

- ``SBATCH_EXPORT=NONE`` in the submitting environment: a variable exported there does
  NOT reach the batch script.  The script gets the user's login environment instead
  (``SLURM_GET_USER_ENV=1``: ``HOME``, a login ``PATH``), and ``SLURM_EXPORT_ENV=NONE``.
- That ``SLURM_EXPORT_ENV=NONE`` is srun's ``--export``: every ``srun`` in the script
  starts its step with ``SLURM_*`` variables (and ``TMPDIR``) alone.  A variable the script
  ``export``s does NOT reach the step, nor does ``env K=V srun ...``; the step has no
  ``PATH`` either, so a bare command name (``srun bash ...``) fails to start
  ("execve(): bash: No such file or directory").
- What is on srun's command line does: ``srun /usr/bin/env K=V /usr/bin/printenv K``
  prints ``V`` (an absolute path, for want of ``PATH``); ``srun --export=ALL`` brings the
  script's environment back, ``srun --export=K`` that one variable.
- Without ``SBATCH_EXPORT`` (``--export=ALL``, the default) every one of them reaches.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The driver step as Gym 0.7's slurm_script.py renders it (a service step adds --container-workdir).
GYM_STEP_FLAGS = (
    "--overlap --no-container-mount-home --container-mounts=a:a --container-workdir=/tmp --container-image=python:3.12"
)


def _submit(cluster, tmp_path: Path, body: str, *, env_extra: dict[str, str] | None = None):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + body)
    env = cluster.env
    env.update(env_extra or {})
    job = cluster.sbatch(script, f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}", env=env)
    result = cluster.wait(job, timeout=60)
    output = (tmp_path / "job.out").read_text()
    return result, output


def _values(output: str) -> dict[str, str]:
    """``name=value`` lines the job printed."""
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line and " " not in line.split("=")[0])


def test_a_gym_style_step_with_pyxis_flags_runs_on_the_host(slurm_cluster, tmp_path):
    body = (
        "mkdir -p logs\n"
        f"srun {GYM_STEP_FLAGS} --output=logs/driver-$SLURM_JOB_ID.log "
        "bash -c 'echo ran=yes; echo cwd=$PWD; env | grep ^GYM_TEST_PYXIS_ | sort'\n"
    )
    result, _ = _submit(slurm_cluster, tmp_path, body)
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), result.fields
    step = _values((tmp_path / "logs" / f"driver-{result.job_id}.log").read_text())
    assert step["ran"] == "yes"
    assert step["cwd"] == str(tmp_path)  # no container: --container-workdir was accepted and ignored
    assert step["GYM_TEST_PYXIS_IMAGE"] == "python:3.12"  # the flag reached our SPANK plugin
    assert step["GYM_TEST_PYXIS_MOUNTS"] == "a:a"
    assert step["GYM_TEST_PYXIS_WORKDIR"] == "/tmp"
    assert step["GYM_TEST_PYXIS_FLAGS"].split() == [
        "container-image",
        "container-mounts",
        "container-workdir",
        "no-container-mount-home",
    ]


def test_a_step_without_pyxis_flags_sees_no_plugin_variables(slurm_cluster, tmp_path):
    result, output = _submit(slurm_cluster, tmp_path, "srun --overlap bash -c 'echo count=$(env | grep -c PYXIS)'\n")
    assert result.state == "COMPLETED", result.fields
    assert _values(output)["count"] == "0"


def test_a_failing_job_reports_its_exit_code(slurm_cluster, tmp_path):
    result, output = _submit(slurm_cluster, tmp_path, "echo before=1\nexit 3\n")
    assert (result.state, result.exit_code) == ("FAILED", "3:0")
    assert _values(output)["before"] == "1"


# Each probe prints name=value; "unset" when the variable did not reach.
ENV_PROBES = """\
echo "batch_submit=${K_SUBMIT-unset}"
echo "batch_export_env=${SLURM_EXPORT_ENV-unset}"
export K_SCRIPT=inside
srun --overlap /bin/bash -c 'echo "step_script=${K_SCRIPT-unset}"; echo "step_submit=${K_SUBMIT-unset}"'
env K_ENV=viaenv srun --overlap /bin/bash -c 'echo "step_env_prefix=${K_ENV-unset}"'
echo "step_argument=$(srun --overlap /usr/bin/env K_ARG=viaarg /usr/bin/printenv K_ARG)"
echo "step_has_path=$(srun --overlap /usr/bin/env | grep -c ^PATH=)"
echo "step_export_all=$(srun --overlap --export=ALL /bin/bash -c 'echo ${K_SCRIPT-unset}')"
echo "step_export_one=$(srun --overlap --export=K_SCRIPT /bin/bash -c 'echo ${K_SCRIPT-unset}')"
srun --overlap bash -c 'echo bare_name=ran' || echo "bare_name=failed"
"""


def _probe(cluster, tmp_path: Path, env_extra: dict[str, str]) -> tuple[dict[str, str], str]:
    result, output = _submit(cluster, tmp_path, ENV_PROBES, env_extra={"K_SUBMIT": "fromsubmit", **env_extra})
    assert result.state == "COMPLETED", (result.fields, output)
    return _values(output), output


def test_sbatch_export_none_keeps_the_environment_from_batch_script_and_steps(slurm_cluster, tmp_path):
    seen, output = _probe(slurm_cluster, tmp_path, {"SBATCH_EXPORT": "NONE"})
    assert seen["batch_submit"] == "unset"  # (a) the submitting shell's variable: no
    assert seen["batch_export_env"] == "NONE"  # ... and every srun inherits --export=NONE:
    assert seen["step_script"] == "unset"  # (b) exported inside the batch script: no
    assert seen["step_submit"] == "unset"
    assert seen["step_env_prefix"] == "unset"  # (c) env K=V srun ...: no
    assert seen["step_argument"] == "viaarg"  # (d) on srun's command line: yes
    assert seen["step_has_path"] == "0"  # not even PATH:
    assert seen["bare_name"] == "failed"  # `srun bash ...` cannot start
    assert "execve(): bash: No such file or directory" in output
    assert seen["step_export_all"] == "inside"  # srun --export=ALL brings the script's back
    assert seen["step_export_one"] == "inside"  # srun --export=K that one


def test_by_default_every_variable_reaches_the_steps(slurm_cluster, tmp_path):
    seen, _ = _probe(slurm_cluster, tmp_path, {})
    assert seen["batch_submit"] == "fromsubmit"
    assert seen["batch_export_env"] == "unset"
    assert seen["step_script"] == "inside"
    assert seen["step_submit"] == "fromsubmit"
    assert seen["step_env_prefix"] == "viaenv"
    assert seen["step_argument"] == "viaarg"
    assert seen["step_has_path"] == "1"
    assert seen["bare_name"] == "ran"


def test_jobs_run_side_by_side_on_the_shared_cluster(slurm_cluster, tmp_path):
    """Two jobs at once (one core each) on the session's cluster; each sees only its own output."""
    jobs = []
    for name in ("one", "two"):
        d = tmp_path / name
        d.mkdir()
        script = d / "job.sh"
        script.write_text(f"#!/bin/bash\nsrun --overlap bash -c {shlex.quote(f'sleep 1; echo name={name}')}\n")
        job = slurm_cluster.sbatch(script, f"--output={d / 'job.out'}", f"--chdir={d}", "--ntasks=1")
        jobs.append((name, d, job))
    assert len({job for _, _, job in jobs}) == 2
    for name, d, job in jobs:
        assert slurm_cluster.wait(job, timeout=60).state == "COMPLETED"
        assert _values((d / "job.out").read_text()) == {"name": name}


def test_the_cluster_is_its_own(slurm_cluster):
    """Nothing in /etc: the clients find the cluster through SLURM_CONF alone."""
    conf = Path(slurm_cluster.env["SLURM_CONF"])
    assert conf.is_relative_to(slurm_cluster.workdir)
    assert f"AuthInfo=socket={slurm_cluster.munge_socket}" in conf.read_text()
    assert set(slurm_cluster.processes()) == {"munged", "slurmctld", "slurmd"}
    for pid in slurm_cluster.processes().values():
        assert os.path.exists(f"/proc/{pid}")
    partition, state = slurm_cluster.run("sinfo", "-h", "-o", "%P %T").split()
    assert partition == "main*" and state in ("idle", "mixed", "allocated"), state


def test_an_image_that_is_a_directory_puts_its_bin_first_on_the_steps_path(slurm_cluster, tmp_path):
    """A test's stand-in for an image with software in it (a venv as ``driver.container``):
    its ``bin`` leads the step's PATH, even under SBATCH_EXPORT=NONE (a step with no PATH)."""
    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    tool = image / "bin" / "imagetool"
    tool.write_text("#!/bin/sh\necho imagetool=ran\n")
    tool.chmod(0o755)
    body = (
        f"srun --overlap --container-image={image} imagetool\nsrun --overlap --container-image=python:3.12 imagetool\n"
    )
    result, output = _submit(slurm_cluster, tmp_path, body, env_extra={"SBATCH_EXPORT": "NONE"})
    assert result.state == "FAILED", (result.fields, output)  # the second step: no such image here
    assert _values(output)["imagetool"] == "ran"
    assert "execve(): imagetool: No such file or directory" in output
