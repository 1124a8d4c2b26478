"""Gym's Slurm jobs (``gym eval submit``, 0.6.0+): traced on the compute nodes as a local run is.

``SlurmExecutor.run`` writes one sbatch script per benchmark and submits it, locally or
over SSH.  The script's driver step (``srun --container-image=... "${GYM_CMD[@]}"``) runs
``gym eval run`` on a compute node, in a pyxis container: nothing of the submitting
process's environment can be counted on there (SSH, ``SBATCH_EXPORT=NONE``, an image
that does not see the host's files).  So what the job needs rides in the command itself:

* ``gym.submit`` (PRODUCER), in the submitting process, around ``SlurmExecutor.run``:
  executor, cluster, benchmarks, and once submitted the submission id and each job id.
* ``build_sbatch_script``: the driver's ``GYM_CMD`` array starts with
  ``env <settings> sh -c <guard> gym-autoinstr`` before ``gym eval run``.  The settings
  are this process's OpenTelemetry and gym-autoinstr settings that mean the same on
  another machine (never headers, certificates or keys: they may hold credentials and
  the script is a file; never paths of this host; never our distro's defaults, which the
  job's own start-up sets, or not, from its image), and ``GYM_AUTOINSTR_SUBMIT_TRACEPARENT``
  (``gym.submit``'s context: the job's ``gym.job`` carries a span link to it).  The guard
  starts the command under ``opentelemetry-instrument`` when the driver's environment (its
  image) has gym-autoinstr, else runs it as Gym wrote it, with one line in the driver's log
  saying whether it is traced anyway (through an OpenTelemetry start-up inherited from a
  local submit) or untraced.
* Gym's collector step on (``otel.enabled``): the job's telemetry goes to that collector
  (OTLP/HTTP on the driver's node, where Gym points its own); ours is not carried.
* The embedded file default: the files go to ``<job dir>/gym-autoinstr``, which the driver
  step mounts, not to a path of the submitting host.  The submit says so once, per job, and
  leaves a note beside its own files that ``gym-autoinstr view`` follows from there
  (``setup/runs.py``: the submission and its jobs, viewed together).
"""

from __future__ import annotations

import os
import re
import shlex
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.fastpath.w3c import traceparent
from gym_autoinstr.setup import distro, files, runs
from gym_autoinstr.telemetry import groups
from gym_autoinstr.telemetry.spans import mark_error, tracer

SUBMIT_SPAN = "gym.submit"

# Where the embedded file default writes inside a job: under the job directory, which the
# driver step mounts at the same path.
JOB_OUTPUT_SUBDIR = "gym-autoinstr"
# Gym's collector receives OTLP/HTTP here, beside the driver (0.7.0: otel.OTLP_HTTP_PORT).
GYM_COLLECTOR_HTTP_PORT = 4318

# Settings that mean the same on a compute node.  Exporter destinations are left out when
# Gym's collector step is on (the job's telemetry goes to it).
_DESTINATION = (
    settings.TRACES_EXPORTER,
    settings.METRICS_EXPORTER,
    settings.LOGS_EXPORTER,
    settings.OTLP_ENDPOINT,
    settings.OTLP_TRACES_ENDPOINT,
    settings.OTLP_PROTOCOL,
    settings.OTLP_TRACES_PROTOCOL,
    settings.OTLP_METRICS_PROTOCOL,
    settings.OTLP_LOGS_PROTOCOL,
    settings.OTLP_INSECURE,
    settings.OTLP_TRACES_INSECURE,
)
_CARRIED_OTEL = (
    settings.SDK_DISABLED,
    settings.SERVICE_NAME,
    settings.PYTHON_DISABLED_INSTRUMENTATIONS,
    settings.TRACES_SAMPLER,
    settings.TRACES_SAMPLER_ARG,
    settings.METRIC_EXPORT_INTERVAL,
    settings.BSP_SCHEDULE_DELAY,
    settings.BSP_MAX_QUEUE_SIZE,
    settings.BSP_MAX_EXPORT_BATCH_SIZE,
    settings.BSP_EXPORT_TIMEOUT,
    settings.OTLP_TIMEOUT,
    settings.OTLP_TRACES_TIMEOUT,
    settings.OTLP_METRICS_TEMPORALITY,
    settings.PROPAGATORS,
)
# Ours that belong to this host or this process: a path here, ids minted for this run.
_NOT_CARRIED = frozenset(
    setting.name
    for setting in (
        settings.OUTPUT_DIR,
        settings.RUN_ID,
        settings.SHARD,
        settings.STARTUP_TRACEPARENT,
        settings.SPAWN_NS,
        settings.SERVER_REQUIREMENT,
        settings.SUBMIT_TRACEPARENT,
        settings.DISTRO_DEFAULTS,
        settings.UNKNOWN_SAID,
    )
)
# May hold credentials or name files of this host: never written into a job script.
_SECRET = re.compile(r"^OTEL_EXPORTER_OTLP_(\w+_)?(HEADERS|CERTIFICATE|CLIENT_KEY|CLIENT_CERTIFICATE)$")


