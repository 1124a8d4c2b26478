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

``RolloutCollectionHelper.run_examples`` (0.4.0+), the lower-level entry an embedder
calls itself (NeMo RL's ``NemoGym`` actor), gets a ``gym.job`` of its own per call under
the same rules (``nemo.gym.job.entry`` says which entry opened the job); inside
``run_from_config``'s job it opens none.  In a Ray actor, the ``ray.execute`` span of our
own actor-method propagation is not an embedder's span: when nothing but our Ray spans
is upstream of it (``ray_actor.rootless_call``), ``gym.job`` starts a trace of its own
with a span link to that ``ray.execute``, and the rollouts follow the mode as above.
Anything else upstream (a span the driver opened, carried by our propagation or by the
embedder's own carrier; a span opened in the actor) is an embedder's.

A Slurm job queued by a traced ``gym eval submit`` (``advice/slurm.py``): ``gym.job``
also carries a span link to that ``gym.submit``.

Gym releases up to 0.7.x have no switch of their own for this (0.7.0's native ``gym.job``
always nests), so only ours is read.  ``gym.job`` ends with the counts it saw:
``nemo.gym.job.rollouts.sent`` / ``.failed`` and ``nemo.gym.job.num_repeats``.

The job's size, ``nemo.gym.job.rollouts.expected`` (rows x repeats, what the job will
dispatch), when the driver makes it known: the rows ``run_examples`` is handed (every
release's embedders; Gym's own driver up to 0.5.x calls it with every row it will send),
else (0.6+, whose driver dispatches through a private helper) the lines of the
materialized input file Gym writes, one per rollout, before its first dispatch, counted
at that dispatch on a thread of ours.  A job resumed from Gym's cache has no size.  A
span is written only once it ends, so a live reader (``gym-autoinstr view --follow``)
could not see the size before the job's end: when this process writes a run directory
(``GYM_AUTOINSTR_OUTPUT_DIR``), each job also leaves a note there, ``job-<job id>.json``
(``job_id``, ``expected``, ``started``, ``pid``), at its start and again once its size is
known, each time whole (``setup/runs.py``).  Neither ever raises into Gym.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.advice import coexistence, ray_actor
from gym_autoinstr.advice.guard import guarded_advice
from gym_autoinstr.fastpath.w3c import parse_traceparent
from gym_autoinstr.telemetry import groups
from gym_autoinstr.telemetry.spans import mark_error, run_in_span, tracer

JOB_TRACE_VARIABLE = settings.JOB_TRACE.name


class JobTrace(str, enum.Enum):
    """How a job's rollouts are traced; its value is ``nemo.gym.job.trace``."""

    PER_ROLLOUT = "per_rollout"  # the default: each rollout a root trace, linked to gym.job
    SINGLE = "single"  # the rollouts nest under gym.job
    EMBEDDED = "embedded"  # never set: a caller's span parents the job, the rollouts nest

    def __str__(self) -> str:
        return self.value


# What GYM_AUTOINSTR_JOB_TRACE may name, the default first.
JOB_TRACE_MODES = (JobTrace.PER_ROLLOUT.value, JobTrace.SINGLE.value)

JOB_NOTE_PREFIX = "job-"  # job-<job id>.json in the run directory


def job_trace_mode(environ: dict[str, str] | os._Environ[str] | None = None) -> JobTrace:
    """``per_rollout`` or ``single`` from ``GYM_AUTOINSTR_JOB_TRACE``; anything else warns once."""
    return JobTrace(settings.JOB_TRACE.read(environ))


@dataclass
class JobState:
    span: Any
    job_id: str
    reroot: bool  # each rollout its own root trace, linked to the job
    sent: int = 0
    failed: int = 0
    links: list = field(default_factory=list)
    expected: int | None = None  # rows x repeats, once known
    config: Any = None  # run_from_config's, for the size on 0.6+ (``_size_from_materialized``)
    started: float = field(default_factory=time.time)


_current_job: contextvars.ContextVar[JobState | None] = contextvars.ContextVar("gym_autoinstr_job", default=None)
_EMPTY = otel_context.Context()


def submission(environ: dict[str, str] | os._Environ[str] | None = None) -> SpanContext | None:
    """The ``gym.submit`` span of the ``gym eval submit`` that queued this Slurm job, from
    the driver command's ``GYM_AUTOINSTR_SUBMIT_TRACEPARENT`` (``advice/slurm.py``)."""
    parsed = parse_traceparent(settings.SUBMIT_TRACEPARENT.raw(environ) or "")
    if parsed is None:
        return None
    trace_id, span_id, flags = parsed
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def _num_repeats(args: tuple, kwargs: dict) -> int | None:
    config = args[0] if args else kwargs.get("config")
    value = getattr(config, "num_repeats", None)
    return value if type(value) is int else None


def _open_job(repeats: int | None, entry: str) -> JobState:
    """Start ``gym.job`` under the rules above.  A Ray actor call of ours with nothing
    upstream (``ray_actor.rootless_call``) counts as nothing upstream: the job starts a
    trace of its own, linked to that ``ray.execute`` span."""
    actor_call = ray_actor.rootless_call()
    embedded = actor_call is None and trace.get_current_span().get_span_context().is_valid
    mode = JobTrace.EMBEDDED if embedded else job_trace_mode()
    job_id = uuid.uuid4().hex
    attributes: dict[str, Any] = {attr.JOB_ID: job_id, attr.JOB_TRACE: mode.value, attr.JOB_ENTRY: entry}
    if repeats is not None:
        attributes[attr.JOB_NUM_REPEATS] = repeats
    options: dict[str, Any] = {}
    if actor_call is not None:
        options = {"context": _EMPTY, "links": [Link(actor_call.get_span_context())]}
    submitted = submission()
    if submitted is not None:
        options["links"] = [*options.get("links", ()), Link(submitted)]
    span = tracer().start_span("gym.job", kind=SpanKind.INTERNAL, attributes=attributes, **options)
    state = JobState(span=span, job_id=job_id, reroot=mode is JobTrace.PER_ROLLOUT)
    if state.reroot:
        state.links = [Link(span.get_span_context())]
    return state


async def run_from_config_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or coexistence.native_telemetry_live():
        return await wrapped(*args, **kwargs)
    try:
        state = _open_job(_num_repeats(args, kwargs), "run_from_config")
        state.config = args[0] if args else kwargs.get("config")
        span = state.span
    except Exception as error:
        warn_once("job:start", "gym.job skipped (%r); rollout collection is unaffected.", error)
        return await wrapped(*args, **kwargs)
    note_job(state)
    token = _current_job.set(state)
    try:
        return await run_in_span(span, lambda: wrapped(*args, **kwargs), label="gym.job")
    finally:
        _current_job.reset(token)


def _run_examples(wrapped: Any, prepared: tuple[_ExamplesJob, tuple, dict]) -> Any:
    run, args, kwargs = prepared
    rows = _rows(args, kwargs)
    if rows is None:
        note_job(run.state)
    else:
        learn_size(run.state, rows)
    token = run.enter()
    try:
        iterator = wrapped(*args, **kwargs)
    except BaseException as error:
        run.leave(token)
        if isinstance(error, Exception):
            mark_error(run.state.span, error)
        run.end()
        raise
    run.leave(token)
    return run.iterate(iterator)


@guarded_advice(
    "job:start", "gym.job skipped (%r); rollout collection is unaffected.", group=groups.JOB, then=_run_examples
)
def run_examples_advice(instance: Any, args: tuple, kwargs: dict) -> tuple[_ExamplesJob, tuple, dict] | None:
    """``RolloutCollectionHelper.run_examples``, the entry embedders call themselves (NeMo
    RL's ``NemoGym`` actor): one ``gym.job`` per call, none inside ``run_from_config``'s
    (0.4.0 calls ``run_examples`` from there)."""
    if coexistence.native_telemetry_live():
        return None
    outer = _current_job.get()
    if outer is not None:  # Gym's driver (up to 0.5.x) handing over every row its job sends
        if outer.expected is None and outer.config is not None:
            learn_size(outer, _rows(args, kwargs))
        return None
    return _ExamplesJob(_open_job(None, "run_examples")), args, kwargs


class _ExamplesJob:
    """One ``run_examples`` call's ``gym.job``.  ``run_examples`` returns an iterator of
    awaitables whose rollout tasks start later: 0.4.0 inside the call, 0.7.0 at the first
    ``next`` (or, with ``max_resident_tasks``, when the first awaitable is awaited).  So the
    job is current inside the call, around every ``next`` and around every await of an
    awaitable it yielded.

    It ends once the iterator is done with and every awaitable it yielded is settled.
    Done with: exhausted, raised (the job is marked ERROR with the exception's type),
    closed (Gym's iterator is closed too, where it can be), or dropped, even unstarted
    (a finalizer notices).  Settled: a coroutine awaited to its end (or its error or
    cancellation), or dropped unawaited (a finalizer); a future or task is passed through
    unchanged and settles when it is done.  Several jobs may be open at once, each with
    its own state; the job's context is attached and detached within one step of the
    caller, so jobs never see each other's."""

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.context = trace.set_span_in_context(state.span)
        self.pending: set[object] = set()
        self.generator_ref: Any = None
        self.exhausted = False
        self.ended = False

    def enter(self) -> Any:
        return otel_context.attach(self.context), _current_job.set(self.state)

    def leave(self, token: Any) -> None:
        otel_token, job_token = token
        try:
            _current_job.reset(job_token)
            otel_context.detach(otel_token)
        except Exception:
            pass

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        try:
            _record_counts(self.state)
            self.state.span.end()
            # A Ray actor may be killed without an exit flush: the batch leaves now, and
            # nothing waits for it.
            from gym_autoinstr.setup.flush import request_flush

            request_flush()
        except Exception as error:  # also runs from finalizers: never raise there
            warn_once("job:end", "gym.job not ended cleanly: %r", error)

    def _maybe_end(self) -> None:
        if self.exhausted and not self.pending:
            self.end()

    def done_iterating(self) -> None:
        self.exhausted = True
        self._maybe_end()

    def settle(self, key: object) -> None:
        self.pending.discard(key)
        self._maybe_end()

    def iterate(self, iterator: Any) -> Iterator[Any]:
        generator = self._iterate(iterator)
        # dropped, even before its first next (a generator never started runs no finally)
        self.generator_ref = weakref.ref(generator, lambda _ref: self.done_iterating())
        return generator

    def _iterate(self, iterator: Any) -> Iterator[Any]:
        try:
            while True:
                token = self.enter()
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                except Exception as error:
                    mark_error(self.state.span, error)
                    raise
                finally:
                    self.leave(token)
                yield self._awaited_in_job(item)
        finally:
            close = getattr(iterator, "close", None)  # closed early: Gym's generator closes too
            if callable(close):
                try:
                    close()
                except Exception as error:
                    warn_once("job:close", "closing run_examples' iterator raised %r", error)
            self.done_iterating()

    def _awaited_in_job(self, item: Any) -> Any:
        if not hasattr(item, "__await__"):
            return item
        if asyncio.isfuture(item):  # already running in a task of its own: keep the object
            key = object()
            self.pending.add(key)
            item.add_done_callback(lambda _future: self.settle(key))
            return item
        ref: list[Any] = []

        async def in_job() -> Any:
            token = self.enter()
            try:
                return await item
            finally:
                self.leave(token)
                self.settle(ref[0])

        coroutine = in_job()
        # the pending entry is a weak reference whose callback settles it if the coroutine
        # is dropped unawaited (a coroutine never started runs no finally)
        ref.append(weakref.ref(coroutine, self.settle))
        self.pending.add(ref[0])
        return coroutine


def _record_counts(state: JobState) -> None:
    if not state.span.is_recording():  # sampled out, or already ended
        return
    state.span.set_attribute(attr.JOB_ROLLOUTS_SENT, state.sent)
    state.span.set_attribute(attr.JOB_ROLLOUTS_FAILED, state.failed)


# The job whose gym.job span this task runs under, if any (a bound ContextVar.get: no frame).
current_job = _current_job.get


def dispatching() -> bool:
    """Our ``gym.job`` is the current span: a ``/run`` sent now would be a rollout."""
    state = _current_job.get()
    return state is not None and trace.get_current_span() is state.span


def rollout_dispatch(url_full: str) -> JobState | None:
    """The job a CLIENT span about to start dispatches a rollout for, if it is one: a
    ``/run`` request made while our own ``gym.job`` is the current span."""
    state = _current_job.get()
    if state is None or trace.get_current_span() is not state.span:
        return None
    if not url_full.rstrip("/").endswith("/run"):
        return None
    state.sent += 1
    _record_counts(state)
    if state.sent == 1 and state.expected is None and state.config is not None:
        _size_from_materialized(state)
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


# -- the job's size, on its span and in a note for live readers ------------------------------


def _rows(args: tuple, kwargs: dict) -> int | None:
    """How many rows ``run_examples`` was handed (each one rollout), when they are counted
    without consuming them (a list); None otherwise."""
    examples = args[0] if args else kwargs.get("examples")
    try:
        return len(examples) if isinstance(examples, list | tuple) else None
    except Exception:
        return None


def learn_size(state: JobState, expected: int | None) -> None:
    """The job's size became known: on its span (while it is open) and in its note."""
    if type(expected) is not int or expected < 0 or state.expected is not None:
        return
    state.expected = expected
    try:
        if state.span.is_recording():
            state.span.set_attribute(attr.JOB_ROLLOUTS_EXPECTED, expected)
    except Exception as error:
        logger.debug("gym.job: size not set on the span: %r", error)
    note_job(state)


def note_job(state: JobState, environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """``job-<job id>.json`` in this process's run directory, when it writes one: the job's
    id, size (None until known), start and this process's pid, written whole."""
    try:
        directory = settings.OUTPUT_DIR.raw(environ)
        if not directory:
            return
        from pathlib import Path

        from gym_autoinstr.setup.runs import _write_note

        note = {"job_id": state.job_id, "expected": state.expected, "started": state.started, "pid": os.getpid()}
        _write_note(Path(directory), f"{JOB_NOTE_PREFIX}{state.job_id}.json", note)
    except Exception as error:
        logger.debug("job note of %s not written: %r", getattr(state, "job_id", "?"), error)


def _size_from_materialized(state: JobState) -> None:
    """On 0.6+, whose driver hands its rows to a private helper: the lines of the
    materialized input file Gym wrote before this first dispatch (one per rollout), counted
    on a thread of ours (a large file must not hold up Gym's event loop).  Not for a job
    resumed from Gym's cache (the file holds the rows done before too)."""
    try:
        config = state.config
        if getattr(config, "resume_from_cache", False):
            return
        path = os.fspath(config.materialized_jsonl_fpath)
    except Exception:
        return

    def count() -> None:
        try:
            lines = 0
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    lines += chunk.count(b"\n")
            learn_size(state, lines)
        except Exception as error:
            logger.debug("gym.job: size not read from %s: %r", path, error)

    try:
        threading.Thread(target=count, name="gym-autoinstr-job-size", daemon=True).start()
    except Exception as error:  # interpreter shutting down
        logger.debug("gym.job: size not counted: %r", error)
