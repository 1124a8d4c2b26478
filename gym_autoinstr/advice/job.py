"""The job span: one ``gym.job`` around a whole rollout collection run.

``RolloutCollectionHelper.run_from_config`` is the driver behind ``ng_collect_rollouts``
and ``gym eval`` in every release (an ``async`` method since 0.2.0).  It creates each
rollout's task inside itself, so every rollout's CLIENT span (and, through the
traceparent, the whole rollout) has ``gym.job`` as its parent.  The ``per_rollout``
preset leaves the job group off, so each rollout becomes its own trace.

``RolloutCollectionHelper.run_examples`` is the lower-level entry embedders call
directly (NeMo RL's ``NemoGym`` actor): a plain method that returns an iterator of
awaitables, whose rollout tasks start only when the caller iterates (0.4.0: on the first
``next``; 0.7.0 with ``max_resident_tasks``: when the first awaitable is awaited).  So
its ``gym.job`` is opened at the call and made current around every ``next`` and every
await of a yielded awaitable; it ends when the iterator is exhausted and every awaitable
it yielded has finished (or when the iterator is closed).  Inside ``run_from_config``
(0.4.0 calls ``run_examples``) no second job is opened.
"""

from __future__ import annotations

import contextvars
from typing import Any, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from . import coexistence
from ..pipeline import groups
from ..pipeline.spans import mark_error, run_in_span, tracer

# Set while a gym.job of ours is open in this task: run_examples inside run_from_config
# belongs to that job.
_IN_JOB: contextvars.ContextVar[bool] = contextvars.ContextVar("gym_autoinstr_in_job", default=False)


async def run_from_config_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or coexistence.native_telemetry_live():
        return await wrapped(*args, **kwargs)
    span = tracer().start_span("gym.job", kind=SpanKind.INTERNAL)
    token = _IN_JOB.set(True)
    try:
        return await run_in_span(span, lambda: wrapped(*args, **kwargs), label="gym.job")
    finally:
        _IN_JOB.reset(token)


def run_examples_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or _IN_JOB.get() or coexistence.native_telemetry_live():
        return wrapped(*args, **kwargs)
    try:
        run = _JobRun(tracer().start_span("gym.job", kind=SpanKind.INTERNAL))
    except Exception:  # telemetry never stops the collection
        return wrapped(*args, **kwargs)
    token = run.enter()
    try:
        iterator = wrapped(*args, **kwargs)
    except BaseException as error:
        run.fail(error)
        raise
    finally:
        run.leave(token)
    return run.iterate(iterator)


class _JobRun:
    """One run_examples call's gym.job: current wherever its rollouts are started."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.outstanding = 0
        self.exhausted = False
        self.ended = False

    def enter(self) -> Any:
        return (otel_context.attach(self.context), _IN_JOB.set(True))

    def leave(self, token: Any) -> None:
        otel_token, job_token = token
        try:
            _IN_JOB.reset(job_token)
            otel_context.detach(otel_token)
        except Exception:
            pass

    def fail(self, error: BaseException) -> None:
        try:
            mark_error(self.span, error)
        finally:
            self.end()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.span.end()
            # An embedder's process (a Ray actor) may be killed without an exit flush:
            # the batch leaves now, and nothing waits for it.
            from ..pipeline.flush import request_flush

            request_flush()

    def _maybe_end(self) -> None:
        if self.exhausted and self.outstanding <= 0:
            self.end()

    def iterate(self, iterator: Any) -> Iterator[Any]:
        try:
            while True:
                token = self.enter()
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.leave(token)
                yield self._awaited_in_job(item)
        finally:  # exhausted, closed or collected: the job ends with its last rollout
            self.exhausted = True
            self._maybe_end()

    def _awaited_in_job(self, item: Any) -> Any:
        if not hasattr(item, "__await__"):
            return item
        self.outstanding += 1

        async def in_job() -> Any:
            token = self.enter()
            try:
                return await item
            finally:
                self.leave(token)
                self.outstanding -= 1
                self._maybe_end()

        return in_job()