@dataclass
class _Submission:
    """One ``SlurmExecutor.run``: its span, and where each benchmark's job writes the
    embedded files (``build_sbatch_script`` notes them as it writes each script)."""

    span: Any = None  # gym.submit; None when the job span group is off
    trace_dirs: dict[str, Path] = field(default_factory=dict)


_submitting: ContextVar[_Submission | None] = ContextVar("gym_autoinstr_submit", default=None)

# What the job's driver runs first: the command under opentelemetry-instrument when the
# driver's environment has gym-autoinstr, else the command as is, with one line in its log.
# Installed beside the command (in the environment of the `gym` it runs) is what counts: an
# opentelemetry-instrument of another environment would start Gym without our distro.
# Not beside it, the job may still be traced: a local submit's job inherits the submitting
# environment (sbatch's --export=ALL), whose PYTHONPATH starts OpenTelemetry in every Python
# (its sitecustomize); gym's own Python (its #! line) then traces it if it has gym-autoinstr.
# The line in the log says which: traced through that inheritance, untraced, or (gym's Python
# unknown) traced only if that Python has gym-autoinstr.
_GUARD = (
    'gym=$(command -v "$1"); bin=$(dirname "$gym"); '
    'if [ -x "$bin/opentelemetry-instrument" ] && [ -x "$bin/gym-autoinstr" ]; '
    'then exec "$bin/opentelemetry-instrument" "$@"; fi; '
    "startup=$(IFS=:; set -f; for dir in $PYTHONPATH; do case $dir in "
    '*/opentelemetry/instrumentation/auto_instrumentation) [ -f "$dir/sitecustomize.py" ] && echo "$dir";; '
    "esac; done); "
    'if [ -n "$startup" ]; then '
    'py=; { IFS= read -r first; } < "$gym" && py=${first#"#!"}; '
    'case $py in /*python*) case $py in *" "*) py=;; esac;; *) py=;; esac; '
    'if [ -z "$py" ]; then '
    'echo "gym-autoinstr: gym-autoinstr is not installed beside $1 where this job runs (@WHERE@); the job inherits '
    "OpenTelemetry's start-up from the submitting environment (PYTHONPATH), which traces it only if the Python "
    "that runs $1 has gym-autoinstr. Fix: install gym-autoinstr into the environment that runs Gym in the driver "
    'image (see docs/slurm.md)." >&2; exec "$@"; fi; '
    'if "$py" -I -c "import gym_autoinstr" 2>/dev/null; then '
    'echo "gym-autoinstr: the job is traced through the OpenTelemetry start-up it inherits from the submitting '
    "environment (PYTHONPATH): gym-autoinstr is in $1's Python but not installed beside it (@WHERE@), so a job "
    "that inherits nothing (over SSH, SBATCH_EXPORT=NONE) runs untraced. Fix: install gym-autoinstr into the "
    'environment that runs Gym in the driver image (see docs/slurm.md)." >&2; exec "$@"; fi; '
    "fi; "
    'echo "gym-autoinstr: gym-autoinstr is not installed beside $1 where this job runs (@WHERE@), so the job '
    "runs untraced. Fix: install gym-autoinstr into the environment that runs Gym in the driver image "
    '(see docs/slurm.md)." >&2; '
    'exec "$@"'
)
_GYM_CMD = "GYM_CMD=(\n    gym eval run\n"
_PRINTABLE = re.compile(r"[^A-Za-z0-9._:/@+-]")


