"""The Slurm advice in-process: what a job's driver command carries, and the guard it
starts with, run by a real bash; ``gym.submit`` and the job's link to it.

The real ``gym eval submit`` on a real Slurm cluster is ``tests/test_realgym_slurm.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from gym_autoinstr import settings
from gym_autoinstr._log import forget_said
from gym_autoinstr.advice import job, slurm
from gym_autoinstr.setup import identity

# The part of a 0.7.0 sbatch script the advice rewrites, as build_sbatch_script writes it.
SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=gym-bench
#SBATCH --chdir=/jobs/run1/bench

GYM_CMD=(
    gym eval run
    '+output_jsonl_fpath=/jobs/run1/bench/artifacts/rollouts.jsonl'
    '+agent_name=my agent'
)
srun --overlap --container-image=python:3.12 --output=logs/driver-$SLURM_JOB_ID.log "${GYM_CMD[@]}"
"""
JOB_DIR = Path("/jobs/run1/bench")


def _config(*, collector: bool = False, image: str = "python:3.12") -> SimpleNamespace:
    return SimpleNamespace(
        compute={"cluster-a": object()},
        driver=SimpleNamespace(container=image, benchmarks={"bench": object(), "other": object()}),
        otel=SimpleNamespace(enabled=collector),
    )


def _build(config: SimpleNamespace, benchmark: str = "bench", script: str = SCRIPT):
    return slurm.sbatch_script_advice(lambda *a, **k: script, None, (config, benchmark, None, None, JOB_DIR), {})


def _gym_cmd(script: str) -> list[str]:
    """The driver's argv, as bash expands the script's GYM_CMD array."""
    block = script[script.index("GYM_CMD=(") : script.index(")\n", script.index("GYM_CMD=(")) + 2]
    done = subprocess.run(
        ["bash", "-c", block + 'printf "%s\\0" "${GYM_CMD[@]}"'], capture_output=True, text=True, check=True
    )
    return done.stdout.split("\0")[:-1]


@pytest.fixture
def environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("OTEL_", settings.PREFIX)):
            monkeypatch.delenv(name)
    forget_said()
    return monkeypatch


def test_the_driver_command_carries_portable_settings_and_never_credentials(environ, caplog):
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4318")
    environ.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    environ.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer sekrit")
    environ.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/home/me/ca.pem")
    environ.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    environ.setenv("GYM_AUTOINSTR_JOB_TRACE", "single")
    environ.setenv("GYM_AUTOINSTR_OUTPUT_DIR", "/home/me/runs")  # a path of this host
    environ.setenv("GYM_AUTOINSTR_RUN_ID", "minted-here")
    environ.setenv("GYM_AUTOINSTR_NOT_A_SETTING", "x")
    script = _build(_config())
    argv = _gym_cmd(script)
    # env <settings> sh -c <guard> gym-autoinstr gym eval run <Gym's args>
    assert argv[0] == "env"
    at = argv.index("sh")
    carried = dict(item.split("=", 1) for item in argv[1:at])
    assert carried == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.example:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "GYM_AUTOINSTR_JOB_TRACE": "single",
    }
    assert argv[at + 1] == "-c" and argv[at + 3] == "gym-autoinstr"
    assert argv[at + 4 :] == [
        "gym",
        "eval",
        "run",
        "+output_jsonl_fpath=/jobs/run1/bench/artifacts/rollouts.jsonl",
        "+agent_name=my agent",
    ]
    assert "sekrit" not in script and "ca.pem" not in script and "/home/me" not in script
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE, OTEL_EXPORTER_OTLP_HEADERS is not written" in caplog.text
    # the rest of Gym's script is untouched
    assert script.replace(script[script.index("GYM_CMD=(") : script.index("    gym eval run")], "") == (
        SCRIPT.replace("GYM_CMD=(\n", "")
    )


