"""Small helpers every advice shares: the tracer, and how errors are recorded.

Exception messages are a known leak path (a validation error quotes the request body,
an upstream error quotes the prompt), so spans record the exception *type* only:
``error.type`` and an ERROR status whose description is the type name.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from .version import __version__

TRACER_NAME = "gym_autoinstr"

_tracer: "trace.Tracer | None" = None
_tracer_provider: object = None


def tracer() -> trace.Tracer:
    """The package's tracer, re-fetched only when the global provider changes."""
    global _tracer, _tracer_provider
    provider = trace.get_tracer_provider()
    if _tracer is None or provider is not _tracer_provider:
        _tracer = provider.get_tracer(TRACER_NAME, __version__)
        _tracer_provider = provider
    return _tracer


def error_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def mark_error(span: trace.Span, error: BaseException) -> None:
    """Record that ``error`` ended the span's work, without its message."""
    name = error_type(error)
    span.set_attribute("error.type", name)
    span.set_status(Status(StatusCode.ERROR, name))
