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

    def take(section_and_problems: tuple[Any, list]) -> Any:
        section, found = section_and_problems
        problems.extend(found)
        return section

    sections: dict[str, Any] = {"startup": start, "command_line": take(command_line())}
    exporter_rows = sections["exporters"] = take(exporters(effective, start["configurator"]["selected"]))
    sections["metric_exporters"] = take(signal_exporters(effective, "metrics"))
    sections["log_exporters"] = take(signal_exporters(effective, "logs"))
    if not offline:
        step("sending an empty export to the endpoint")
    sections["pipeline"] = take(pipeline(effective, exporter_rows, offline=offline))
    sections["span_groups"] = take(span_groups(effective))
    sections["job_trace"] = take(job_trace(effective))
    sections["client_spans"] = take(client_spans(effective))
    step("checking Gym's own telemetry, server venvs and Ray")
    sections["native_telemetry"] = take(native_telemetry(report))
    sections["server_venvs"] = take(server_venvs(report))
    sections["ray"] = take(ray_propagation(effective, report, sections["span_groups"]["enabled"]))
    sections["settings"] = take(variables(environ))
    sections["fast_path"] = take(fast_path(environ))
    sections["last_run"] = take(last_run(environ))

    return {
        "ok": not any(p.severity == ERROR for p in problems),
        "gym_autoinstr": __version__,
        "python": sys.version.split()[0],
        "gym": gym,
        "pointcuts": report,
        "process_patches": process_rows,
        **sections,
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