def _carried(script: str) -> dict[str, str]:
    argv = _gym_cmd(script)
    return dict(item.split("=", 1) for item in argv[1 : argv.index("sh")])


def test_our_distros_defaults_are_not_carried_as_if_the_user_had_set_them(environ):
    from gym_autoinstr.setup.distro import DEFAULTS, GymDistro

    for name in (*DEFAULTS, settings.DISTRO_DEFAULTS.name):
        environ.delenv(name, raising=False)  # restored after the test: the distro writes os.environ
    GymDistro()._configure()  # as opentelemetry-instrument's start-up in the submitting process
    assert os.environ["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] == "fastapi"
    assert "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS" not in _carried(_build(_config()))  # the image's own stands
    # a process started from that one inherits the value and knows it is ours
    GymDistro()._configure()
    assert "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS" not in _carried(_build(_config()))
    # the user's own value (set before the start-up, or changed in a child) is carried
    environ.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "fastapi,requests")
    GymDistro()._configure()
    assert _carried(_build(_config()))["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] == "fastapi,requests"
    environ.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "fastapi")
    environ.delenv(settings.DISTRO_DEFAULTS.name)
    GymDistro()._configure()
    assert _carried(_build(_config()))["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] == "fastapi"


def test_the_embedded_default_writes_into_the_job_directory(environ):
    argv = _gym_cmd(_build(_config()))
    assert f"GYM_AUTOINSTR_OUTPUT_DIR={JOB_DIR}/gym-autoinstr" in argv[: argv.index("sh")]


def test_with_gyms_collector_on_the_job_exports_to_it(environ):
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4318")
    environ.setenv("OTEL_TRACES_EXPORTER", "console")
    argv = _gym_cmd(_build(_config(collector=True)))
    carried = dict(item.split("=", 1) for item in argv[1 : argv.index("sh")])
    assert carried == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }


def test_a_benchmark_with_its_own_command_is_left_as_gym_wrote_it(environ, caplog):
    script = SCRIPT.replace("    gym eval run\n", "")
    assert _build(_config(), "custom", script) == script
    assert "benchmark 'custom' runs its own command" in caplog.text


def test_a_failing_rewrite_keeps_gyms_script(environ, caplog):
    broken = SimpleNamespace(otel=None)  # no driver: reading the image fails
    assert _build(broken) == SCRIPT
    assert "could not prepare the Slurm job" in caplog.text


