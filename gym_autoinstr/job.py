"""The job span: one ``gym.job`` around a whole rollout collection run.

``RolloutCollectionHelper.run_from_config`` is the driver behind ``ng_collect_rollouts``
and ``gym eval`` in every release (an ``async`` method since 0.2.0).  It creates each
rollout's task inside itself, so every rollout's CLIENT span (and, through the
traceparent, the whole rollout) has ``gym.job`` as its parent.  The ``per_rollout``
preset leaves the job group off, so each rollout becomes its own trace.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from . import coexistence, groups
from .spans import mark_error, tracer


async def run_from_config_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or coexistence.native_telemetry_live():
        return await wrapped(*args, **kwargs)
    span = tracer().start_span("gym.job", kind=SpanKind.INTERNAL)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            return await wrapped(*args, **kwargs)
    except BaseException as error:
        if isinstance(error, Exception):
            mark_error(span, error)
        raise
    finally:
        span.end()
