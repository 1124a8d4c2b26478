"""OTLP-JSON text, written straight from a span: the run directory's lines.

The files the embedded default writes are the Collector file exporter's format: one
``ExportTraceServiceRequest`` per line in OTLP/JSON (ids in hex, 64-bit integers as
strings, enums as integers, empty fields left out).  Built the SDK's way, that is its
protobuf message, ``MessageToDict`` and a walk rewriting the ids: ~100 µs of Python a
span, on a busy server's export thread.  Here each span's JSON object is written as
text the moment it ends (``span``, a few µs, attribute pairs kept like ``wire.py``
keeps its bytes), and a batch is joined under its resource and scopes as text.

``tests/fastpath/test_wire_json.py`` checks the result, parsed, against the SDK's.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gym_autoinstr.attributes import JOB_PREFIX as _FACT_PREFIX
from gym_autoinstr.fastpath.context_ops import SPAN_CONTEXT_IS_TUPLE
from gym_autoinstr.fastpath.span_facts import KEYS as _FACT_KEYS
from gym_autoinstr.fastpath.span_facts import ROOT_KEYS as _ROOT_FACT_KEYS

_text = json.encoder.encode_basestring_ascii  # (C) a JSON string, quotes included
_TUPLE_LAYOUT = SPAN_CONTEXT_IS_TUPLE
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _double(value: float) -> str:
    if math.isfinite(value):
        return repr(value)
    return '"NaN"' if value != value else ('"Infinity"' if value > 0 else '"-Infinity"')


def any_value(value: Any) -> str:
    """The AnyValue object for an attribute value."""
    if value is True:
        return '{"boolValue":true}'
    if value is False:
        return '{"boolValue":false}'
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _text(value) + "}"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"integer {value} is out of range for int64")
        return '{"intValue":"' + str(value) + '"}'
    if isinstance(value, float):
        return '{"doubleValue":' + _double(value) + "}"
    if isinstance(value, bytes):
        return '{"bytesValue":"' + base64.b64encode(value).decode() + '"}'
    if isinstance(value, Sequence):
        items = ",".join([any_value(item) if item is not None else "{}" for item in value])
        return '{"arrayValue":{' + ('"values":[' + items + "]" if items else "") + "}}"
    if isinstance(value, Mapping):
        pairs = ",".join([key_value(str(k), v) for k, v in value.items()])
        return '{"kvlistValue":{' + ('"values":[' + pairs + "]" if pairs else "") + "}}"
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def decoded(any_value: dict) -> Any:
    """An ``AnyValue`` read back (``any_value``'s inverse): arrays as lists, kvlists as dicts;
    bytes and an empty value as None."""
    for kind, value in any_value.items():  # (one)
        if kind == "intValue":
            return int(value)
        if kind == "arrayValue":
            return [decoded(item) for item in value.get("values", ())]
        if kind == "kvlistValue":
            return {kv["key"]: decoded(kv.get("value") or {}) for kv in value.get("values", ())}
        return value if kind in ("stringValue", "boolValue", "doubleValue") else None
    return None


def key_value(key: str, value: Any) -> str:
    if value is None:
        return '{"key":' + _text(key) + ',"value":{}}'
    return '{"key":' + _text(key) + ',"value":' + any_value(value) + "}"


_KV_CACHE: dict[tuple[str, Any, type], str] = {}
_KV_CACHE_MAX = 4096


def attributes(
    attrs: Mapping[str, Any] | None,
    skipped: list[str] | None = None,
    kept: list[str] | None = None,
    kept_keys: frozenset[str] = _FACT_KEYS,
) -> str:
    """The pairs of a KeyValue list, comma-joined (no brackets); values that cannot be
    encoded are left out, as the SDK's encoder does.  ``kept``: the pairs of the keys
    ``span_facts`` keeps are appended to it too (the same text, one walk)."""
    if not attrs:
        return ""
    parts = []
    append = parts.append
    cache = _KV_CACHE
    for key, value in attrs.items():
        if kept is not None and (key in kept_keys or key.startswith(_FACT_PREFIX)):
            start = len(parts)
            _append_pair(parts, cache, key, value, skipped)
            if len(parts) > start:
                kept.append(parts[-1])
            continue
        kind = type(value)
        if kind is str or kind is int:
            entry = cache.get((key, value, kind))
            if entry is None:
                try:
                    entry = key_value(key, value)
                except Exception:
                    if skipped is not None:
                        skipped.append(key)
                    continue
                if len(cache) >= _KV_CACHE_MAX:
                    cache.clear()
                cache[(key, value, kind)] = entry
            append(entry)
            continue
        try:
            append(key_value(key, value))
        except Exception:
            if skipped is not None:
                skipped.append(key)
    return ",".join(parts)


def _append_pair(parts: list[str], cache: dict, key: str, value: Any, skipped: list[str] | None) -> None:
    kind = type(value)
    try:
        if kind is str or kind is int:
            entry = cache.get((key, value, kind))
            if entry is None:
                entry = key_value(key, value)
                if len(cache) >= _KV_CACHE_MAX:
                    cache.clear()
                cache[(key, value, kind)] = entry
            parts.append(entry)
        else:
            parts.append(key_value(key, value))
    except Exception:
        if skipped is not None:
            skipped.append(key)


_KIND_BY_ID = {id(kind): f',"kind":{kind.value + 1}' for kind in SpanKind}
_UNSET = StatusCode.UNSET
_FLAGS_LOCAL = ',"flags":256'
_FLAGS_REMOTE = ',"flags":768'
_NAME_CACHE: dict[str, str] = {}


def _name(name: str) -> str:
    hit = _NAME_CACHE.get(name)
    if hit is None:
        if len(_NAME_CACHE) >= 1024:
            _NAME_CACHE.clear()
        hit = _NAME_CACHE[name] = ',"name":' + _text(name) if name else ""
    return hit


def _status(status: Any) -> str:
    if status is None:
        return ""
    if status.status_code is _UNSET and not status.description:
        return ',"status":{}'
    code = status.status_code.value
    message = status.description
    body = []
    if message:
        body.append('"message":' + _text(message))
    if code:
        body.append(f'"code":{code}')
    return ',"status":{' + ",".join(body) + "}"


def _events(events: Iterable[Any]) -> str:
    parts = []
    for event in events:
        body = '{"timeUnixNano":"' + str(event.timestamp) + '"'
        if event.name:
            body += ',"name":' + _text(event.name)
        pairs = attributes(event.attributes)
        if pairs:
            body += ',"attributes":[' + pairs + "]"
        if event.dropped_attributes:
            body += f',"droppedAttributesCount":{event.dropped_attributes}'
        parts.append(body + "}")
    return ',"events":[' + ",".join(parts) + "]"


def _links(links: Iterable[Any]) -> str:
    parts = []
    for link in links:
        context = link.context
        body = f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"'
        pairs = attributes(link.attributes)
        if pairs:
            body += ',"attributes":[' + pairs + "]"
        if link.dropped_attributes:
            body += f',"droppedAttributesCount":{link.dropped_attributes}'
        body += ',"flags":768}' if context.is_remote else ',"flags":256}'
        parts.append(body)
    return ',"links":[' + ",".join(parts) + "]"


def span(sdk_span: Any, skipped: list[str] | None = None, kept: list[str] | None = None) -> str:
    """One ended SDK span as the text of its OTLP/JSON ``Span`` object; ``kept``: see
    ``attributes``."""
    context = sdk_span.context
    parent = sdk_span.parent
    if _TUPLE_LAYOUT and type(context) is SpanContext:
        trace_id, span_id, _, _, trace_state, _ = context
    else:
        trace_id, span_id, trace_state = context.trace_id, context.span_id, context.trace_state
    out = [f'{{"traceId":"{trace_id:032x}","spanId":"{span_id:016x}"']
    if trace_state is not DEFAULT_TRACE_STATE and trace_state:
        state = ",".join([f"{key}={value}" for key, value in trace_state.items()])
        if state:
            out.append(',"traceState":' + _text(state))
    if parent is not None:
        if _TUPLE_LAYOUT and type(parent) is SpanContext:
            parent_id, remote = parent[1], parent[2]
        else:
            parent_id, remote = parent.span_id, parent.is_remote
        out.append(f',"parentSpanId":"{parent_id:016x}"')
    else:
        remote = False
    out.append(_FLAGS_REMOTE if remote else _FLAGS_LOCAL)
    out.append(_name(sdk_span.name))
    kind = _KIND_BY_ID.get(id(sdk_span.kind))
    out.append(kind if kind is not None else f',"kind":{sdk_span.kind.value + 1}')
    start, end = sdk_span.start_time, sdk_span.end_time
    if start:
        out.append(f',"startTimeUnixNano":"{start}"')
    if end:
        out.append(f',"endTimeUnixNano":"{end}"')
    pairs = attributes(sdk_span.attributes, skipped, kept, _FACT_KEYS if parent is not None else _ROOT_FACT_KEYS)
    if pairs:
        out.append(',"attributes":[' + pairs + "]")
    if sdk_span.dropped_attributes:
        out.append(f',"droppedAttributesCount":{sdk_span.dropped_attributes}')
    events = sdk_span.events
    if events:
        out.append(_events(events))
    if sdk_span.dropped_events:
        out.append(f',"droppedEventsCount":{sdk_span.dropped_events}')
    links = sdk_span.links
    if links:
        out.append(_links(links))
    if sdk_span.dropped_links:
        out.append(f',"droppedLinksCount":{sdk_span.dropped_links}')
    out.append(_status(sdk_span.status))
    out.append("}")
    return "".join(out)


def resource(sdk_resource: Any) -> str:
    """The ``Resource`` object."""
    pairs = attributes(sdk_resource.attributes) if sdk_resource is not None else ""
    return '{"attributes":[' + pairs + "]}" if pairs else "{}"


def scope(instrumentation_scope: Any) -> str:
    """The ``InstrumentationScope`` object."""
    if instrumentation_scope is None:
        return "{}"
    body = []
    if instrumentation_scope.name:
        body.append('"name":' + _text(instrumentation_scope.name))
    if instrumentation_scope.version:
        body.append('"version":' + _text(instrumentation_scope.version))
    pairs = attributes(getattr(instrumentation_scope, "attributes", None))
    if pairs:
        body.append('"attributes":[' + pairs + "]")
    return "{" + ",".join(body) + "}"


def _schema(schema_url: str | None) -> str:
    return ',"schemaUrl":' + _text(schema_url) if schema_url else ""


def scope_spans(scope_text: str, schema_url: str | None, spans: Sequence[str]) -> str:
    """A ``ScopeSpans`` object."""
    return '{"scope":' + scope_text + ',"spans":[' + ",".join(spans) + "]" + _schema(schema_url) + "}"


def export_request(resource_text: str, resource_schema_url: str | None, scopes: Sequence[str]) -> str:
    """One ``ResourceSpans`` object holding the given ``ScopeSpans``."""
    return (
        '{"resource":' + resource_text + ',"scopeSpans":[' + ",".join(scopes) + "]" + _schema(resource_schema_url) + "}"
    )


def request(resource_spans: Sequence[str]) -> str:
    """The ``ExportTraceServiceRequest``: one line of a run directory's file."""
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"