def _run_driver(
    script: str, tmp_path: Path, tools: dict[str, str], extra_path: str = "", env: dict[str, str] | None = None
) -> Any:
    """The driver command as the job runs it, with ``gym`` (and maybe the tracer's
    commands) as scripts on PATH that print what they were started with (``#!/bin/sh``
    unless the body starts with its own ``#!`` line)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(body if body.startswith("#!") else "#!/bin/sh\n" + body)
        path.chmod(0o755)
    block = script[script.index("GYM_CMD=(") : script.index(")\n", script.index("GYM_CMD=(")) + 2]
    path = f"{bin_dir}:{extra_path}:/usr/bin:/bin" if extra_path else f"{bin_dir}:/usr/bin:/bin"
    return subprocess.run(
        ["bash", "-c", block + '"${GYM_CMD[@]}"'], capture_output=True, text=True, env={"PATH": path, **(env or {})}
    )


GYM = 'echo "gym $* endpoint=$OTEL_EXPORTER_OTLP_ENDPOINT"\n'


def test_the_guard_runs_the_job_untraced_with_one_line_when_the_image_lacks_us(environ, tmp_path):
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4318")
    done = _run_driver(_build(_config(image="nvcr.io/team/gym:1.0")), tmp_path, {"gym": GYM})
    assert done.returncode == 0
    assert done.stdout.startswith("gym eval run +output_jsonl_fpath=")
    assert "endpoint=http://collector.example:4318" in done.stdout
    assert done.stderr.strip() == (
        "gym-autoinstr: gym-autoinstr is not installed beside gym where this job runs (image nvcr.io/team/gym:1.0), "
        "so the job runs untraced. Fix: install gym-autoinstr into the environment that runs Gym in the driver "
        "image (see docs/slurm.md)."
    )


TRACER = {"gym-autoinstr": "exit 1\n", "opentelemetry-instrument": 'echo instrumented; exec "$@"\n'}


def test_the_guard_starts_the_job_under_opentelemetry_instrument_where_we_are_installed(environ, tmp_path):
    done = _run_driver(_build(_config()), tmp_path, {"gym": GYM, **TRACER})
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[0] == "instrumented"
    assert done.stdout.splitlines()[1].startswith("gym eval run +output_jsonl_fpath=")


def test_the_guard_wants_us_beside_gym_not_in_another_environment(environ, tmp_path):
    elsewhere = tmp_path / "other-venv"
    elsewhere.mkdir()
    for name, body in TRACER.items():
        (elsewhere / name).write_text("#!/bin/sh\n" + body)
        (elsewhere / name).chmod(0o755)
    script = _build(_config())
    done = _run_driver(script, tmp_path, {"gym": GYM}, extra_path=str(elsewhere))
    assert done.returncode == 0 and "instrumented" not in done.stdout
    assert "runs untraced" in done.stderr


def _inherited_startup(tmp_path: Path, *, present: bool = True) -> str:
    """A PYTHONPATH as opentelemetry-instrument leaves it for the submitting process's children."""
    directory = tmp_path / "submit venv" / "site-packages" / "opentelemetry/instrumentation/auto_instrumentation"
    if present:
        directory.mkdir(parents=True)
        (directory / "sitecustomize.py").write_text("")
    return f"{tmp_path}/elsewhere:{directory}"


def _python(tmp_path: Path, *, has_us: bool) -> Path:
    """A stand-in for the Python ``gym``'s #! line names: answers the guard's import check
    (and notes it), and runs the ``gym`` script it is handed (a shell script) with sh."""
    python = tmp_path / "gym-venv" / "bin" / "python3"  # a #! line cannot hold a space
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -I ]; then echo "$*" >> "{tmp_path}/import-checks"; exit {0 if has_us else 1}; fi\n'
        'exec sh "$@"\n'
    )
    python.chmod(0o755)
    return python


def test_a_job_that_inherits_the_instrumented_environment_is_not_said_untraced(environ, tmp_path):
    """A local submit's job inherits the submitting shell (sbatch --export=ALL): OpenTelemetry's
    start-up rides in PYTHONPATH, and gym's Python has gym-autoinstr though its bin lacks our commands."""
    python = _python(tmp_path, has_us=True)
    env = {"PYTHONPATH": _inherited_startup(tmp_path)}
    done = _run_driver(_build(_config()), tmp_path, {"gym": f"#!{python}\n" + GYM}, env=env)
    assert done.returncode == 0
    assert done.stdout.startswith("gym eval run +output_jsonl_fpath=")  # started as Gym wrote it
    assert (tmp_path / "import-checks").read_text() == "-I -c import gym_autoinstr\n"
    assert "so the job runs untraced" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("gym-autoinstr:")]
    assert line.startswith(
        "gym-autoinstr: the job is traced through the OpenTelemetry start-up it inherits from the submitting "
        "environment (PYTHONPATH)"
    )
    assert "over SSH, SBATCH_EXPORT=NONE" in line and "Fix: install gym-autoinstr" in line


def test_an_inherited_start_up_without_us_in_gyms_python_is_untraced(environ, tmp_path):
    python = _python(tmp_path, has_us=False)
    env = {"PYTHONPATH": _inherited_startup(tmp_path)}
    done = _run_driver(_build(_config()), tmp_path, {"gym": f"#!{python}\n" + GYM}, env=env)
    assert done.returncode == 0 and done.stdout.startswith("gym eval run")
    assert (tmp_path / "import-checks").exists() and "so the job runs untraced." in done.stderr


