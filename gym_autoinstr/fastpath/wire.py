"""OTLP trace protobuf, written straight to bytes.

The SDK's OTLP encoder builds a tree of protobuf message objects for every span and
serialises the tree on the exporter thread; that costs ~30-45 µs of CPU per span here,
mostly in Python, and it needs every ended span kept alive (with its attribute maps,
locks and context) until the batch goes out, long enough for the garbage collector to
promote them all into the old generations.

This module writes the same bytes (``opentelemetry/proto/trace/v1/trace.proto``, field by
field in field-number order, with the SDK encoder's choices: which empty fields appear,
``flags``, status always present, link trace state omitted) from a ``ReadableSpan``
directly, so a span can be encoded the moment it ends and then freed.  Only the wire
format is needed: varints, fixed64/fixed32 and length-delimited fields.

``tests/fastpath/test_wire.py`` checks the output byte for byte against the SDK's encoder.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gym_autoinstr.fastpath.context_ops import SPAN_CONTEXT_IS_TUPLE

_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_double = struct.Struct("<d").pack
_pack_times = struct.Struct("<BQBQ").pack  # start and end time: tag, fixed64, tag, fixed64
_TUPLE_LAYOUT = SPAN_CONTEXT_IS_TUPLE

_SMALL = [bytes((n,)) for n in range(128)]
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else varint(n)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8"))


# -- common.proto ------------------------------------------------------------------------
# AnyValue: string_value=1, bool_value=2, int_value=3, double_value=4, array_value=5,
# kvlist_value=6, bytes_value=7 (a oneof: present even when it holds the default).
# KeyValue: key=1, value=2.  ArrayValue/KeyValueList: values=1.

_TRUE = b"\x10\x01"
_FALSE = b"\x10\x00"


def any_value(value: Any) -> bytes:
    """The AnyValue message (without its own tag) for an attribute value."""
    if value is None:
        return b""
    if value is True:
        return _TRUE
    if value is False:
        return _FALSE
    if isinstance(value, bool):  # a bool subclass: rare enough to take the slow way
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _string(b"\x0a", value)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"integer {value} is out of range for int64")
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", any_value(item)) for item in value]))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join([_field(b"\x0a", key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def key_value(key: str, value: Any) -> bytes:
    return _string(b"\x0a", key) + _field(b"\x12", any_value(value))


# Gym's spans repeat the same few attributes (method, host, port, route, server name):
# each encoded KeyValue field of a str or int value is kept, bounded.  (Keyed by the
# field's tag, and by the exact type too: True == 1 and 1.0 == 1 must not share an entry.)
_KV_CACHE: dict[tuple[bytes, str, Any, type], bytes] = {}
_KV_CACHE_MAX = 4096


def attributes(tag: bytes, attrs: Mapping[str, Any] | None, skipped: list[str] | None = None) -> bytes:
    """Every attribute as a repeated KeyValue field ``tag``; values that cannot be encoded
    are left out (as the SDK's encoder does) and their keys appended to ``skipped``."""
    if not attrs:
        return b""
    parts = []
    append = parts.append
    cache = _KV_CACHE
    for key, value in attrs.items():
        kind = type(value)
        if kind is str or kind is int:
            entry = cache.get((tag, key, value, kind))
            if entry is None:
                try:
                    entry = _field(tag, key_value(key, value))
                except Exception:
                    if skipped is not None:
                        skipped.append(key)
                    continue
                if len(cache) >= _KV_CACHE_MAX:
                    cache.clear()
                cache[(tag, key, value, kind)] = entry
            append(entry)
            continue
        try:
            append(_field(tag, key_value(key, value)))
        except Exception:
            if skipped is not None:
                skipped.append(key)
    return b"".join(parts)


# -- trace.proto -------------------------------------------------------------------------
# Span: trace_id=1, span_id=2, trace_state=3, parent_span_id=4, name=5, kind=6,
# start_time_unix_nano=7 (fixed64), end_time_unix_nano=8 (fixed64), attributes=9,
# dropped_attributes_count=10, events=11, dropped_events_count=12, links=13,
# dropped_links_count=14, status=15, flags=16 (fixed32).
# Event: time_unix_nano=1 (fixed64), name=2, attributes=3, dropped_attributes_count=4.
# Link: trace_id=1, span_id=2, trace_state=3, attributes=4, dropped_attributes_count=5,
# flags=6 (fixed32).  Status: message=2, code=3.

_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_SPAN_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE)
_SPAN_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)
_LINK_FLAGS_LOCAL = b"\x35" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE)
_LINK_FLAGS_REMOTE = b"\x35" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)

