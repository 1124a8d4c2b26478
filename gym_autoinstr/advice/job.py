"""The job span: one ``gym.job`` around a whole rollout collection run.

``RolloutCollectionHelper.run_from_config`` is the driver behind ``ng_collect_rollouts``
and ``gym eval`` in every release (an ``async`` method since 0.2.0).  It creates each
rollout's task inside itself, so every rollout's CLIENT span (and, through the
traceparent, the whole rollout) has ``gym.job`` as its parent.  The ``per_rollout``
preset leaves the job group off, so each rollout becomes its own trace.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind

from . import coexistence
from ..pipeline import groups
from ..pipeline.spans import run_in_span, tracer


async def run_from_config_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if groups.JOB not in groups.ENABLED or coexistence.native_telemetry_live():
        return await wrapped(*args, **kwargs)
    span = tracer().start_span("gym.job", kind=SpanKind.INTERNAL)
    return await run_in_span(span, lambda: wrapped(*args, **kwargs), label="gym.job")