def test_a_start_up_path_the_job_cannot_see_is_not_inherited(environ, tmp_path):
    # a container does not see the submitting host's files: PYTHONPATH names a directory that is not there
    python = _python(tmp_path, has_us=True)
    env = {"PYTHONPATH": _inherited_startup(tmp_path, present=False)}
    done = _run_driver(_build(_config()), tmp_path, {"gym": f"#!{python}\n" + GYM}, env=env)
    assert done.returncode == 0 and not (tmp_path / "import-checks").exists()
    assert "so the job runs untraced." in done.stderr


def test_an_inherited_start_up_with_gyms_python_unknown_says_what_it_depends_on(environ, tmp_path):
    env = {"PYTHONPATH": _inherited_startup(tmp_path)}
    done = _run_driver(_build(_config()), tmp_path, {"gym": "#!/usr/bin/env python3\n" + GYM}, env=env)
    assert "runs untraced" not in done.stderr
    assert (
        "the job inherits OpenTelemetry's start-up from the submitting environment (PYTHONPATH), which traces "
        "it only if the Python that runs gym has gym-autoinstr" in done.stderr
    )


def test_gym_submit_records_the_jobs_and_the_job_links_to_it(environ, spans):
    record = SimpleNamespace(
        gym_job_id="20261206-abc",
        benchmarks=[SimpleNamespace(job_id="41"), SimpleNamespace(job_id=None), SimpleNamespace(job_id="43")],
    )
    scripts = []

    def run(config, *, dry_run=False):
        scripts.append(_build(config))
        return record

    assert slurm.executor_run_advice(run, None, (_config(),), {"dry_run": False}) is record
    (submit,) = [s for s in spans.get_finished_spans() if s.name == "gym.submit"]
    assert submit.kind is SpanKind.PRODUCER
    assert dict(submit.attributes) == {
        "nemo.gym.submit.executor": "slurm",
        "nemo.gym.submit.dry_run": False,
        "nemo.gym.submit.cluster": "cluster-a",
        "nemo.gym.submit.benchmarks": 2,
        "nemo.gym.submit.id": "20261206-abc",
        "nemo.gym.submit.slurm.job_ids": ("41", "43"),
        "nemo.gym.submit.failed": 1,
        "error.type": "sbatch",
    }
    assert submit.status.status_code is StatusCode.ERROR
    # the script written inside the submission carries its context; the job links to it
    argv = _gym_cmd(scripts[0])
    (value,) = [item.split("=", 1)[1] for item in argv if item.startswith("GYM_AUTOINSTR_SUBMIT_TRACEPARENT=")]
    linked = job.submission({"GYM_AUTOINSTR_SUBMIT_TRACEPARENT": value})
    assert (linked.trace_id, linked.span_id) == (submit.context.trace_id, submit.context.span_id)
    assert linked.is_remote
    assert job.submission({"GYM_AUTOINSTR_SUBMIT_TRACEPARENT": "garbage"}) is None


def _submit(config: SimpleNamespace, *, dry_run: bool = False, hostname: str | None = None) -> Any:
    """``SlurmExecutor.run`` as Gym's: a script per benchmark, then (not a dry run) the record."""
    record = SimpleNamespace(
        gym_job_id="gym-job-20261206-abc",
        hostname=hostname,
        benchmarks=[SimpleNamespace(benchmark="bench", job_id="41"), SimpleNamespace(benchmark="other", job_id=None)],
    )

    def run(config, *, dry_run=False):
        for name in config.driver.benchmarks:
            slurm.sbatch_script_advice(lambda *a, **k: SCRIPT, None, (config, name, None, None, JOB_DIR / name), {})
        return None if dry_run else record

    return slurm.executor_run_advice(run, None, (config,), {"dry_run": dry_run})


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "their traces into their job directories" in r.getMessage()]


