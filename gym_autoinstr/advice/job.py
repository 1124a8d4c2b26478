"""The job span, and every rollout of a collection run as a trace of its own.

``RolloutCollectionHelper.run_from_config`` is the driver behind ``ng_collect_rollouts``
and ``gym eval run`` in every release (an ``async`` method since 0.2.0).  It dispatches
each rollout as one ``POST /run`` from inside itself, so without intervention every
rollout would be a child of ``gym.job`` and a job of 16k rollouts one trace.

Shape (``GYM_AUTOINSTR_JOB_TRACE``):

* ``per_rollout`` (default): ``gym.job`` is a trace of its own; each rollout's
  orchestrator CLIENT span (``POST /run``) starts a new root trace, carries a span link
  to ``gym.job`` and ``nemo.gym.job.id``.  A ratio sampler then decides per rollout.
* ``single``: the rollouts stay children of ``gym.job``: one trace id per job.
* an embedder's span: when the caller already has a valid span current at
  ``run_from_config`` (a training loop tracing its steps), ``gym.job`` is its child and the
  rollouts nest under ``gym.job``, all in the caller's trace.  "The caller's span" is
  whatever is current *before* our ``gym.job`` starts; a rollout is only re-rooted when
  the span current at its dispatch is exactly the ``gym.job`` this advice started.

Gym releases up to 0.7.x have no switch of their own for this (0.7.0's native ``gym.job``
always nests), so only ours is read.  ``gym.job`` ends with the counts it saw:
``nemo.gym.job.rollouts.sent`` / ``.failed`` and ``nemo.gym.job.num_repeats``.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
import contextvars
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from . import coexistence
from .._log import warn_once
from ..pipeline import groups
from ..pipeline.spans import run_in_span, tracer

JOB_TRACE_VARIABLE = "GYM_AUTOINSTR_JOB_TRACE"
PER_ROLLOUT = "per_rollout"
SINGLE = "single"
EMBEDDED = "embedded"  # recorded on gym.job when a caller's span parents the job
JOB_TRACE_MODES = (PER_ROLLOUT, SINGLE)

JOB_ID = "nemo.gym.job.id"
JOB_TRACE = "nemo.gym.job.trace"
ROLLOUTS_SENT = "nemo.gym.job.rollouts.sent"
ROLLOUTS_FAILED = "nemo.gym.job.rollouts.failed"
NUM_REPEATS = "nemo.gym.job.num_repeats"


def job_trace_mode(environ: "dict[str, str] | os._Environ[str] | None" = None) -> str:
    """``per_rollout`` or ``single`` from ``GYM_AUTOINSTR_JOB_TRACE``; anything else warns once."""
    environ = os.environ if environ is None else environ
    raw = environ.get(JOB_TRACE_VARIABLE)
    if raw is None or not raw.strip():
        return PER_ROLLOUT
    mode = raw.strip().lower()
    if mode in JOB_TRACE_MODES:
        return mode
    warn_once(
        f"env:{JOB_TRACE_VARIABLE}:{raw}",
        "%s=%r is not one of %s; using %s (each rollout its own trace, linked to gym.job). "
        "Set %s=single for one trace per job.",
        JOB_TRACE_VARIABLE,
        raw,
        ", ".join(JOB_TRACE_MODES),
        PER_ROLLOUT,
        JOB_TRACE_VARIABLE,
    )
    return PER_ROLLOUT


@dataclass
class JobState:
    span: Any
    job_id: str
    reroot: bool  # each rollout its own root trace, linked to the job
    sent: int = 0
    failed: int = 0
    links: list = field(default_factory=list)


_current_job: contextvars.ContextVar["JobState | None"] = contextvars.ContextVar("gym_autoinstr_job", default=None)
_EMPTY = otel_context.Context()


def _num_repeats(args: tuple, kwargs: dict) -> "int | None":
    config = args[0] if args else kwargs.get("config")
    value = getattr(config, "num_repeats", None)
    return value if type(value) is int else None


async def run_from_config_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or coexistence.native_telemetry_live():
        return await wrapped(*args, **kwargs)
    try:
        embedded = trace.get_current_span().get_span_context().is_valid
        mode = EMBEDDED if embedded else job_trace_mode()
        job_id = uuid.uuid4().hex
        attributes: dict[str, Any] = {JOB_ID: job_id, JOB_TRACE: mode}
        repeats = _num_repeats(args, kwargs)
        if repeats is not None:
            attributes[NUM_REPEATS] = repeats
        span = tracer().start_span("gym.job", kind=SpanKind.INTERNAL, attributes=attributes)
        state = JobState(span=span, job_id=job_id, reroot=mode == PER_ROLLOUT)
        if state.reroot:
            state.links = [Link(span.get_span_context())]
    except Exception as error:
        warn_once("job:start", "gym.job skipped (%r); rollout collection is unaffected.", error)
        return await wrapped(*args, **kwargs)
    token = _current_job.set(state)
    try:
        return await run_in_span(span, lambda: wrapped(*args, **kwargs), label="gym.job")
    finally:
        _current_job.reset(token)


def _record_counts(state: JobState) -> None:
    if not state.span.is_recording():  # sampled out, or already ended
        return
    state.span.set_attribute(ROLLOUTS_SENT, state.sent)
    state.span.set_attribute(ROLLOUTS_FAILED, state.failed)


def rollout_dispatch(url_full: str) -> "JobState | None":
    """The job a CLIENT span about to start dispatches a rollout for, if it is one: a
    ``/run`` request made while our own ``gym.job`` is the current span."""
    state = _current_job.get()
    if state is None or trace.get_current_span() is not state.span:
        return None
    if not url_full.rstrip("/").endswith("/run"):
        return None
    state.sent += 1
    _record_counts(state)
    return state


def rollout_span_options(state: JobState) -> dict[str, Any]:
    """``start_span`` keyword arguments for a rollout's root: a new trace linked to the job,
    or (nesting) the default parent."""
    if state.reroot:
        return {"context": _EMPTY, "links": state.links}
    return {}


def rollout_failed(state: JobState) -> None:
    state.failed += 1
    _record_counts(state)
