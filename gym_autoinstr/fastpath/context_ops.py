"""Fast context operations: what ``opentelemetry.context`` and ``trace.use_span`` do on
every request (the current context, attach, a span set in a context, a ``SpanContext``
made), straight on the default runtime's ContextVar and the API's own layouts, each
checked once against the API (``parts.py``); the API's functions otherwise."""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from gym_autoinstr.fastpath import contract
from gym_autoinstr.fastpath.contract import SPAN_KEY as _SPAN_KEY  # None when absent


def _runtime_var() -> contextvars.ContextVar | None:
    """The ContextVar behind ``opentelemetry.context`` when the runtime context is the
    API's default one (``contextvars``); None for any other (``OTEL_PYTHON_CONTEXT``), or
    with the context part off (``contract.py``)."""
    if not contract.part_on(contract.CONTEXT):
        return None
    try:
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    except ImportError:  # pragma: no cover
        return None
    runtime = contract.RUNTIME_CONTEXT
    var = getattr(runtime, contract.RUNTIME_CONTEXT_VAR, None)
    return var if type(runtime) is ContextVarsRuntimeContext and isinstance(var, contextvars.ContextVar) else None


# ``current_context`` and ``attach``: what ``opentelemetry.context``'s ``get_current`` and
# ``attach`` do, for the paths that call them on every request; with the default runtime
# context, straight on its ContextVar (the API's own functions are two Python frames each).
_RUNTIME_VAR = _runtime_var()
if _RUNTIME_VAR is not None:
    current_context = _RUNTIME_VAR.get
    attach = _RUNTIME_VAR.set
else:  # pragma: no cover
    current_context = otel_context.get_current
    attach = otel_context.attach

# The per-request paths (ingress, seams, calls) keep the context that was current, not a
# token: ``previous = current_context(); attach(context)`` (or ``enter``/``enter_seam``
# below, which return it), then ``leave(previous)`` sets it back.  That context is alive
# anyway (the state the attach replaced held it); a token would be a new object, held by
# the request's coroutine for as long as the request runs: long enough, in a busy server,
# for the young collections to carry it into the oldest generation, whose collections
# walk it.
leave = attach


def swap(context: otel_context.Context) -> otel_context.Context:
    """Attach ``context``; returns the context ``leave`` restores."""
    previous = current_context()
    attach(context)
    return previous


def _span_layout() -> bool:
    """Whether the API keeps a context's span under ``_SPAN_KEY`` in a plain-dict
    ``Context`` (checked once, against ``set_span_in_context``): then ``with_span`` and
    ``enter`` make that context directly, without the API's frames (never with the
    context part off: ``contract.py``)."""
    if not contract.part_on(contract.CONTEXT):
        return False
    try:
        sample = NonRecordingSpan(SpanContext(0x1F, 0x2F, is_remote=False))
        base = otel_context.Context({"k": 1})
        values = dict(base)
        values[_SPAN_KEY] = sample
        made = otel_context.Context(values)
        return (
            _SPAN_KEY is not None
            and made == trace.set_span_in_context(sample, base)
            and trace.get_current_span(made) is sample
            and type(made) is type(trace.set_span_in_context(sample, base))
        )
    except Exception:  # pragma: no cover (another API)
        return False


def _with_span_by_layout() -> Any:
    """``with_span(span, context)``: ``trace.set_span_in_context(span, context)``, for a
    given context (the ingress's server span over its caller's context; over an empty
    one, ``context_of_span``)."""
    if not _span_layout():  # pragma: no cover
        return trace.set_span_in_context
    new, key = otel_context.Context, _SPAN_KEY

    def with_span(span: Any, context: otel_context.Context) -> otel_context.Context:
        values = context.copy()
        values[key] = span
        return new(values)

    return with_span


def _entering_by_layout() -> Any:
    """``enter(span)``: what ``trace.use_span(span)`` does on entry (the current context
    with ``span`` set in it, attached), without the generator-based context manager's
    frames; returns what ``leave`` restores."""
    if not _span_layout() or _RUNTIME_VAR is None:  # pragma: no cover
        return lambda span: swap(trace.set_span_in_context(span))
    new, key, get, set_ = otel_context.Context, _SPAN_KEY, _RUNTIME_VAR.get, _RUNTIME_VAR.set

    def enter(span: Any) -> Any:
        previous = get()
        values = previous.copy()
        values[key] = span
        set_(new(values))
        return previous

    return enter


# The key under which a recorded seam's span is also kept in the context it makes current
# (``advice/routes.py``: the span ``rollout_context`` tags, found by calls made inside the
# handler); one attach for both, instead of a ContextVar of its own set and reset.
SEAM_KEY = otel_context.create_key("gym_autoinstr.open_seam")


