"""The direct W3C path reads and writes exactly what the SDK's propagators do."""

from __future__ import annotations

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from gym_autoinstr.fastpath import context_ops, w3c

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CARRIERS = [
    {},
    {"traceparent": TP},
    {"traceparent": TP, "tracestate": "a=1,b=2"},
    {"traceparent": TP.replace("-01", "-00")},
    {"traceparent": TP.replace("-01", "-03")},
    {"traceparent": " " + TP + "\t"},
    {"traceparent": TP + "-extra"},
    {"traceparent": "01" + TP[2:] + "-extra"},
    {"traceparent": "ff" + TP[2:]},
    {"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"},
    {"traceparent": TP.upper()},
    {"traceparent": "garbage"},
    {"traceparent": TP, "tracestate": "x" * 600},
    {"traceparent": TP, "tracestate": "not a valid = state,,"},
    {"traceparent": TP, "baggage": "k=v"},
]


def _seen(ctx):
    span_context = trace.get_current_span(ctx).get_span_context()
    return (
        span_context.trace_id,
        span_context.span_id,
        span_context.is_remote,
        int(span_context.trace_flags),
        span_context.trace_state.to_header() if span_context.trace_state else "",
        dict(baggage.get_all(ctx)),
    )


@pytest.mark.parametrize("carrier", CARRIERS, ids=[str(i) for i in range(len(CARRIERS))])
def test_extract_matches_the_global_propagator(carrier):
    assert w3c.w3c_default()
    assert _seen(w3c.extract(dict(carrier))) == _seen(propagate.extract(dict(carrier)))


@pytest.mark.parametrize("flags,state", [(1, None), (0, None), (3, TraceState([("v", "1")]))])
def test_inject_matches_the_global_propagator(flags, state):
    span = NonRecordingSpan(
        SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(flags), trace_state=state)
    )
    ours: dict = {}
    w3c.inject_span(span, ours)
    theirs: dict = {}
    propagate.inject(theirs, context=trace.set_span_in_context(span))
    assert ours == theirs and ours["traceparent"].startswith("00-")


def test_baggage_and_other_propagators_take_the_general_path():
    span = NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1)))
    token = context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        carrier: dict = {}
        w3c.inject_span(span, carrier)
        assert carrier["baggage"] == "tenant=t1" and carrier["traceparent"].endswith("-01")
    finally:
        context.detach(token)

    class Custom(CompositePropagator):
        pass

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(Custom([]))
    try:
        assert not w3c.w3c_default()
        carrier = {}
        w3c.inject_span(span, carrier)
        assert carrier == {}  # the configured (empty) propagator decides
        assert not trace.get_current_span(w3c.extract({"traceparent": TP})).get_span_context().is_valid
    finally:
        propagate.set_global_textmap(before)
    assert w3c.w3c_default()


def test_an_unsampled_callers_context_is_read_once_and_reused():
    """A dropped rollout carries one traceparent through every hop: its context is parsed
    once and handed out again (the same answer as the SDK's each time); a sampled one, or
    one with tracestate, is parsed every time."""
    unsampled = {"traceparent": TP.replace("-01", "-00")}
    first, again = w3c.extract(dict(unsampled)), w3c.extract(dict(unsampled))
    assert again is first and _seen(again) == _seen(propagate.extract(dict(unsampled)))
    for carrier in ({"traceparent": TP}, {"traceparent": TP.replace("-01", "-00"), "tracestate": "a=1"}):
        assert w3c.extract(dict(carrier)) is not w3c.extract(dict(carrier))
        assert _seen(w3c.extract(dict(carrier))) == _seen(propagate.extract(dict(carrier)))


def test_an_unsampled_parent_is_written_the_same_every_time():
    one = NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(0)))
    other = NonRecordingSpan(SpanContext(0xABC, 0x123, is_remote=True, trace_flags=TraceFlags(0)))
    for span in (one, other, one, other):
        ours: dict = {}
        w3c.inject_span(span, ours)
        theirs: dict = {}
        propagate.inject(theirs, context=trace.set_span_in_context(span))
        assert ours == theirs


