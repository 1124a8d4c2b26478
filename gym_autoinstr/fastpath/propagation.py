"""W3C trace context in and out, without the generic propagator machinery when we can.

``propagate.inject``/``extract`` go through the global composite propagator, a getter
and a setter per field and a regular expression; on Gym's request path that is several
µs per hop.  When the global propagator is the default (W3C Trace Context, with or
without W3C Baggage) the same headers are written and read here directly (baggage, when
a caller sends it, by the Baggage propagator itself), by the rules of W3C Trace Context
Level 2 (https://www.w3.org/TR/trace-context-2/), more strictly than the SDK's
propagator (``tests/fastpath/test_w3c_conformance.py`` lists every rule and where the
SDK differs):

- ``traceparent``: version ``00`` exactly 55 characters; a higher version (``01``-``fe``)
  read by its ``00`` prefix, more fields allowed only after a ``-``, its flags other than
  sampled and random-trace-id ignored; version ``ff``, upper-case hex, all-zero ids and
  repeated ``traceparent`` headers invalid; spaces and tabs around it ignored.  Flags
  W3C reserves are sent as zero.
- ``tracestate``: read only with a valid ``traceparent`` and never invalidating it;
  repeated headers combined; spaces and tabs around members ignored, empty members
  skipped; a header that cannot be parsed (a member with an invalid key or value, by
  Level 2's grammar, or more than 32 members) discarded whole, as the W3C test suite asks
  at its strict level (the specification allows dropping the whole header or the bad
  members alone); of a repeated key the left-most member kept (the latest); longer than
  ``MAX_TRACESTATE_LENGTH`` truncated by whole members, those over 128 characters first,
  then from the right, on the way in and on the way out.
Any other propagator configuration (``OTEL_PROPAGATORS=b3``, a custom one) goes through
``propagate`` as before.  So does W3C's with this part off (``GYM_AUTOINSTR_FAST_PATH=off``,
or its check failed), with one correction: the SDK's propagator reads the ``traceparent``,
and the ``tracestate`` is read again here by the rules above (the SDK's checks keys by
Level 1's grammar, so it drops a header with a key Level 2 allows, and drops one with a
repeated key): the same rules either way.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from typing import Any

from opentelemetry import baggage as otel_baggage
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from gym_autoinstr.fastpath import contract
from gym_autoinstr.fastpath.contract import BAGGAGE_KEY as _BAGGAGE_KEY  # None when absent
from gym_autoinstr.fastpath.contract import SPAN_KEY as _SPAN_KEY  # None when absent

# traceparent: version 00 exactly (55 characters); any other version by the same prefix.
_VERSION_00 = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_VERSION_PREFIX = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_OWS = " \t"  # optional whitespace (RFC 9110): around a header, a tracestate member
_KNOWN_FLAGS = 0x03  # sampled, random-trace-id: the flags Level 2 defines; the rest are sent as zero
# tracestate (Level 2): key, value; members, and the length propagated (W3C: at least 512)
_KEY = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}")
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_MAX_MEMBERS = 32
MAX_TRACESTATE_LENGTH = 512
_LONG_MEMBER = 128  # members longer than this are the first truncated
# A tracestate longer than this is not read at all (discarded: a valid one has at most 32
# members of 513 characters, 16,447 with their commas; the rest is room for spaces and
# empty members).
_MAX_TRACESTATE_READ = 32 * 1024
# The form the SDK writes an unsampled context in (version 00, nothing around it), flags
# 00 or, from an SDK that marks random trace ids (W3C level 2; every root ours makes), 02.
_SDK_UNSAMPLED = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[02]")
_UNSAMPLED_ENDS = ("-00", "-02")  # how _SDK_UNSAMPLED's headers end


@dataclass(slots=True)
class _TextmapChecked:
    textmap: Any = None  # the global textmap last checked
    configured: bool = False  # whether it is W3C's (alone or with W3C Baggage)
    w3c: bool = False  # whether it is W3C's and this part is on: read and written here
    baggage: tuple = ()  # its W3C Baggage propagators (when w3c)


_known = _TextmapChecked()

# A rollout the sampler dropped carries one unchanged traceparent through every hop
# (telemetry/sampling.py): the contexts read from such unsampled parents, and, by span
# object, the spans found valid and unsampled with the headers they are written as, are
# kept (bounded; cleared when full) and reused.  A span's context never changes, and
# contexts are never changed in place, so sharing them between requests is safe.  An
# entry keeps its span alive, so an id cannot be reused while it is kept.
_CACHE_MAX = 1024
_extracted: dict[str, otel_context.Context] = {}
unsampled_spans: dict[int, tuple[Any, str, str | None]] = {}


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


# ``current_context``, ``attach`` and ``detach``: what ``opentelemetry.context``'s
# functions of those names do, for the dropped path, which calls them on every hop of
# every rollout the sampler left out; with the default runtime context, straight on its
# ContextVar (the API's own functions are two Python frames each).
_RUNTIME_VAR = _runtime_var()
if _RUNTIME_VAR is not None:
    current_context = _RUNTIME_VAR.get
    attach = _RUNTIME_VAR.set
    # detach without its frame, for the per-request paths: raises where detach logs (a
    # token of another context), and the caller then calls detach
    reset = _RUNTIME_VAR.reset

    def detach(token: Any) -> None:
        try:
            _RUNTIME_VAR.reset(token)
        except Exception:  # as the API's detach: logged there, never raised
            otel_context.detach(token)
else:  # pragma: no cover
    current_context = otel_context.get_current
    attach = otel_context.attach
    detach = reset = otel_context.detach

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
_TRACE_FLAGS = tuple(TraceFlags(value) for value in range(256))
_UNSAMPLED_FLAGS = _TRACE_FLAGS[0]
_UNSAMPLED_RANDOM_FLAGS = _TRACE_FLAGS[2]  # the random-trace-id flag alone
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
                (0x1F, 0x2F, True, _UNSAMPLED_FLAGS, None),
                (0x1F, 0x2F, True, _UNSAMPLED_FLAGS, DEFAULT_TRACE_STATE, True),
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


def _no_baggage(context: otel_context.Context | None = None) -> bool:
    if _BAGGAGE_KEY is None:  # pragma: no cover
        return not otel_baggage.get_all(context)
    return not (otel_context.get_current() if context is None else context).get(_BAGGAGE_KEY)


def w3c_default() -> bool:
    """The global propagator is W3C Trace Context, alone or with W3C Baggage (and the
    W3C part is on: ``contract.py``; else ``propagate`` is used)."""
    textmap = propagate.get_global_textmap()
    if textmap is _known.textmap:
        return _known.w3c
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    inner = (
        getattr(textmap, contract.COMPOSITE_PROPAGATORS, None) if type(textmap) is CompositePropagator else [textmap]
    )
    kinds = [type(p) for p in inner or ()]
    configured = (
        bool(kinds)
        and kinds[0] is TraceContextTextMapPropagator
        and all(k in (TraceContextTextMapPropagator, W3CBaggagePropagator) for k in kinds)
    )
    w3c = configured and contract.part_on(contract.W3C)
    _known.textmap, _known.configured, _known.w3c = textmap, configured, w3c
    _known.baggage = tuple(p for p in inner or () if type(p) is W3CBaggagePropagator) if w3c else ()
    return w3c


_FLAGS_HEX = tuple(f"{flags:02x}" for flags in range(256))


def traceparent(span_context: SpanContext) -> str:
    """The ``traceparent`` the SDK's propagator writes for a valid ``span_context``.  The
    ids through ``bytes.hex`` (a format spec per id costs about twice as much)."""
    try:
        return (
            f"00-{span_context.trace_id.to_bytes(16, 'big').hex()}-{span_context.span_id.to_bytes(8, 'big').hex()}"
            f"-{_FLAGS_HEX[span_context.trace_flags]}"
        )
    except (OverflowError, IndexError, TypeError, AttributeError):  # ids or flags out of range: as the SDK formats
        return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"


# What a flags byte is sent as: the flags W3C reserves (all but sampled and random-trace-id)
# as zero, as it asks.
_SENT_FLAGS_HEX = tuple(f"{flags & _KNOWN_FLAGS:02x}" for flags in range(256))


def sent_traceparent(span_context: SpanContext) -> str:
    """The ``traceparent`` sent for a valid ``span_context``: ``traceparent``'s (the SDK's),
    but for the flags W3C reserves, sent as zero."""
    try:
        return (
            f"00-{span_context.trace_id.to_bytes(16, 'big').hex()}-{span_context.span_id.to_bytes(8, 'big').hex()}"
            f"-{_SENT_FLAGS_HEX[span_context.trace_flags]}"
        )
    except (OverflowError, IndexError, TypeError, AttributeError):  # out of range: as traceparent formats them
        flags = span_context.trace_flags
        flags = flags & _KNOWN_FLAGS if 0 <= flags <= 0xFF else flags
        return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def parse_traceparent(header: Any) -> tuple[int, int, int] | None:
    """(trace id, parent id, flags) of a ``traceparent`` value by W3C Trace Context Level 2,
    or None when it is invalid (then the trace restarts): version ``00`` exactly, any
    higher one but ``ff`` by its prefix (at least 55 characters, more only after a ``-``,
    flags but sampled and random-trace-id ignored); lower-case hex, ids not all zero;
    spaces and tabs around it ignored.  A list or tuple (a carrier's repeated headers) is
    valid only of one value: W3C makes several ``traceparent`` headers invalid."""
    if type(header) is not str:
        if not isinstance(header, (list, tuple)) or len(header) != 1 or type(header[0]) is not str:
            return None
        header = header[0]
    if len(header) != 55 or _VERSION_00.fullmatch(header) is None:
        header = header.strip(_OWS)
        if header[:3] == "00-":
            if len(header) != 55 or _VERSION_00.fullmatch(header) is None:
                return None
        elif _VERSION_PREFIX.match(header) is None or header[:2] == "ff" or (len(header) > 55 and header[55] != "-"):
            return None
        else:  # a higher version: only the flags this one knows
            trace_id, span_id = int(header[3:35], 16), int(header[36:52], 16)
            if not trace_id or not span_id:
                return None
            return trace_id, span_id, int(header[53:55], 16) & _KNOWN_FLAGS
    trace_id, span_id = int(header[3:35], 16), int(header[36:52], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(header[53:55], 16)


def parse_tracestate(value: Any) -> dict[str, str]:
    """The members of a ``tracestate`` value (a list or tuple: repeated headers, combined
    with commas as RFC 9110 does), in order, by W3C Trace Context Level 2: spaces and tabs
    around a member ignored, empty members skipped, of a repeated key the left-most member
    kept (the latest); none at all when the header cannot be parsed (a member whose key or
    value is invalid, more than 32 members, longer than ``_MAX_TRACESTATE_READ``);
    truncated to ``MAX_TRACESTATE_LENGTH`` as ``truncated`` does.  Never raises: anything
    else reads as no members."""
    if type(value) is not str:
        try:
            value = ",".join(value)
        except TypeError:
            return {}
    if len(value) > _MAX_TRACESTATE_READ:
        return {}
    members: dict[str, str] = {}
    count = 0
    for member in value.split(","):
        member = member.strip(_OWS)
        if not member:
            continue
        key, equals, member_value = member.partition("=")
        if not equals or _KEY.fullmatch(key) is None or _VALUE.fullmatch(member_value) is None:
            return {}  # a header that cannot be parsed: discarded whole
        count += 1
        if count > _MAX_MEMBERS:
            return {}
        if key not in members:
            members[key] = member_value
    return truncated(members)


def _header_length(members: dict[str, str]) -> int:
    return sum(len(key) + len(value) for key, value in members.items()) + 2 * len(members) - 1


def truncated(members: dict[str, str]) -> dict[str, str]:
    """``members`` when their header fits in ``MAX_TRACESTATE_LENGTH``; else a copy with
    whole members taken out as W3C asks: those longer than 128 characters first (the
    right-most first), then from the right, until it fits."""
    if _header_length(members) <= MAX_TRACESTATE_LENGTH:
        return members
    kept = dict(members)
    for key, value in reversed(list(members.items())):
        if len(key) + 1 + len(value) > _LONG_MEMBER:
            del kept[key]
            if _header_length(kept) <= MAX_TRACESTATE_LENGTH:
                return kept
    while kept and _header_length(kept) > MAX_TRACESTATE_LENGTH:
        kept.popitem()
    return kept


class W3CTraceState(TraceState):
    """A ``TraceState`` of members read by ``parse_tracestate``: its changes follow W3C
    Trace Context Level 2 too (the API's would check keys by Level 1's grammar, dropping
    the members Level 2 allows, and refuse a 33rd member instead of dropping the
    right-most): a member added or updated goes first (left), and a change that would
    make 33 members drops the right-most."""

    @classmethod
    def of(cls, members: dict[str, str]) -> W3CTraceState:
        """A W3CTraceState holding ``members`` (checked by the caller), not copied; by the
        API's constructor (Level 1's keys only) where TraceState is laid out otherwise."""
        if not _STATE_BY_LAYOUT:  # pragma: no cover (another API)
            return cls(list(members.items()))
        state = cls.__new__(cls)
        setattr(state, contract.TRACESTATE_MEMBERS, members)
        return state

    def add(self, key: str, value: str) -> TraceState:
        if key in self or not valid_member(key, value):
            return self
        return self.update(key, value)

    def update(self, key: str, value: str) -> TraceState:
        if not valid_member(key, value):
            return self
        members = {key: value}
        for other, other_value in self.items():
            if other != key and len(members) < _MAX_MEMBERS:
                members[other] = other_value
        return self.of(members)

    def delete(self, key: str) -> TraceState:
        if key not in self:
            return self
        return self.of({other: value for other, value in self.items() if other != key})


def _state_by_layout() -> bool:
    """Whether a TraceState keeps its members where ``contract.TRACESTATE_MEMBERS`` says (checked once, against the
    API's own methods): then ``W3CTraceState.of`` fills it directly."""
    try:  # (while _STATE_BY_LAYOUT is True, as set before this runs)
        made = W3CTraceState.of({"t@1sys": "a", "k": "v"})
        return (
            made.to_header() == "t@1sys=a,k=v"
            and list(made.items()) == [("t@1sys", "a"), ("k", "v")]
            and made["k"] == "v"
            and len(made) == 2
            and "k" in made
        )
    except Exception:  # pragma: no cover (another API)
        return False


_STATE_BY_LAYOUT = True  # (for the check)
_STATE_BY_LAYOUT = _state_by_layout()


def valid_member(key: Any, value: Any) -> bool:
    """Whether ``key=value`` is a valid tracestate member (W3C Trace Context Level 2)."""
    return (
        type(key) is str
        and type(value) is str
        and _KEY.fullmatch(key) is not None
        and _VALUE.fullmatch(value) is not None
    )


def tracestate_header(trace_state: TraceState) -> str:
    """The ``tracestate`` sent for ``trace_state`` (not empty): its members, in order
    (a changed one first: the TraceState's own order), truncated as ``truncated`` does."""
    header = trace_state.to_header()
    if len(header) <= MAX_TRACESTATE_LENGTH:
        return header
    return ",".join(f"{key}={value}" for key, value in truncated(dict(trace_state.items())).items())


def inject_span(span: Any, carrier: dict, context: otel_context.Context | None = None) -> None:
    """Write ``span``'s context (and the baggage of ``context``, default the current one)
    into ``carrier`` as the global propagator would with ``span`` current."""
    if not w3c_default():
        propagate.inject(carrier, context=trace.set_span_in_context(span, context))
        return
    if not _no_baggage(context):  # the trace context here, the baggage by its propagators
        _inject_trace_context(span, carrier)
        for baggage_propagator in _known.baggage:
            baggage_propagator.inject(carrier, context=trace.set_span_in_context(span, context))
        return
    hit = unsampled_spans.get(id(span))
    if hit is not None and hit[0] is span:  # unsampled, written before
        carrier["traceparent"] = hit[1]
        if hit[2]:
            carrier["tracestate"] = hit[2]
        return
    span_context = span.get_span_context()
    flags = span_context.trace_flags
    if not flags & 0x01:
        # unsampled: the same parent goes out on every call of a dropped rollout
        hit = unsampled_entry(span)
        if hit is not None:
            carrier["traceparent"] = hit[1]
            if hit[2]:
                carrier["tracestate"] = hit[2]
        return
    if not span_context.is_valid:
        return
    carrier["traceparent"] = sent_traceparent(span_context)
    state = span_context.trace_state
    if state:
        header = state.to_header()
        carrier["tracestate"] = header if len(header) <= MAX_TRACESTATE_LENGTH else tracestate_header(state)


def _inject_trace_context(span: Any, carrier: dict) -> None:
    span_context = span.get_span_context()
    if span_context.is_valid:
        carrier["traceparent"] = sent_traceparent(span_context)
        if span_context.trace_state:
            carrier["tracestate"] = tracestate_header(span_context.trace_state)


def unsampled_entry(span: Any) -> tuple[Any, str, str | None] | None:
    """(``span``, its traceparent, its tracestate header or None) when ``span``'s context is
    valid and unsampled, formatted once while kept; else None."""
    hit = unsampled_spans.get(id(span))
    if hit is not None and hit[0] is span:
        return hit
    span_context = span.get_span_context()
    if span_context.trace_flags & 0x01 or not span_context.is_valid:
        return None
    if len(unsampled_spans) >= _CACHE_MAX:
        unsampled_spans.clear()
    header = tracestate_header(span_context.trace_state) if span_context.trace_state else None
    hit = unsampled_spans[id(span)] = (span, sent_traceparent(span_context), header)
    return hit


def unsampled_headers(span: Any, context: otel_context.Context) -> dict[str, str] | None:
    """A new dict of what ``inject_span(span, carrier, context)`` writes, for ``span``
    valid and unsampled (``sampling.dropped_span``'s); None when the global propagator is
    not W3C's or ``context`` has baggage (then ``inject_span`` itself)."""
    if _BAGGAGE_KEY is None or context.get(_BAGGAGE_KEY):
        return None
    textmap = propagate.get_global_textmap()  # w3c_default(), its answer kept
    if not (_known.w3c if textmap is _known.textmap else w3c_default()):
        return None
    hit = unsampled_spans.get(id(span))  # unsampled_entry(), a hit without its frame
    if hit is None or hit[0] is not span:
        hit = unsampled_entry(span)
        if hit is None:
            return None
    return {"traceparent": hit[1], "tracestate": hit[2]} if hit[2] else {"traceparent": hit[1]}


# The context ``extract`` read before from this lone ``traceparent`` (no tracestate) of an
# unsampled caller, while it is kept; else None.  Only while ``w3c_default()`` holds,
# which the caller checks (the ingress, with the header names it reads).
unsampled_context = _extracted.get

# This process's own dropped roots (``sampling.dropped_root``), by the ``traceparent`` their
# calls carry: a call a server makes to itself under such a root (Gym's simple agent posts
# its own ``/v1/responses`` inside ``/run``) then runs under the root's context, found here,
# instead of one read anew from the header.  The root's span is local where a read one is
# remote, so only the ingress looks here, and only while the sampler drops every child of
# an unsampled parent, local or remote alike (``sampling.dropping_sampler``).  Bounded;
# cleared when full.
_own_roots: dict[str, otel_context.Context] = {}
own_root = _own_roots.get


def keep_own_root(header: str, context: otel_context.Context) -> None:
    if len(_own_roots) >= _CACHE_MAX:
        _own_roots.clear()
    _own_roots[header] = context


def unsampled_lone(header: str) -> otel_context.Context | None:
    """``extract({"traceparent": header})`` for a lone traceparent in the form the SDK
    writes an unsampled context in (``00-<trace id>-<span id>-00``, or ``-02`` when its
    trace id is marked random, as the SDK marks every root it makes from random ids),
    kept as ``extract`` keeps it; None for any other header (then ``extract`` itself).  What every server
    reads once per rollout the sampler dropped (each is a new trace id), the parse and
    the objects made without the general path's frames.  Only while ``w3c_default()``
    holds, which the caller checks (the ingress, with the header names it reads)."""
    if len(header) != 55 or header[52:] not in _UNSAMPLED_ENDS or _SDK_UNSAMPLED.fullmatch(header) is None:
        return None  # (a sampled caller's header: its flags say so before the pattern is tried)
    trace_id, span_id = int(header[3:35], 16), int(header[36:52], 16)
    if not trace_id or not span_id:  # (all-zero ids: an invalid context, the general way)
        return None
    flags = _UNSAMPLED_FLAGS if header[54] == "0" else _UNSAMPLED_RANDOM_FLAGS
    span = NonRecordingSpan(span_context(trace_id, span_id, True, flags))
    context = context_of_span(span)
    if len(_extracted) >= _CACHE_MAX:
        _extracted.clear()
    _extracted[header] = context
    return context


def sampled_caller(context: otel_context.Context) -> bool:
    """Whether ``context`` holds a caller's span as ``extract`` makes it (a
    ``NonRecordingSpan``) whose context is sampled: the traced request's usual case, which
    no dropped-parent check needs to look at."""
    span = context.get(_SPAN_KEY) if _SPAN_KEY is not None else None
    return type(span) is NonRecordingSpan and bool(span.get_span_context().trace_flags & 0x01)


def extract(carrier: dict) -> otel_context.Context:
    """A context holding the caller's span context read from ``carrier`` (header names in
    lower case; a value a string, or a list of a repeated header's values) by W3C Trace
    Context Level 2 (``parse_traceparent``, ``parse_tracestate``), with its baggage read by
    the global propagator's W3C Baggage propagator (an unsampled caller's without
    tracestate or baggage may be a context handed out before: contexts are never changed
    in place)."""
    if not w3c_default():
        return _extract_stock(carrier)
    if "baggage" in carrier:
        context = extract({name: value for name, value in carrier.items() if name != "baggage"})
        for baggage_propagator in _known.baggage:
            context = baggage_propagator.extract(carrier, context)
        return context
    header = carrier.get("traceparent")
    if not header:
        return otel_context.Context()
    tracestate = carrier.get("tracestate")
    if tracestate is None:
        try:
            known = _extracted.get(header)
        except TypeError:  # (a list: repeated headers)
            known = None
        if known is not None:
            return known
    if type(header) is str and len(header) == 55 and _VERSION_00.fullmatch(header) is not None:
        # the usual header: version 00, nothing around it
        trace_id, span_id, flags = int(header[3:35], 16), int(header[36:52], 16), int(header[53:55], 16)
        if not trace_id or not span_id:
            return otel_context.Context()
    else:
        parsed = parse_traceparent(header)
        if parsed is None:
            return otel_context.Context()
        trace_id, span_id, flags = parsed
    state = None
    if tracestate is not None:
        members = parse_tracestate(tracestate)
        if members:
            state = W3CTraceState.of(members)
    trace_flags = _TRACE_FLAGS[flags]
    span = NonRecordingSpan(span_context(trace_id, span_id, True, trace_flags, state))
    context = context_of_span(span)
    if tracestate is None and not flags & 0x01 and type(header) is str:
        if len(_extracted) >= _CACHE_MAX:
            _extracted.clear()
        _extracted[header] = context
        if len(header) == 55 and header[:2] == "00" and not flags & ~_KNOWN_FLAGS:
            # already the traceparent this unsampled context is sent on with (the dropped
            # path forwards its caller's context): unsampled_entry's, without formatting
            if len(unsampled_spans) >= _CACHE_MAX:
                unsampled_spans.clear()
            unsampled_spans[id(span)] = (span, header, None)
    return context


def _extract_stock(carrier: dict) -> otel_context.Context:
    """``propagate.extract(carrier)``, with the caller's ``tracestate`` read again by
    ``parse_tracestate`` when the global propagator is W3C's (this part off): the SDK's
    propagator checks keys by Level 1's grammar and drops a header with a repeated key,
    where Level 2 (and the W3C test suite) keep it.  Its ``traceparent`` is the SDK's."""
    context = propagate.extract(carrier)
    tracestate = carrier.get("tracestate")
    if tracestate is None or not _known.configured:  # (w3c_default() looked, just before)
        return context
    span_context = trace.get_current_span(context).get_span_context()
    if not span_context.is_valid or not span_context.is_remote:
        return context
    members = parse_tracestate(tracestate)
    state = W3CTraceState.of(members) if members else None
    read = SpanContext(
        span_context.trace_id,
        span_context.span_id,
        is_remote=True,
        trace_flags=span_context.trace_flags,
        trace_state=state,
    )
    return trace.set_span_in_context(NonRecordingSpan(read), context)