def test_the_submit_says_once_where_each_job_writes_its_traces(environ, caplog, tmp_path, monkeypatch):
    own = tmp_path / "gym-autoinstr-runs" / "r1"  # this process's own files (the configurator set it)
    environ.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(own))
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO", logger="gym_autoinstr")
    _submit(_config())
    (said,) = _said(caplog)
    assert said == (
        f"the Slurm jobs write their traces into their job directories: bench (Slurm job 41): {JOB_DIR}/bench/"
        "gym-autoinstr. Read a job's with `gym-autoinstr view <its directory>`; `gym-autoinstr view "
        "gym-autoinstr-runs/r1` shows this submission with its jobs once they ran."
    )
    # the note view follows from this process's directory (the benchmark whose sbatch failed has no job)
    (note,) = own.glob("submission-*.json")
    assert json.loads(note.read_text()) == {
        "submission": "gym-job-20261206-abc",
        "hostname": None,
        "jobs": [{"benchmark": "bench", "slurm_job_id": "41", "traces": f"{JOB_DIR}/bench/gym-autoinstr"}],
    }


def test_over_ssh_and_in_a_dry_run_the_submit_says_where_too(environ, caplog, tmp_path, monkeypatch):
    environ.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path / "own"))
    caplog.set_level("INFO", logger="gym_autoinstr")
    _submit(_config(), hostname="login.cluster")
    (said,) = _said(caplog)
    assert said.startswith(
        f"the Slurm jobs write their traces into their job directories on login.cluster: bench (Slurm job 41): "
        f"{JOB_DIR}/bench/gym-autoinstr."
    )
    assert "shows this submission and says where its jobs' traces are on login.cluster" in said
    caplog.clear()
    _submit(_config(), dry_run=True)
    (said,) = _said(caplog)
    assert said == (
        f"the Slurm jobs would write their traces into their job directories: bench: {JOB_DIR}/bench/gym-autoinstr; "
        f"other: {JOB_DIR}/other/gym-autoinstr. Read a job's with `gym-autoinstr view <its directory>`."
    )


def test_with_an_exporter_configured_the_submit_says_nothing_of_directories(environ, caplog, tmp_path):
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4318")
    caplog.set_level("INFO", logger="gym_autoinstr")
    _submit(_config())
    assert _said(caplog) == [] and not list(tmp_path.iterdir())


def test_a_failed_submission_marks_gym_submit(environ, spans):
    def run(config, *, dry_run=False):
        raise ValueError("Mount src paths do not exist")

    with pytest.raises(ValueError):
        slurm.executor_run_advice(run, None, (_config(),), {})
    (submit,) = [s for s in spans.get_finished_spans() if s.name == "gym.submit"]
    assert submit.status.status_code is StatusCode.ERROR
    assert submit.attributes["error.type"] == "ValueError"
    assert "Mount src" not in str(submit.status.description)


def test_a_process_in_a_slurm_job_says_where_it_runs():
    environ = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": "gym-bench",
        "SLURM_ARRAY_JOB_ID": "4240",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_CLUSTER_NAME": "lab",
        "SLURM_JOB_PARTITION": "batch",
        "SLURMD_NODENAME": "node017",
    }
    assert identity.slurm_attributes(environ) == {
        "slurm.job.id": "4242",
        "slurm.step.id": "0",
        "slurm.job.name": "gym-bench",
        "slurm.array.job.id": "4240",
        "slurm.array.task.id": "2",
        "slurm.cluster.name": "lab",
        "slurm.partition": "batch",
        "host.name": "node017",
    }
    assert identity.slurm_attributes({"SLURMD_NODENAME": "node017"}) == {}
    process = identity.ProcessIdentity(identity.Role.ORCHESTRATOR, "orchestrator")
    attributes = identity.resource_attributes(process, dict(environ))
    assert attributes["slurm.job.id"] == "4242" and attributes["nemo.gym.run.id"] == "4242"
