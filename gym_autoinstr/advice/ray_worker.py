"""Ray tasks and actor methods, the worker's side: a call the carrier's stand-in hands over
(``ray_carrier.stand_in``) runs in a CONSUMER span ``ray.execute <function>``, the submit
span's child, with the time it waited since submission (``ray.task.wait.duration``, s).
The worker gets a tracer provider the first time (``configurator.configure_ray_worker``:
the Gym server whose work it does, ``host.name``, Ray node id).  At the task's end a flush
is *requested*, never waited for: a slow or dead collector costs the task nothing, and a
worker Ray reaps soon after has already handed its spans over.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind

from gym_autoinstr import attributes as attr
from gym_autoinstr._log import warn_once
from gym_autoinstr.advice import ray_actor
from gym_autoinstr.telemetry.spans import mark_error, tracer


def function_name(function: Any) -> str:
    name = getattr(function, "__qualname__", getattr(function, "__name__", "?"))
    return f"{getattr(function, '__module__', '?')}.{name}"


def _runtime_facts() -> dict:
    try:
        import ray

        keys = (attr.RAY_TASK_ID, attr.RAY_NODE_ID, attr.RAY_WORKER_ID, attr.RAY_ACTOR_ID, attr.RAY_JOB_ID)
        return ray_actor.runtime_ids(ray.get_runtime_context(), keys)
    except Exception:
        return {}


def _begin(function: Any, carrier: Any) -> tuple[Any, Any] | None:
    if not isinstance(carrier, dict):
        return None
    from gym_autoinstr.setup import configurator

    facts = _runtime_facts()
    if not configurator.configure_ray_worker(
        str(carrier.get("server") or "unknown"), dict(carrier.get("settings") or {}), facts.get(attr.RAY_NODE_ID)
    ):
        return None
    parent = propagate.extract(carrier.get("context") or {})
    attributes: dict[str, Any] = {
        attr.RAY_TASK_FUNCTION: function_name(function),
        "messaging.system": "ray",
        "messaging.operation.type": "process",
        **facts,
    }
    attributes[attr.PROCESS_PID] = os.getpid()
    submitted = carrier.get("submitted")
    if isinstance(submitted, (int, float)):
        attributes[attr.RAY_TASK_WAIT] = max(0.0, time.time() - float(submitted))
    span = tracer().start_span(
        f"ray.execute {getattr(function, '__qualname__', '?')}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
    current = trace.set_span_in_context(span, parent)
    if carrier.get("rootless"):  # nothing upstream but our own Ray spans
        current = ray_actor.mark_rootless(span, current)
    token = context.attach(current)
    return span, token


@contextlib.contextmanager
def _executing(function: Any, carrier: Any) -> Iterator[None]:
    """The task's call inside its ``ray.execute`` span (untraced when that cannot begin)."""
    try:
        begun = _begin(function, carrier)
    except Exception as error:
        warn_once("ray:execute", "Ray task not traced in this worker: %r", error)
        begun = None
    if begun is None:
        yield
        return
    span, token = begun
    try:
        yield
    except BaseException as error:
        if isinstance(error, Exception):
            mark_error(span, error)
        raise
    finally:
        try:
            context.detach(token)
        except Exception:
            pass
        span.end()
        from gym_autoinstr.setup.flush import request_flush

        request_flush()


def execute(function: Any, args: tuple, kwargs: dict, carrier: Any) -> Any:
    """Run a Gym task in this Ray worker inside a ``ray.execute`` span."""
    with _executing(function, carrier):
        return function(*args, **kwargs)


async def execute_async(function: Any, args: tuple, kwargs: dict, carrier: Any) -> Any:
    with _executing(function, carrier):
        return await function(*args, **kwargs)