# SpanKind (the API's enum, INTERNAL=0 ... CONSUMER=4) to the OTLP enum (INTERNAL=1 ...),
# looked up by identity (an enum member's hash and .value are Python-level calls).
_KIND_BY_ID = {id(kind): b"\x30" + _SMALL[kind.value + 1] for kind in SpanKind}
_STATUS_UNSET = b"\x7a\x00"
_UNSET = StatusCode.UNSET

_NAME_CACHE: dict[str, bytes] = {}


def _name(name: str) -> bytes:
    hit = _NAME_CACHE.get(name)
    if hit is None:
        if len(_NAME_CACHE) >= 1024:
            _NAME_CACHE.clear()
        hit = _NAME_CACHE[name] = _string(b"\x2a", name) if name else b""
    return hit


# Status objects known to be UNSET without a description (the lean span's default),
# answered by identity: a Status's fields are Python properties.
_UNSET_STATUSES: list = []


def known_unset(status: Any) -> None:
    """Register ``status`` (UNSET, no description, never changed) for the fast path."""
    if status.status_code is _UNSET and not status.description and not any(s is status for s in _UNSET_STATUSES):
        _UNSET_STATUSES.append(status)


def _status(status: Any) -> bytes:
    if status is None:
        return b""
    for known in _UNSET_STATUSES:
        if status is known:
            return _STATUS_UNSET
    if status.status_code is _UNSET and not status.description:
        return _STATUS_UNSET
    code = status.status_code.value
    message = status.description
    if not code and not message:
        return _STATUS_UNSET
    body = (_string(b"\x12", message) if message else b"") + (b"\x18" + varint(code) if code else b"")
    return _field(b"\x7a", body)


def _trace_state(trace_state: Any) -> str:
    if not trace_state:
        return ""
    return ",".join([f"{key}={value}" for key, value in trace_state.items()])


def _events(events: Iterable[Any]) -> bytes:
    parts = []
    for event in events:
        body = b"\x09" + _pack_fixed64(event.timestamp)
        if event.name:
            body += _string(b"\x12", event.name)
        body += attributes(b"\x1a", event.attributes)
        dropped = event.dropped_attributes
        if dropped:
            body += b"\x20" + varint(dropped)
        parts.append(_field(b"\x5a", body))
    return b"".join(parts)


def _links(links: Iterable[Any]) -> bytes:
    parts = []
    for link in links:
        context = link.context
        body = (
            b"\x0a\x10"
            + context.trace_id.to_bytes(16, "big")
            + b"\x12\x08"
            + context.span_id.to_bytes(8, "big")
            + attributes(b"\x22", link.attributes)
        )
        dropped = link.dropped_attributes
        if dropped:
            body += b"\x28" + varint(dropped)
        body += _LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL
        parts.append(_field(b"\x6a", body))
    return b"".join(parts)


