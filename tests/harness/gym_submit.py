"""A real ``gym eval submit`` (Gym 0.7.0+) for one benchmark against our own policy model.

    venv = gym_venv("0.7.0")
    job = write_submit(tmp_path, venv, policy_url=policy_model.url, output_path=tmp_path / "jobs")
    subprocess.run(job.argv(), env=job.environment(), ...)        # sbatch on a local Slurm
    record = job.record()                                          # <run dir>/gym-job.json

What is written under ``workdir`` (nothing else is needed by the job):

* ``submit.yaml`` -- the SubmitConfig: no ``services`` (our policy model already runs; its URL
  is in the trio config), one Slurm compute with no ``hostname`` (a local connection: sbatch
  runs on this machine, no SSH; ``hostname=<alias>`` sets it: Gym submits over SSH, see
  ``tests/harness/ssh.py``), ``otel.enabled: false`` (Gym's collector step off), no
  ``driver.gym_install`` (the driver finds ``gym`` on ``PATH``, set through ``driver.env``
  ``lit:`` values: no container runtime here, the step runs on the host).
* ``gym/gym_trio_config.yaml`` -- the ``GymTrio`` config (fixed ports; the agent declares
  the benchmark's rows as a ``validation`` dataset: ``gym eval run`` without ``--no-serve``
  takes no input file, it prepares the requested split from the datasets of the config);
  ``gym/<type>/<impl>/.venv`` symlinks to ``venv``, found through ``+uv_venv_dir`` and
  reused with ``+skip_venv_if_present`` (no uv venv per server).
* ``gym/rows.jsonl`` -- the task rows.

After a submit: the run directory is ``<output_path>/<gym job id>``; it holds the manifest
``gym-job.json`` (a SubmissionRecord; also printed with ``--json`` and indexed under
``$XDG_CACHE_HOME/nemo-gym/jobs/``) and ``resolved-config.yaml``; each benchmark's job
directory ``<run dir>/<benchmark>`` holds ``job.sh`` (the sbatch script, mode 0600),
``logs/driver-<slurm job id>.log`` and ``artifacts/rollouts.jsonl``.

Gotcha for the Slurm side: every driver step is ``srun --overlap --no-container-mount-home
--container-mounts=<job dir>:<job dir> --container-image=<driver.container> ...``; those are
Pyxis options, so the cluster needs Pyxis (or a SPANK plugin / ``srun`` that accepts and
ignores them). ``srun`` itself is looked up on ``driver.env``'s ``PATH`` (``env PATH=... srun``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from tests.harness.trio import AGENT, GymTrio

GYM_VERSION = "0.7.0"
# gym eval run (serving) prepares its data through train_data_utils, which imports mlflow (via
# gitlab_utils) and datasets (via hf_utils): base requirements of nemo-gym that the minimal test
# venv leaves out. mlflow-skinny has all of mlflow that Gym imports.
SERVING_EXTRA = ("mlflow-skinny>=3.16.1", "datasets")
DEFAULT_BENCHMARK = "tiny"
SPLIT = "validation"
# What a single-node test cluster takes; overridable per call.
DEFAULT_ACCOUNT = "root"
DEFAULT_PARTITION = "debug"


def _yaml_value(value: Any) -> str:
    # JSON scalars are YAML scalars; strings are always quoted so nothing is reinterpreted.
    return json.dumps(value)


def _to_yaml(data: Any, indent: int = 0) -> str:
    """Block-style YAML for nested dicts/lists of scalars (the test side has no PyYAML).

    Block style, not JSON: Hydra's ``compose`` reads the file, and flow mappings of
    ``lit:...`` strings are fine, but a readable file is what a user would write.
    """
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(value, Mapping) and value:
                lines.append(f"{pad}{key}:")
                lines.append(_to_yaml(value, indent + 1))
            elif isinstance(value, list) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(f"{pad}  - {_yaml_value(v)}" for v in value)
            elif isinstance(value, Mapping):
                lines.append(f"{pad}{key}: {{}}")
            elif isinstance(value, list):
                lines.append(f"{pad}{key}: []")
            else:
                lines.append(f"{pad}{key}: {_yaml_value(value)}")
    return "\n".join(lines)


class SubmitJob:
    """One benchmark's submit config and what it references, written under ``workdir``."""

    def __init__(
        self,
        workdir: pathlib.Path | str,
        venv: pathlib.Path | str,
        policy_url: str,
        output_path: pathlib.Path | str,
        benchmark: str = DEFAULT_BENCHMARK,
        *,
        rows: int = 1,
        repeats: int = 2,
        parallel: int = 2,
        account: str = DEFAULT_ACCOUNT,
        partition: str = DEFAULT_PARTITION,
        walltime: str = "00:20:00",
        env: Mapping[str, str] | None = None,
        srun_dirs: Sequence[str] = (),
        gym_version: str = "0.7.0",
        container: str | None = None,
        hostname: str | None = None,
    ) -> None:
        self.workdir = pathlib.Path(workdir).absolute()
        self.venv = pathlib.Path(venv).absolute()
        self.output_path = pathlib.Path(output_path).absolute()
        self.benchmark = benchmark
        self.rows, self.repeats, self.parallel = rows, repeats, parallel
        self.account, self.partition, self.walltime = account, partition, walltime
        # driver.container (Gym's default when None); a directory stands for an image whose
        # software is that tree: the test cluster's pyxis_noop puts its bin first on PATH.
        self.container = container
        # compute.local.hostname: Gym submits over SSH to that host (None: sbatch runs here)
        self.hostname = hostname
        self.extra_env = dict(env or {})
        # Where the job finds `srun` (and bash, curl...): `env PATH=<driver PATH> srun ...`
        # looks srun up on the driver's PATH, not the batch script's.
        self.srun_dirs = list(srun_dirs) or _default_srun_dirs()
        self.config_path = self.workdir / "submit.yaml"
        self.rows_path = self.workdir / "gym" / "rows.jsonl"
        dataset = {"name": benchmark, "type": SPLIT, "jsonl_fpath": str(self.rows_path), "license": "MIT"}
        self.trio = GymTrio(
            self.venv,
            gym_version,
            self.workdir / "gym",
            policy_url=policy_url,
            extra_config={AGENT: {"datasets": [dataset]}},
        )
        # Ray's unix sockets live under RAY_TMPDIR: short, private to this job.
        self.ray_tmpdir = tempfile.mkdtemp(prefix="gsray-")

    # ------------------------------------------------------------------ files

    def run_args(self) -> dict[str, Any]:
        """The benchmark's ``run:`` dict: ``gym eval run`` overrides (``+key=value`` each)."""
        return {
            "config_paths": [str(self.trio.config_path)],
            "split": SPLIT,
            "agent_name": AGENT,
            "num_repeats": self.repeats,
            "num_samples_in_parallel": self.parallel,
            "uv_venv_dir": str(self.trio.workdir),
            "skip_venv_if_present": True,
            "upload_rollouts_to_wandb": False,
        }

    def driver_env(self) -> dict[str, str]:
        """``driver.env`` before its ``lit:`` prefixes: the environment of the driver step."""
        path = [str(self.venv / "bin"), *self.srun_dirs]
        env = {
            "PATH": os.pathsep.join(dict.fromkeys(path)),
            "RAY_TMPDIR": self.ray_tmpdir,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            "WANDB_MODE": "disabled",
        }
        env.update(self.extra_env)
        return env

    def submit_config(self) -> dict[str, Any]:
        return {
            "services": {},
            "compute": {
                "local": {
                    "type": "slurm",
                    "account": self.account,
                    "walltime": self.walltime,
                    "node_pools": {"main": {"partition": self.partition, "nodes": 1, "ntasks_per_node": 1}},
                    **({"hostname": self.hostname} if self.hostname else {}),
                }
            },
            "driver": {
                # No policy service: no --model-type, no policy_* run args; the trio config has the model.
                "policy_model_type": "",
                "env": {k: f"lit:{v}" for k, v in self.driver_env().items()},
                "benchmarks": {self.benchmark: {"run": self.run_args()}},
                **({"container": self.container} if self.container else {}),
            },
            "job": {"output_path": str(self.output_path)},
            "otel": {"enabled": False},
        }

    def write(self) -> SubmitJob:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.output_path.mkdir(parents=True, exist_ok=True)
        self.trio.prepare()
        row = json.dumps(self.trio.default_row())
        self.rows_path.write_text("".join(row + "\n" for _ in range(self.rows)))
        self.config_path.write_text(_to_yaml(self.submit_config()) + "\n")
        return self

    # ------------------------------------------------------------------ submit

    def argv(self, *, dry_run: bool = False, json_output: bool = True) -> list[str]:
        """``gym eval submit``; with ``--json`` its stdout is the SubmissionRecord."""
        argv = [str(self.venv / "bin" / "gym"), "eval", "submit", "--config", str(self.config_path)]
        return argv + (["--dry-run"] if dry_run else []) + (["--json"] if json_output and not dry_run else [])

    def environment(self) -> dict[str, str]:
        """The submitting shell: sbatch exports it to the job (``--export=ALL``)."""
        env = self.trio.environment()
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), *self.srun_dirs, env.get("PATH", "")])
        # The local job index goes under the workdir, not ~/.cache.
        env["XDG_CACHE_HOME"] = str(self.workdir / "cache")
        return env

    def run_dirs(self) -> list[pathlib.Path]:
        return sorted(p for p in self.output_path.glob("gym-job-*") if p.is_dir())

    def record(self, run_dir: pathlib.Path | None = None) -> dict:
        """The manifest of a submit: ``<run dir>/gym-job.json`` (the newest run if not named)."""
        run_dir = run_dir or self.run_dirs()[-1]
        return json.loads((run_dir / "gym-job.json").read_text())

    def job_dir(self, run_dir: pathlib.Path) -> pathlib.Path:
        return run_dir / self.benchmark

    def script_path(self, run_dir: pathlib.Path) -> pathlib.Path:
        return self.job_dir(run_dir) / "job.sh"

    def rollouts_path(self, run_dir: pathlib.Path) -> pathlib.Path:
        return self.job_dir(run_dir) / "artifacts" / "rollouts.jsonl"

    def driver_log(self, run_dir: pathlib.Path, slurm_job_id: str) -> pathlib.Path:
        return self.job_dir(run_dir) / "logs" / f"driver-{slurm_job_id}.log"

    def cleanup(self) -> None:
        shutil.rmtree(self.ray_tmpdir, ignore_errors=True)


