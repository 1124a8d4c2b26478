"""Which span groups are on, and from which variable; how collection jobs are traced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr.advice import egress, job
from gym_autoinstr.commands.doctor.report import WARNING, Problem
from gym_autoinstr.telemetry import groups


def span_groups(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    """The span groups a Gym process would turn on, read as it reads them (``groups.from_environment``)."""
    found = groups.from_environment(environ)
    problems = []
    if found.problem:
        # the default preset is used: tracing works, not as asked
        problems.append(Problem(WARNING, "span groups", found.problem, found.fix))
    elif not found.enabled:
        problems.append(
            Problem(
                WARNING,
                "span groups",
                f"{found.variable}={found.spec!r} turns every span group off: no span is created",
                f"unset {found.variable} (preset 'default') or name groups: {groups.VALID_NAMES}",
            )
        )
    section = {
        "variable": found.variable,
        "spec": found.spec,
        "enabled": sorted(found.enabled),
        "unknown": list(found.unknown),
    }
    return section, problems


def job_trace(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    """``GYM_AUTOINSTR_JOB_TRACE``: each rollout its own trace (default) or one per job."""
    raw = settings.JOB_TRACE.raw(environ)
    mode, bad = settings.JOB_TRACE.check(environ)
    problems = []
    if bad:
        problems.append(
            Problem(
                WARNING,
                "job trace",
                f"{job.JOB_TRACE_VARIABLE}={raw!r} is not one of {', '.join(job.JOB_TRACE_MODES)}: "
                f"{job.JobTrace.PER_ROLLOUT.value} is used",
                f"unset it (each rollout its own trace, linked to gym.job) or set {job.JOB_TRACE_VARIABLE}=single "
                "(one trace per job)",
            )
        )
        mode = job.JobTrace.PER_ROLLOUT.value
    return {"variable": job.JOB_TRACE_VARIABLE, "value": raw, "mode": mode}, problems


def client_spans(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    """``GYM_AUTOINSTR_CLIENT_SPANS``: a CLIENT span per call (default) or only on failed
    calls between Gym servers (the leaner shape)."""
    raw = settings.CLIENT_SPANS.raw(environ)
    value, bad = settings.CLIENT_SPANS.check(environ)
    problems = []
    if bad:
        problems.append(
            Problem(
                WARNING,
                "client spans",
                f"{egress.CLIENT_SPANS_ENV}={raw!r} is neither 'all' nor 'failures': 'all' is used",
                f"unset it (a CLIENT span per call) or set {egress.CLIENT_SPANS_ENV}=failures (no CLIENT span on a "
                "successful call between two Gym servers of the fleet)",
            )
        )
        value = egress.ClientSpans.ALL.value
    return {"variable": egress.CLIENT_SPANS_ENV, "value": raw, "mode": value}, problems