@pytest.mark.parametrize(
    "header",
    [
        TP.replace("-01", "-00"),  # as received, forwarded as received
        " " + TP.replace("-01", "-00") + "\t",  # padded: forwarded as the SDK writes it
        TP.replace("-01", "-02"),  # other flags, unsampled
    ],
)
def test_an_unsampled_callers_context_is_forwarded_as_the_sdk_would_write_it(header):
    """The dropped path sends its caller's context on: what an extracted unsampled context
    is written as (taken from the header it came in, when that already is the canonical
    form) is what the SDK's propagator writes for it, by inject_span and unsampled_headers."""
    parent = w3c.extract({"traceparent": header})
    span = trace.get_current_span(parent)
    theirs: dict = {}
    propagate.inject(theirs, context=parent)
    ours: dict = {}
    w3c.inject_span(span, ours, parent)
    assert ours == theirs == w3c.unsampled_headers(span, parent)
    assert theirs["traceparent"] == header.strip()


def _random_headers(count: int, flags: str = "00") -> list[str]:
    import random

    rng = random.Random(7)
    return [f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-{flags}" for _ in range(count)]


@pytest.mark.parametrize(
    "header",
    [
        *_random_headers(20),
        *_random_headers(10, flags="02"),  # a random trace id: how the SDK writes every root it makes
        f"00-{1:032x}-{1:016x}-00",  # the smallest ids
        f"00-{'f' * 32}-{'f' * 16}-00",  # the largest
        f"00-{'f' * 32}-{'f' * 16}-02",
    ],
)
def test_a_lone_unsampled_traceparent_in_the_sdks_form_is_read_as_the_sdk_reads_it(header):
    """A dropped rollout's first request at each server: its traceparent, read on the short
    path, gives the context the SDK's propagator gives, but for the span id, the request's
    own (local: the SDK's sampler makes its non-recording span so)."""
    read = w3c.unsampled_lone(header, 0xABC)
    theirs = trace.get_current_span(propagate.extract({"traceparent": header})).get_span_context()
    span_context = trace.get_current_span(read).get_span_context()
    assert span_context == SpanContext(theirs.trace_id, 0xABC, False, theirs.trace_flags, theirs.trace_state)
    assert span_context.is_valid and type(span_context) is SpanContext and type(span_context.trace_flags) is TraceFlags


@pytest.mark.parametrize(
    "header",
    [
        *_random_headers(3, flags="01"),  # sampled
        TP.replace("-01", "-03"),  # sampled, random trace id
        TP.replace("-01", "-04"),  # other flags
        TP.replace("-01", "-20"),
        TP.replace("-01", "-00").upper(),  # upper-case hex
        " " + TP.replace("-01", "-00"),  # padded
        TP.replace("-01", "-00") + "-extra",
        "01" + TP.replace("-01", "-00")[2:],  # another version
        "00-" + "0" * 32 + "-b7ad6b7169203331-00",  # all-zero ids
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-00",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-00",  # not hex
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",  # short
        "garbage",
    ],
)
def test_any_other_traceparent_is_left_to_the_general_path(header):
    assert w3c.unsampled_lone(header, 0xABC) is None
    assert _seen(w3c.extract({"traceparent": header})) == _seen(propagate.extract({"traceparent": header}))


@pytest.mark.parametrize(
    "trace_id,span_id,is_remote,flags,state",
    [
        (0xABC, 0xDEF, True, 0, None),
        (0xABC, 0xDEF, False, 1, TraceState([("v", "1")])),
        (0, 0xDEF, False, 1, None),  # invalid ids: made, and not valid
        (0xABC, 0, True, 0, None),
        ((1 << 128) - 1, (1 << 64) - 1, False, 3, None),  # the largest valid ids
        (1 << 128, 5, False, 1, None),  # out of range: not valid
        (5, 1 << 64, False, 1, None),
    ],
)
def test_span_contexts_are_made_as_the_api_makes_them(trace_id, span_id, is_remote, flags, state):
    ours = context_ops.span_context(trace_id, span_id, is_remote, TraceFlags(flags), state)
    theirs = SpanContext(trace_id, span_id, is_remote=is_remote, trace_flags=TraceFlags(flags), trace_state=state)
    fields = ("trace_id", "span_id", "is_remote", "trace_flags", "trace_state", "is_valid")
    assert type(ours) is type(theirs) and ours == theirs
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]


