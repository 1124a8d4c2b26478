"""``gym-autoinstr doctor``: would this environment trace Gym, and if not, what to change.

We never raise into Gym, so a broken setup shows up as an empty backend rather than an
error.  The doctor asks the questions a user would ask then, in the order a Gym process
meets them under ``opentelemetry-instrument``: which Gym is installed (a release we
know?); does every pointcut resolve on it (found by running the real ``GymInstrumentor``
and importing Gym's modules, the path a Gym server takes); which distro, configurator and
instrumentors the start-up would pick; can the exporter's package be imported; does the
configured OTLP endpoint accept an (empty) export, live, in a few seconds (skipped with
``--offline``); which span groups are on; is Gym's own telemetry live (then we stand down);
did the last run lose spans.  Every problem comes
with its fix, and the exit status is non-zero when tracing would not work.

One module per question (``installation``, ``startup``, ``exporters``, ``pipeline``,
``span_groups``, ``native``, ``venvs``, ``ray``, ``variables``, ``fast_path``, ``last_run``), each returning its
section and its problems; ``report`` renders them and sets the exit status.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from gym_autoinstr.commands.doctor.exporters import exporters, signal_exporters
from gym_autoinstr.commands.doctor.fast_path import fast_path
from gym_autoinstr.commands.doctor.installation import (
    gym_section,
    installed_gym_version,
    is_gym_module,
    pointcut_problems,
    process_patches,
    resolve_pointcuts,
)
from gym_autoinstr.commands.doctor.last_run import last_run
from gym_autoinstr.commands.doctor.native import native_telemetry
from gym_autoinstr.commands.doctor.pipeline import pipeline
from gym_autoinstr.commands.doctor.ray import ray_propagation
from gym_autoinstr.commands.doctor.report import ERROR, exit_status, render
from gym_autoinstr.commands.doctor.span_groups import client_spans, job_trace, span_groups
from gym_autoinstr.commands.doctor.startup import command_line, startup
from gym_autoinstr.commands.doctor.variables import variables
from gym_autoinstr.commands.doctor.venvs import server_venvs

__all__ = ["diagnose", "is_gym_module", "main", "render"]


def diagnose(
    environ: Mapping[str, str] | None = None, *, offline: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Everything the doctor knows, as one JSON-ready dict; ``ok`` is False when tracing
    would not work.  ``progress`` is told, in a few words, what is checked next."""
    environ = dict(os.environ if environ is None else environ)
    step = progress or (lambda _: None)
    step("importing Gym and resolving the pointcuts (a few seconds)")
    from gym_autoinstr.setup.configurator import STATE
    from gym_autoinstr.version import __version__

    version = installed_gym_version()
    gym, problems = gym_section(version)
    report = resolve_pointcuts(version)
    problems += pointcut_problems(version, report)
    process_rows = process_patches()
    step("checking the start-up: distro, configurator, exporters")
    start, effective, found = startup(environ)
    problems += found
    command_section, found = command_line()
    problems += found
    exporter_rows, found = exporters(effective, start["configurator"]["selected"])
    problems += found
    metric_rows, found = signal_exporters(effective, "metrics")
    problems += found
    log_rows, found = signal_exporters(effective, "logs")
    problems += found
    if not offline:
        step("sending an empty export to the endpoint")
    pipeline_section, found = pipeline(effective, exporter_rows, offline=offline)
    problems += found
    group_section, found = span_groups(effective)
    problems += found
    job_section, found = job_trace(effective)
    problems += found
    client_section, found = client_spans(effective)
    problems += found
    step("checking Gym's own telemetry, server venvs and Ray")
    native, found = native_telemetry(report)
    problems += found
    venvs_section, found = server_venvs(report)
    problems += found
    ray_section, found = ray_propagation(effective, report, group_section["enabled"])
    problems += found
    variables_section, found = variables(environ)
    problems += found
    fast_path_section, found = fast_path(environ)
    problems += found
    last_run_section, found = last_run(environ)
    problems += found

    return {
        "ok": not any(p.severity == ERROR for p in problems),
        "gym_autoinstr": __version__,
        "python": sys.version.split()[0],
        "gym": gym,
        "pointcuts": report,
        "process_patches": process_rows,
        "startup": start,
        "command_line": command_section,
        "exporters": exporter_rows,
        "metric_exporters": metric_rows,
        "log_exporters": log_rows,
        "pipeline": pipeline_section,
        "span_groups": group_section,
        "job_trace": job_section,
        "client_spans": client_section,
        "native_telemetry": native,
        "server_venvs": venvs_section,
        "ray": ray_section,
        "settings": variables_section,
        "fast_path": fast_path_section,
        "last_run": last_run_section,
        "this_process": {
            "configured_by": None if STATE.configured_by is None else str(STATE.configured_by),
            "exporters": list(STATE.exporters),
        },
        "problems": [asdict(p) for p in problems],
    }


def _progress_line(text: str) -> None:
    print(f"doctor: {text}...", file=sys.stderr, flush=True)


def main(*, as_json: bool = False, offline: bool = False, verbose: bool = False) -> int:
    # Progress on stderr, and only to a person watching (a terminal): stdout stays the
    # report, or clean JSON with --json.
    try:
        watched = sys.stderr.isatty()
    except (AttributeError, ValueError):
        watched = False
    diagnosis = diagnose(offline=offline, progress=_progress_line if watched else None)
    if as_json:
        print(json.dumps(diagnosis, indent=1, default=str))
    else:
        print(render(diagnosis, verbose=verbose))
    return exit_status(diagnosis)
