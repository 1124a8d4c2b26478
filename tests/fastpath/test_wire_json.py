"""``wire_json.py`` writes what the SDK's encoder and protobuf's JSON mapping write (ids in
hex, as the Collector's file exporter does), span by span and for whole requests: compared
parsed, since JSON's key order and spacing carry nothing."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

from gym_autoinstr.fastpath import wire_json  # noqa: E402
from gym_autoinstr.setup.files import encode_otlp_json  # noqa: E402
from tests.fastpath.test_wire import SPANS, _provider  # noqa: E402


def _sdk(spans) -> dict:
    return json.loads(encode_otlp_json(spans))


def _ours(spans) -> dict:
    by_scope: dict = {}
    for span in spans:
        by_scope.setdefault(span.instrumentation_scope, []).append(wire_json.span(span))
    resource = spans[0].resource
    scopes = [wire_json.scope_spans(wire_json.scope(s), s.schema_url, texts) for s, texts in by_scope.items()]
    return json.loads(
        wire_json.request([wire_json.export_request(wire_json.resource(resource), resource.schema_url, scopes)])
    )


def _nan_safe(node):
    """NaN != NaN: compare NaNs as a marker."""
    if isinstance(node, dict):
        return {k: _nan_safe(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_nan_safe(v) for v in node]
    if isinstance(node, float) and math.isnan(node):
        return "NaN"
    return node


@pytest.mark.parametrize("index", range(len(SPANS)), ids=[s.name or "<empty>" for s in SPANS])
def test_each_span_is_the_sdk_json(index):
    span = SPANS[index]
    expected = _sdk([span])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert _nan_safe(json.loads(wire_json.span(span))) == _nan_safe(expected)


def test_a_whole_request_with_two_scopes_is_the_sdk_json():
    assert _nan_safe(_ours(SPANS)) == _nan_safe(_sdk(SPANS))
    assert encode_spans(SPANS)  # (the SDK encodes them too: the comparison is of real output)


def test_a_value_json_cannot_carry_is_left_out_and_named():
    provider, exporter = _provider({"service.name": "s"})
    provider.get_tracer("t").start_span("s", attributes={"ok": 1}).end()
    finished = exporter.get_finished_spans()[0]
    finished._attributes = {"ok": 1, "huge": 1 << 70, "odd": object()}
    skipped: list[str] = []
    parsed = json.loads(wire_json.span(finished, skipped))
    assert skipped == ["huge", "odd"]
    assert parsed["attributes"] == [{"key": "ok", "value": {"intValue": "1"}}]


def test_strings_that_need_escaping_round_trip():
    provider, exporter = _provider({"service.name": 'quote " and \\ and \n'})
    provider.get_tracer("t").start_span('name "x"\t', attributes={'k"ey': "\u2028 \x00 é"}).end()
    span = exporter.get_finished_spans()[0]
    assert _ours([span]) == _sdk([span])


def test_a_value_reads_back_as_written():
    values = ["é \n", True, False, -(2**63), 2.5, ["a", "b"], [1, 2.0, True], {"k": [1, {"n": "v"}]}, []]
    for value in values:
        assert wire_json.decoded(json.loads(wire_json.any_value(value))) == value
    assert wire_json.decoded(json.loads(wire_json.any_value(b"\x00"))) is None and wire_json.decoded({}) is None
