"""W3C Trace Context in and out (``traceparent``, ``tracestate``), without the generic
propagator machinery: when the global propagator is W3C's (with or without W3C Baggage,
whose headers its own propagators read and write), the headers are read and written here
by Level 2's rules (https://www.w3.org/TR/trace-context-2/; every rule, and where the SDK's
propagator differs, is a row of ``tests/fastpath/test_w3c_conformance.py``).  Any other
propagator goes through ``propagate``; so does W3C's with this part off, but for the
``tracestate``, read again here (the SDK's checks keys by Level 1's grammar).  Kept too:
the contexts and headers of unsampled callers, which a dropped rollout reuses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from opentelemetry import baggage as otel_baggage
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceState

from gym_autoinstr.fastpath import contract
from gym_autoinstr.fastpath.context_ops import TRACE_FLAGS, context_of_span, span_context
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

# A rollout the sampler dropped carries an unsampled traceparent through every hop
# (telemetry/sampling.py): the contexts read from such unsampled parents, and, by span
# object, the spans found valid and unsampled with the headers they are written as, are
# kept (bounded; cleared when full) and reused.  A span's context never changes, and
# contexts are never changed in place, so sharing them between requests is safe.  An
# entry keeps its span alive, so an id cannot be reused while it is kept.
_CACHE_MAX = 1024
_extracted: dict[str, otel_context.Context] = {}
unsampled_spans: dict[int, tuple[Any, str, str | None]] = {}


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


# This process's own dropped spans (``sampling.dropped_root``'s, ``sampling.forwarded``'s),
# by the ``traceparent`` their calls carry (and a forwarded one by the one it came with): a
# request with it (the rollout's next one here; a call a server makes to itself, as Gym's
# simple agent posts its own ``/v1/responses`` inside ``/run``) then runs under that span's
# context, found here, instead of one read anew from the header.  The span is local where a
# read one is remote, so only the ingress looks here, and only while the sampler drops every
# child of an unsampled parent, local or remote alike (``sampling.dropping_sampler``).
# Bounded (a forwarded span's two entries, a root's one, per rollout); cleared when full.
_own_roots: dict[str, otel_context.Context] = {}
own_root = _own_roots.get


def keep_own_root(header: str, context: otel_context.Context) -> None:
    if len(_own_roots) >= 2 * _CACHE_MAX:
        _own_roots.clear()
    _own_roots[header] = context


def unsampled_lone(header: str, span_id: int) -> otel_context.Context | None:
    """For a lone traceparent in the form the SDK writes an unsampled context in (flags
    ``00``, or ``02``: a random trace id), the context a request the sampler drops under it
    runs in, as the SDK's sampler makes it: the caller's trace id and flags, ``span_id``
    (W3C: the parent-id sent on is the current operation's), local; None for any other
    header (then ``extract``).  Only while ``w3c_default()`` holds (the ingress checks)."""
    if len(header) != 55 or header[52:] not in _UNSAMPLED_ENDS or _SDK_UNSAMPLED.fullmatch(header) is None:
        return None  # (a sampled caller's header: its flags say so before the pattern is tried)
    trace_id = int(header[3:35], 16)
    if not trace_id or header[36:52] == "0000000000000000":  # (all-zero ids: invalid, the general way)
        return None
    flags = TRACE_FLAGS[0] if header[54] == "0" else TRACE_FLAGS[2]
    return context_of_span(NonRecordingSpan(span_context(trace_id, span_id, False, flags)))


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
    trace_flags = TRACE_FLAGS[flags]
    span = NonRecordingSpan(span_context(trace_id, span_id, True, trace_flags, state))
    context = context_of_span(span)
    if tracestate is None and not flags & 0x01 and type(header) is str:
        if len(_extracted) >= _CACHE_MAX:
            _extracted.clear()
        _extracted[header] = context
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