def _entering_seam_by_layout() -> Any:
    """``enter_seam(span)``: ``enter(span)`` with ``span`` also under ``SEAM_KEY``."""
    if not _span_layout() or _RUNTIME_VAR is None:  # pragma: no cover
        return lambda span: swap(otel_context.set_value(SEAM_KEY, span, trace.set_span_in_context(span)))
    new, key, seam, get, set_ = otel_context.Context, _SPAN_KEY, SEAM_KEY, _RUNTIME_VAR.get, _RUNTIME_VAR.set

    def enter_seam(span: Any) -> Any:
        previous = get()
        values = previous.copy()
        values[key] = span
        values[seam] = span
        set_(new(values))
        return previous

    return enter_seam


# For a span set over a given context, not attached (the ingress attaches its own).
with_span = _with_span_by_layout()

# For the spans our advice makes current around Gym's work (seams, calls): what it returns
# goes to ``leave`` in a ``finally``.  ``use_span(..., record_exception=False,
# set_status_on_exception=False)``, which this replaces, did nothing else.
enter = _entering_by_layout()
enter_seam = _entering_seam_by_layout()


# Every value of a traceparent's flags byte, one shared TraceFlags each (an int with an
# instance dict: an object the GC tracks, held by every context read from a caller).
TRACE_FLAGS = tuple(TraceFlags(value) for value in range(256))
_MAX_TRACE_ID = (1 << 128) - 1
_MAX_SPAN_ID = (1 << 64) - 1


def _span_context_by_constructor(
    trace_id: int, span_id: int, is_remote: bool, trace_flags: TraceFlags, trace_state: TraceState | None = None
) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=is_remote, trace_flags=trace_flags, trace_state=trace_state)


def _span_context_by_layout() -> Any:
    """``SpanContext(trace_id, span_id, is_remote, trace_flags, trace_state)`` made as the
    API's own ``__new__`` makes it (a tuple of the five fields and whether the ids are
    valid), without its Python frame: only when this API's SpanContext is laid out so
    (checked here, once, against its constructor), else the constructor itself."""
    try:
        from opentelemetry.trace.span import DEFAULT_TRACE_STATE

        def fields(made: Any) -> tuple:
            return (
                tuple(made),
                made.trace_id,
                made.span_id,
                made.is_remote,
                made.trace_flags,
                made.trace_state,
                made.is_valid,
                type(made),
            )

        state = TraceState([("k", "v")])
        samples = [  # (the constructor's arguments, the tuple it should hold)
            (
                (0x1F, 0x2F, True, TRACE_FLAGS[0], None),
                (0x1F, 0x2F, True, TRACE_FLAGS[0], DEFAULT_TRACE_STATE, True),
            ),
            ((0x1F, 0, False, TraceFlags(1), state), (0x1F, 0, False, TraceFlags(1), state, False)),
        ]
        same = all(
            fields(SpanContext(t, s, is_remote=r, trace_flags=f, trace_state=ts))
            == fields(tuple.__new__(SpanContext, made))
            for (t, s, r, f, ts), made in samples
        )
    except Exception:  # pragma: no cover (another API)
        same = False
    if not same:  # pragma: no cover
        return _span_context_by_constructor
    new = tuple.__new__

    def span_context(
        trace_id: int, span_id: int, is_remote: bool, trace_flags: TraceFlags, trace_state: TraceState | None = None
    ) -> SpanContext:
        return new(
            SpanContext,
            (
                trace_id,
                span_id,
                is_remote,
                trace_flags,
                DEFAULT_TRACE_STATE if trace_state is None else trace_state,
                0 < trace_id <= _MAX_TRACE_ID and 0 < span_id <= _MAX_SPAN_ID,
            ),
        )

    return span_context


# ``SpanContext(...)`` (positional, ``trace_flags`` a ``TraceFlags``) for the paths that make
# one per request: a caller's context read here, a span the lean tracer starts.
span_context = _span_context_by_layout()
# Whether a SpanContext of this API is that tuple (trace_id, span_id, is_remote,
# trace_flags, trace_state, is_valid): its fields can then be read by unpacking it.
SPAN_CONTEXT_IS_TUPLE = span_context is not _span_context_by_constructor


def _context_of_span_by_layout() -> Any:
    """``trace.set_span_in_context(span, Context())``: a new context holding only ``span``
    (a dropped caller's or root's), made directly under the layout ``_span_layout``
    checked."""
    if not _span_layout():  # pragma: no cover
        return lambda span: trace.set_span_in_context(span, otel_context.Context())
    new, key = otel_context.Context, _SPAN_KEY
    return lambda span: new({key: span})


context_of_span = _context_of_span_by_layout()