def _config_arg(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get("config")


def executor_run_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``gym.submit`` around ``SlurmExecutor.run(config, *, dry_run)``; afterwards, once, where
    the jobs write their traces (the embedded file default)."""
    submission = _Submission()
    if groups.JOB in groups.ENABLED:
        try:
            submission.span = tracer().start_span(
                SUBMIT_SPAN, kind=SpanKind.PRODUCER, attributes=_submit_attributes(args, kwargs)
            )
        except Exception as error:
            warn_once("slurm:submit", "gym.submit skipped (%r); the submission is unaffected.", error)
    span = submission.span
    token = _submitting.set(submission)
    try:
        if span is None:
            record = wrapped(*args, **kwargs)
        else:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                record = wrapped(*args, **kwargs)
    except BaseException as error:
        if span is not None and isinstance(error, Exception):
            mark_error(span, error)
        raise
    else:
        if span is not None:
            _record_jobs(span, record)
        try:
            _say_where_traces_go(submission, record, _config_arg(args, kwargs))
        except Exception as error:
            warn_once("slurm:where", "gym-autoinstr could not say where the Slurm jobs write their traces (%r)", error)
        return record
    finally:
        _submitting.reset(token)
        if span is not None:
            span.end()


def _submit_attributes(args: tuple, kwargs: dict) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        attr.SUBMIT_EXECUTOR: "slurm",
        attr.SUBMIT_DRY_RUN: bool(kwargs.get("dry_run", False)),
    }
    config = _config_arg(args, kwargs)
    try:
        attributes[attr.SUBMIT_CLUSTER] = str(next(iter(config.compute)))
        attributes[attr.SUBMIT_BENCHMARKS] = len(config.driver.benchmarks)
    except Exception:
        pass
    return attributes


def _record_jobs(span: Any, record: Any) -> None:
    if record is None or not span.is_recording():  # a dry run returns no record
        return
    try:
        span.set_attribute(attr.SUBMIT_ID, str(record.gym_job_id))
        jobs = list(record.benchmarks)
        span.set_attribute(attr.SUBMIT_SLURM_JOB_IDS, [str(job.job_id) for job in jobs if job.job_id])
        failed = [job for job in jobs if not job.job_id]
        span.set_attribute(attr.SUBMIT_FAILED, len(failed))
        if failed:
            span.set_status(Status(StatusCode.ERROR, f"{len(failed)} of {len(jobs)} sbatch submissions failed"))
            span.set_attribute(attr.ERROR_TYPE, "sbatch")
    except Exception as error:
        warn_once("slurm:record", "gym.submit: could not read the submission record (%r)", error)


def _say_where_traces_go(submission: _Submission, record: Any, config: Any) -> None:
    """With the embedded file default, each job writes into its own job directory, on the
    cluster: said once, per job; and noted beside this process's own files, where
    ``gym-autoinstr view`` of this process's directory follows it (``runs.submitted_jobs``)."""
    written = submission.trace_dirs
    if not written:  # an exporter is configured (the jobs' traces go where this process's go), or none traced
        return
    if record is None:  # a dry run
        hostname = getattr(next(iter(config.compute.values()), None), "hostname", None)
        jobs = [{"benchmark": name, "traces": str(directory)} for name, directory in written.items()]
    else:
        hostname = record.hostname
        jobs = [
            {"benchmark": str(job.benchmark), "slurm_job_id": str(job.job_id), "traces": str(written[job.benchmark])}
            for job in record.benchmarks
            if job.job_id and getattr(job, "benchmark", None) in written  # a failed sbatch has no job
        ]
    if not jobs:
        return
    listed = "; ".join(
        f"{job['benchmark']} (Slurm job {job['slurm_job_id']}): {job['traces']}"
        if "slurm_job_id" in job
        else f"{job['benchmark']}: {job['traces']}"
        for job in jobs
    )
    on = f" on {hostname}" if hostname else ""
    how = "Read a job's with `gym-autoinstr view <its directory>`"
    here = _own_run_directory()
    if record is not None and here is not None:
        runs.record_submission(here, str(record.gym_job_id), hostname, jobs)
        if hostname:
            how += (
                f"; `gym-autoinstr view {_shown_path(here)}` shows this submission and says where its jobs' "
                f"traces are on {hostname}"
            )
        else:
            how += f"; `gym-autoinstr view {_shown_path(here)}` shows this submission with its jobs once they ran"
    logger.info(
        "the Slurm jobs %s their traces into their job directories%s: %s. %s.",
        "would write" if record is None else "write",
        on,
        listed,
        how,
    )


def _own_run_directory() -> Path | None:
    """Where this process writes its own embedded files; None when it writes none."""
    if not files.embedded_default_applies():
        return None
    directory = settings.OUTPUT_DIR.raw()
    return Path(directory) if directory else None


def _shown_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def sbatch_script_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> str:
    """``build_sbatch_script(config, benchmark_name, benchmark, compute, remote_bench_dir)``:
    the script, its driver command carrying what the job needs to be traced."""
    script = wrapped(*args, **kwargs)
    try:
        return _carry(script, *_bind(args, kwargs))
    except Exception as error:
        warn_once(
            "slurm:script",
            "gym-autoinstr could not prepare the Slurm job to be traced (%r); it is submitted as Gym wrote it.",
            error,
        )
        return script


def _bind(args: tuple, kwargs: dict) -> tuple[Any, str, Path]:
    names = ("config", "benchmark_name", "benchmark", "compute", "remote_bench_dir")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound["config"], str(bound["benchmark_name"]), Path(bound["remote_bench_dir"])


def _carry(script: str, config: Any, benchmark_name: str, job_dir: Path) -> str:
    if _GYM_CMD not in script:
        warn_once(
            f"slurm:command:{benchmark_name}",
            "gym-autoinstr: benchmark %r runs its own command, not `gym eval run`, so its Slurm job is not "
            "traced. Fix: start the command under opentelemetry-instrument in the benchmark's `command`.",
            benchmark_name,
        )
        return script
    carried = job_settings(config, job_dir)
    submission = _submitting.get()
    if submission is not None and settings.OUTPUT_DIR.name in carried:  # the embedded file default, in the job
        submission.trace_dirs[benchmark_name] = Path(carried[settings.OUTPUT_DIR.name])
    where = "image " + _PRINTABLE.sub("?", str(getattr(config.driver, "container", None) or "none"))
    tokens = ["env", *(f"{name}={value}" for name, value in carried.items())]
    tokens += ["sh", "-c", _GUARD.replace("@WHERE@", where), "gym-autoinstr"]
    prefix = "".join(f"    {shlex.quote(token)}\n" for token in tokens)
    return script.replace(_GYM_CMD, f"GYM_CMD=(\n{prefix}    gym eval run\n", 1)


def _gym_collector_on(config: Any) -> bool:
    otel = getattr(config, "otel", None)
    return bool(getattr(otel, "enabled", False))


def job_settings(config: Any, job_dir: Path, environ: Any = None) -> dict[str, str]:
    """What a job's driver is started with: this process's settings that hold on a compute
    node, where its telemetry goes, and the submission's span context."""
    environ = os.environ if environ is None else environ
    carried: dict[str, str] = {}
    for name in sorted(environ):
        if name.startswith(settings.PREFIX) and name in settings.ALL and name not in _NOT_CARRIED:
            carried[name] = environ[name]
    for setting in _CARRIED_OTEL:
        if distro.set_by_user(setting.name, environ):  # our distro's defaults are the job's own to set
            carried[setting.name] = environ[setting.name]
    secrets = sorted(name for name in environ if _SECRET.match(name) and environ[name])
    if _gym_collector_on(config):
        port = _collector_port()
        carried[settings.OTLP_ENDPOINT.name] = f"http://localhost:{port}"
        carried[settings.OTLP_PROTOCOL.name] = "http/protobuf"
    else:
        for setting in _DESTINATION:
            if environ.get(setting.name):
                carried[setting.name] = environ[setting.name]
        if files.embedded_default_applies(environ):
            carried[settings.OUTPUT_DIR.name] = str(job_dir / JOB_OUTPUT_SUBDIR)
        if secrets:
            warn_once(
                "slurm:secrets",
                "gym-autoinstr: %s is not written into the Slurm job script (it may hold credentials); the job "
                "has it only if its environment carries it (a local submit with sbatch's default --export=ALL). "
                "Over SSH, pass it yourself: driver.env: {%s: host:%s} (Gym writes it into job.sh, readable by "
                "you alone); under SBATCH_EXPORT=NONE not even driver.env reaches the driver: set it in the "
                "driver image's environment.",
                ", ".join(secrets),
                secrets[0],
                secrets[0],
            )
    submission = _submitting.get()
    span = None if submission is None else submission.span
    if span is not None:
        context = span.get_span_context()
        if context.is_valid:
            carried[settings.SUBMIT_TRACEPARENT.name] = traceparent(context)
    return carried


def _collector_port() -> int:
    try:
        from nemo_gym.orchestration.executors import otel

        return int(otel.OTLP_HTTP_PORT)
    except Exception:
        return GYM_COLLECTOR_HTTP_PORT
