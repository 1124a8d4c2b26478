"""Small helpers every advice shares: the tracer, and how errors are recorded.

Exception messages are a known leak path (a validation error quotes the request body,
an upstream error quotes the prompt), so spans record the exception *type* only:
``error.type`` and an ERROR status whose description is the type name.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from gym_autoinstr.attributes import ERROR_TYPE
from gym_autoinstr.fastpath import context_ops
from gym_autoinstr.fastpath.contract import ACTIVE_SPAN_PROCESSOR, SPAN_PROCESSORS, TRACER_PROVIDER_GLOBAL
from gym_autoinstr.version import __version__

TRACER_NAME = "gym_autoinstr"

# When this process reached each start-up stage (time_ns): the configurator marks
# "configured", the ingress "run_webserver"; advice/startup.py turns them into spans.
STARTUP_MARKS: dict[str, int] = {}


def mark_startup(stage: str) -> None:
    import time

    STARTUP_MARKS.setdefault(stage, time.time_ns())


_tracer: trace.Tracer | None = None
_tracer_provider: object = None
_tracer_processors: object = None


def tracer() -> trace.Tracer:
    """The package's tracer, re-made only when the global provider or its span processors
    change: lean spans (``lean.py``) when the pipeline behind it is ours alone."""
    global _tracer, _tracer_provider, _tracer_processors
    # the API's global when set (get_tracer_provider() is two Python calls), else its getter
    provider = getattr(trace, TRACER_PROVIDER_GLOBAL, None) or trace.get_tracer_provider()
    active = getattr(provider, ACTIVE_SPAN_PROCESSOR, None)
    processors = getattr(active, SPAN_PROCESSORS, None)
    if _tracer is None or provider is not _tracer_provider or processors is not _tracer_processors:
        sdk_tracer = provider.get_tracer(TRACER_NAME, __version__)
        lean_tracer = None
        if processors:
            try:
                from gym_autoinstr.fastpath.lean import lean_tracer_for

                lean_tracer = lean_tracer_for(provider, sdk_tracer)
            except Exception:  # never worse than the SDK's own tracer
                lean_tracer = None
        _tracer = lean_tracer or sdk_tracer
        _tracer_provider = provider
        _tracer_processors = processors
    return _tracer


def tracer_in_use() -> trace.Tracer:
    """The tracer ``tracer()`` last handed out (made now if there is none yet), without
    looking at the provider again: for the dropped path, which only reads its sampler.
    Every span start goes through ``tracer()``, which re-makes it when the provider or
    its processors change."""
    return _tracer if _tracer is not None else tracer()


def error_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def mark_error(span: trace.Span, error: BaseException) -> None:
    """Record that ``error`` ended the span's work, without its message."""
    name = error_type(error)
    span.set_attribute(ERROR_TYPE, name)
    span.set_status(Status(StatusCode.ERROR, name))


async def run_in_span(span: trace.Span, call: Any, after: Any = None, label: str = "") -> Any:
    """Await ``call()`` with ``span`` current; errors are marked (type only) and re-raised,
    cancellation ends the span without ERROR, and the span always ends.  ``after(span,
    result)`` may add attributes from the result; if it fails, the result is unaffected."""
    try:
        entered = context_ops.enter(span)
        try:
            result = await call()
        finally:
            context_ops.leave(entered)
        if after is not None:
            try:
                after(span, result)
            except Exception as error:
                from gym_autoinstr._log import warn_once

                warn_once(f"after:{label}", "%s: result not recorded: %r", label, error)
        return result
    except BaseException as error:
        if isinstance(error, Exception):
            mark_error(span, error)
        raise
    finally:
        span.end()