@pytest.mark.parametrize(
    "trace_id,span_id,flags",
    [
        (0xABC, 0xDEF, 0),
        (0xABC, 0xDEF, 1),
        (0xABC, 0xDEF, 2),
        (0xABC, 0xDEF, 0xFF),
        ((1 << 128) - 1, (1 << 64) - 1, 1),
        (1, 1, 0),
    ],
)
def test_traceparent_is_written_as_the_sdk_writes_it(trace_id, span_id, flags):
    span_context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags))
    theirs: dict = {}
    propagate.inject(theirs, context=trace.set_span_in_context(NonRecordingSpan(span_context)))
    assert w3c.traceparent(span_context) == theirs["traceparent"]


def test_traceparent_of_ids_out_of_range_is_formatted_as_before():
    """Ids no W3C header can hold (a custom id generator's): formatted by the format spec,
    as before, never an exception on the request path."""
    span_context = SpanContext(1 << 128, 5, is_remote=False, trace_flags=TraceFlags(1))
    assert w3c.traceparent(span_context) == f"00-{1 << 128:032x}-{5:016x}-01"


def test_with_span_makes_the_context_set_span_in_context_makes():
    """``context_ops.with_span``: a new context with ``span`` in it and everything else of
    the given one (baggage), equal to the API's, the given context left as it was."""
    parent = baggage.set_baggage("tenant", "a", context.Context())
    span = NonRecordingSpan(SpanContext(0x1F, 0x2F, is_remote=False, trace_flags=TraceFlags(1)))
    made = context_ops.with_span(span, parent)
    assert made == trace.set_span_in_context(span, parent)
    assert type(made) is type(trace.set_span_in_context(span, parent))
    assert trace.get_current_span(made) is span and baggage.get_baggage("tenant", made) == "a"
    assert trace.get_current_span(parent) is not span and made is not parent
    empty = context_ops.with_span(span, context.Context())
    assert empty == trace.set_span_in_context(span, context.Context()) and len(empty) == 1


def test_enter_makes_the_span_current_as_use_span_does():
    """``context_ops.enter``: the span current, everything else of the context kept
    (baggage), the same context ``use_span`` makes; ``leave`` restores the one before."""
    outer = context.attach(baggage.set_baggage("tenant", "a"))
    try:
        before = context.get_current()
        span = NonRecordingSpan(SpanContext(0x1F, 0x2F, is_remote=False, trace_flags=TraceFlags(1)))
        token = context_ops.enter(span)
        try:
            inside = context.get_current()
            assert trace.get_current_span() is span
            assert baggage.get_baggage("tenant") == "a"
            with trace.use_span(span):
                assert context.get_current() == inside
        finally:
            context_ops.leave(token)
        assert context.get_current() is before
    finally:
        context.detach(outer)


def test_every_flags_byte_reads_as_the_propagator_reads_it_into_one_shared_value():
    """The flags a caller's traceparent carries, read on our path, equal the SDK
    propagator's for every byte value (sampled bit, random bit, bits not defined yet),
    each value one TraceFlags shared by every context read with it, not one per request."""
    for value in range(256):
        header = f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{value:02x}"
        ours = [
            trace.get_current_span(w3c.extract({"traceparent": header, "tracestate": "k=v"}))
            .get_span_context()
            .trace_flags
            for _ in range(2)
        ]
        theirs = (
            trace.get_current_span(propagate.extract({"traceparent": header, "tracestate": "k=v"}))
            .get_span_context()
            .trace_flags
        )
        assert ours[0] == theirs == value and ours[0].sampled == theirs.sampled == bool(value & 1)
        assert type(ours[0]) is TraceFlags and ours[0] is ours[1]