def span(sdk_span: Any, skipped: list[str] | None = None) -> bytes:
    """One ended SDK span as the bytes of an OTLP ``Span`` message (without its tag)."""
    context = sdk_span.context
    parent = sdk_span.parent
    if _TUPLE_LAYOUT and type(context) is SpanContext:  # (its fields are properties: one unpack instead)
        trace_id, span_id, _, _, trace_state, _ = context
    else:
        trace_id, span_id, trace_state = context.trace_id, context.span_id, context.trace_state
    out = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
    if trace_state is not DEFAULT_TRACE_STATE:
        state = _trace_state(trace_state)
        if state:
            out.append(_string(b"\x1a", state))
    if parent is not None:
        remote = parent[2] if _TUPLE_LAYOUT and type(parent) is SpanContext else parent.is_remote
        out.append(b"\x22\x08")
        out.append((parent[1] if _TUPLE_LAYOUT and type(parent) is SpanContext else parent.span_id).to_bytes(8, "big"))
    else:
        remote = False
    out.append(_name(sdk_span.name))
    kind = _KIND_BY_ID.get(id(sdk_span.kind))
    out.append(kind if kind is not None else b"\x30" + varint(sdk_span.kind.value + 1))
    start, end = sdk_span.start_time, sdk_span.end_time
    if start and end:
        out.append(_pack_times(0x39, start, 0x41, end))
    elif start:
        out.append(b"\x39" + _pack_fixed64(start))
    elif end:
        out.append(b"\x41" + _pack_fixed64(end))
    out.append(attributes(b"\x4a", sdk_span.attributes, skipped))
    dropped = sdk_span.dropped_attributes
    if dropped:
        out.append(b"\x50" + varint(dropped))
    events = sdk_span.events
    if events:
        out.append(_events(events))
    dropped = sdk_span.dropped_events
    if dropped:
        out.append(b"\x60" + varint(dropped))
    links = sdk_span.links
    if links:
        out.append(_links(links))
    dropped = sdk_span.dropped_links
    if dropped:
        out.append(b"\x70" + varint(dropped))
    out.append(_status(sdk_span.status))
    out.append(_SPAN_FLAGS_REMOTE if remote else _SPAN_FLAGS_LOCAL)
    return b"".join(out)


def resource(sdk_resource: Any) -> bytes:
    """The ``Resource`` message (without its tag)."""
    return attributes(b"\x0a", sdk_resource.attributes) if sdk_resource is not None else b""


def scope(instrumentation_scope: Any) -> bytes:
    """The ``InstrumentationScope`` message (without its tag)."""
    if instrumentation_scope is None:
        return b""
    body = b""
    if instrumentation_scope.name:
        body += _string(b"\x0a", instrumentation_scope.name)
    if instrumentation_scope.version:
        body += _string(b"\x12", instrumentation_scope.version)
    return body + attributes(b"\x1a", getattr(instrumentation_scope, "attributes", None))


def _container(head: bytes, items: Sequence[bytes], schema_url: str | None) -> bytes:
    """The body shared by ``ScopeSpans`` and ``ResourceSpans``: field 1 (the scope or
    resource), field 2 repeated (spans or scope spans), field 3 the schema URL."""
    body = [_field(b"\x0a", head)]
    for encoded in items:
        body.append(_field(b"\x12", encoded))
    if schema_url:
        body.append(_string(b"\x1a", schema_url))
    return b"".join(body)


def scope_spans(scope_bytes: bytes, schema_url: str | None, spans: Sequence[bytes]) -> bytes:
    """A ``ScopeSpans`` message: scope=1, spans=2, schema_url=3."""
    return _container(scope_bytes, spans, schema_url)


def export_request(resource_bytes: bytes, resource_schema_url: str | None, scopes: Sequence[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` with one ``ResourceSpans`` (resource=1,
    scope_spans=2, schema_url=3) holding the given ``ScopeSpans`` messages."""
    return _field(b"\x0a", _container(resource_bytes, scopes, resource_schema_url))


def request(resource_spans: Sequence[bytes]) -> bytes:
    """The ``ExportTraceServiceRequest`` of the given ``ResourceSpans`` fields."""
    return b"".join(resource_spans)
