"""``wire.py`` writes the same bytes as the SDK's OTLP encoder, span by span and for whole
export requests, across every field and value shape spans can carry."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import (  # noqa: E402
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from gym_autoinstr.fastpath import wire  # noqa: E402


def _provider(resource: dict, schema_url: str = "") -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource, schema_url=schema_url or None))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


REMOTE = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "v1"), ("other", "x=y")]),
)


def _spans() -> list:
    provider, exporter = _provider({"service.name": "nemo-gym/agent", "nemo.gym.run.id": "r1", "n": 3})
    tracer = provider.get_tracer("gym_autoinstr", "1.0")
    other = provider.get_tracer(
        "other.lib", None, schema_url="https://opentelemetry.io/schemas/1.26.0", attributes={"scope.attr": True}
    )
    attributes = {
        "http.request.method": "POST",
        "url.full": "http://127.0.0.1:8000/run",
        "server.port": 8000,
        "ratio": 0.25,
        "nan": math.nan,
        "neg": -7,
        "big": (1 << 63) - 1,
        "small": -(1 << 63),
        "flag": False,
        "yes": True,
        "empty": "",
        "zero": 0,
        "ints": [1, -2, 3],
        "strs": ["a", "", "é"],
        "bools": [True, False],
        "floats": [0.0, -1.5],
        "unicode": "ünïcödé ✓ \U0001f600",
        "long": "x" * 300,
    }
    with tracer.start_as_current_span("HTTP POST", kind=SpanKind.CLIENT, attributes=attributes) as span:
        span.add_event("retry", {"attempt": 2})
        span.add_event("bare")
        span.set_status(Status(StatusCode.ERROR, "builtins.ValueError"))
        with other.start_as_current_span("inner") as inner:
            inner.set_status(Status(StatusCode.OK))
    with tracer.start_as_current_span(
        "POST /run",
        context=set_span_in_context(NonRecordingSpan(REMOTE)),
        kind=SpanKind.SERVER,
        links=[Link(REMOTE, {"nemo.gym.job.id": "j"}), Link(SpanContext(5, 6, is_remote=False))],
    ):
        pass
    for kind in SpanKind:
        tracer.start_span(f"kind {kind.name}", kind=kind).end()
    tracer.start_span("").end()
    return list(exporter.get_finished_spans())


SPANS = _spans()


@pytest.mark.parametrize("index", range(len(SPANS)), ids=[s.name or "<empty>" for s in SPANS])
def test_each_span_is_byte_for_byte_the_sdk_encoding(index):
    span = SPANS[index]
    expected = encode_spans([span]).resource_spans[0].scope_spans[0].spans[0].SerializeToString()
    assert wire.span(span) == expected


def test_a_whole_request_with_two_scopes_matches_the_sdk():
    ours = [s for s in SPANS if s.instrumentation_scope.name == "gym_autoinstr"]
    theirs = [s for s in SPANS if s.instrumentation_scope.name == "other.lib"]
    resource = SPANS[0].resource
    scopes = []
    for group in (ours, theirs):
        scope = group[0].instrumentation_scope
        scopes.append(wire.scope_spans(wire.scope(scope), scope.schema_url, [wire.span(s) for s in group]))
    payload = wire.export_request(wire.resource(resource), resource.schema_url, scopes)
    assert payload == encode_spans(ours + theirs).SerializeToString()


def _request_of(span) -> bytes:
    """The export request of ``span`` alone, as ``wire`` writes it."""
    scope = span.instrumentation_scope
    return wire.export_request(
        wire.resource(span.resource),
        span.resource.schema_url,
        [wire.scope_spans(wire.scope(scope), scope.schema_url, [wire.span(span)])],
    )


def test_resource_schema_url_is_written():
    provider, exporter = _provider({"service.name": "s"}, schema_url="https://example.test/schema")
    provider.get_tracer("t").start_span("s").end()
    span = exporter.get_finished_spans()[0]
    assert _request_of(span) == encode_spans([span]).SerializeToString()


def test_a_value_the_wire_cannot_carry_is_left_out_and_named():
    # The SDK itself refuses such values when they are set; one that slips into the
    # attribute map anyway (a direct write) is skipped like the SDK's encoder skips it.
    provider, exporter = _provider({"service.name": "s"})
    span = provider.get_tracer("t").start_span("s", attributes={"ok": 1})
    span.end()
    finished = exporter.get_finished_spans()[0]
    finished._attributes = {"ok": 1, "huge": 1 << 70, "odd": object()}
    skipped: list[str] = []
    encoded = wire.span(finished, skipped)
    assert skipped == ["huge", "odd"]
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    parsed = Span.FromString(encoded)
    assert [(kv.key, kv.value.int_value) for kv in parsed.attributes] == [("ok", 1)]


def test_varint_edges():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    for value in (0, 1, 127, 128, 300, 1 << 31, (1 << 63) - 1, -1, -(1 << 63)):
        assert AnyValue.FromString(wire.any_value(value)).int_value == value


def test_the_same_attribute_under_different_fields_is_not_confused():
    # A resource, a span and an event may carry the same key and value: each keeps its
    # own field tag (the encoded-attribute cache must not hand one the other's bytes).
    provider, exporter = _provider({"service.name": "same", "shared": "v"})
    with provider.get_tracer("t").start_as_current_span("s", attributes={"shared": "v"}) as span:
        span.add_event("e", {"shared": "v"})
    finished = exporter.get_finished_spans()[0]
    for _ in range(2):
        assert _request_of(finished) == encode_spans([finished]).SerializeToString()