def serving_venv() -> pathlib.Path:
    """The Gym venv a submitted job runs (``gym eval run`` serving needs ``SERVING_EXTRA``)."""
    from tests.harness.gym_install import gym_venv

    return gym_venv(GYM_VERSION, extra=SERVING_EXTRA)


def write_submit(
    workdir: pathlib.Path | str,
    venv: pathlib.Path | str,
    policy_url: str,
    output_path: pathlib.Path | str,
    benchmark: str = DEFAULT_BENCHMARK,
    **options: Any,
) -> SubmitJob:
    """Write the submit YAML and what it references; see ``SubmitJob`` for ``options``."""
    return SubmitJob(workdir, venv, policy_url, output_path, benchmark, **options).write()


def _default_srun_dirs() -> list[str]:
    dirs = [os.path.dirname(p) for p in (shutil.which("srun"), shutil.which("bash")) if p]
    return list(dict.fromkeys(dirs + ["/usr/local/bin", "/usr/bin", "/bin"]))


# ---------------------------------------------------------------- dry run


class DryRun:
    """What ``gym eval submit --dry-run`` printed for one benchmark."""

    def __init__(self, output: str, benchmark: str) -> None:
        self.output = output
        match = re.search(r"^\[dry-run\] remote run dir: (\S+)$", output, re.M)
        if not match:
            raise ValueError("no run dir in the dry-run output:\n" + output)
        self.run_dir = pathlib.Path(match.group(1))
        marker = f"[dry-run] sbatch script for benchmark: {benchmark}\n"
        start = output.index(marker) + len(marker)
        body = output[start:].split("\n", 1)[1]  # past the ==== rule
        end = body.find("\n" + "=" * 60 + "\n")
        self.script = body if end < 0 else body[:end]
        array = re.search(r"^GYM_CMD=\(\n(.*?)\n\)$", self.script, re.M | re.S)
        if not array:
            raise ValueError("no GYM_CMD in the script:\n" + self.script)
        self.gym_cmd = [word for line in array.group(1).splitlines() for word in shlex.split(line)]
        (self.driver_line,) = [line for line in self.script.splitlines() if " srun " in f" {line}"]
        self.directives = re.findall(r"^#SBATCH (.*)$", self.script, re.M)

    @property
    def job_dir(self) -> pathlib.Path:
        (chdir,) = [d.split("=", 1)[1] for d in self.directives if d.startswith("--chdir=")]
        return pathlib.Path(chdir)
