"""W3C Trace Context Level 2 (https://www.w3.org/TR/trace-context-2/), rule by rule.

Every row of the tables below cites the rule of the specification it checks (by section
title: "traceparent > version" is the ``version`` part of the ``traceparent`` header
section) and gives what ``w3c.extract`` must read from the headers: nothing (the
trace restarts) or the caller's ids, flags and tracestate.  For every context read, what
``w3c.inject_span`` sends on for it is checked too: version ``00`` (a higher
version is downgraded), the flags W3C reserves as zero, the tracestate as read.

The ``tracestate`` rows are also checked with the fast path off (``GYM_AUTOINSTR_FAST_PATH=off``:
the SDK's propagator reads the ``traceparent``, and ``w3c`` the ``tracestate`` again):
the same rules hold either way.  ``SUITE_CASES`` are the W3C test suite's own tracestate
requests (w3c/trace-context, ``test/test.py``, ``STRICT_LEVEL=2``), which ``tools/w3c-suite``
runs against a real Gym server.

The SDK's ``TraceContextTextMapPropagator`` alone differs on some rows (it checks tracestate
keys by Level 1's grammar and drops the whole header for a repeated key; it keeps reserved
flags); ``test_where_the_sdk_differs`` lists those, checking ours and recording the SDK's
answer without holding it against either.
"""

from __future__ import annotations

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from gym_autoinstr.fastpath import parts, w3c

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SID = "00f067aa0ba902b7"


def tp(flags: str = "01", version: str = "00", trace_id: str = TID, span_id: str = SID) -> str:
    return f"{version}-{trace_id}-{span_id}-{flags}"


TP = tp()


class Read:
    """What a valid traceparent reads as: ids, flags, the tracestate header kept."""

    def __init__(self, flags: int, state: str = "", trace_id: str = TID, span_id: str = SID):
        self.seen = (trace_id, span_id, flags, state)

    def __repr__(self) -> str:
        return f"Read{self.seen}"


def _read(carrier: dict, extract=w3c.extract) -> tuple | None:
    """What ``extract`` (ours unless told) reads: ids, flags and the tracestate header, or None."""
    span_context = trace.get_current_span(extract(carrier)).get_span_context()
    if not span_context.is_valid:
        return None
    return (
        f"{span_context.trace_id:032x}",
        f"{span_context.span_id:016x}",
        int(span_context.trace_flags),
        span_context.trace_state.to_header() if span_context.trace_state else "",
    )


# Rules, as the specification words them (abridged).
V = "traceparent > version: 2HEXDIGLC; version ff is invalid"
V00 = "traceparent > version-format (00): 00-trace-id-parent-id-trace-flags, nothing else"
HEX = "traceparent > HEXDIGLC: lowercase hex only (uppercase invalid)"
TRACE_ID = "traceparent > trace-id: 32HEXDIGLC, all zeroes invalid, then ignore the header"
PARENT_ID = "traceparent > parent-id: 16HEXDIGLC, all zeroes invalid, then ignore the header"
FLAGS = "traceparent > trace-flags: 8-bit field, sampled bit read as a bit, not by equality"
RANDOM = "traceparent > random trace id flag: set in, set on every outgoing header of the trace id"
OTHER_FLAGS = "traceparent > other flags: reserved, vendors MUST set them to zero"
VERSIONING = "traceparent > versioning: higher version parsed by its 00 prefix, >=55 chars, '-' after flags"
VERSIONING_FLAGS = "processing model > higher version: only the flags this version knows, others set to 0"
DOWNGRADE = "mutating traceparent > downgrade the version: sent as 00"
OWS_TP = "RFC 9110 field values: leading/trailing SP/HTAB are not part of the value"
MULTI_TP = "RFC 9110 field order: repeated traceparent fields combine to an invalid value"
NO_TP = "processing model > no traceparent: a tracestate without traceparent is discarded"
TP_FIRST = "tracestate: if traceparent failed to parse, tracestate MUST NOT be parsed"
TS_NOT_TP = "tracestate: failure to parse tracestate MUST NOT affect the parsing of traceparent"
TS_LIST = "tracestate > list: list-members separated by ',', OWS around them ignored"
TS_EMPTY = "tracestate > list: empty and whitespace-only members allowed; empty header accepted"
TS_KEY = "tracestate > key: (lcalpha / DIGIT) 0*255(lcalpha / DIGIT / _ - * / @)"
TS_VALUE = "tracestate > value: 0*255(chr) nblk-chr; printable ASCII but ',' '='; no trailing space"
TS_LEADING = "tracestate > value: leading spaces MUST be preserved, trailing ones are OWS"
TS_INVALID = (
    "processing model: a tracestate that cannot be parsed MAY be discarded entire "
    "(the W3C test suite, strict level 2: it MUST; so every invalid member discards the header)"
)
TS_DUP = "mutating tracestate: vendors MAY discard duplicate keys (the left-most is the latest)"
TS_32 = "tracestate > list: at most 32 list-members (more: the header cannot be parsed, discarded)"
TS_MULTI = "tracestate: multiple tracestate fields MUST be combined (RFC 9110 field order)"
TS_LIMIT = "tracestate limits: truncate whole entries, >128 chars first, then from the end"
TS_VERSION = "tracestate > versioning: parsed as well as possible under a higher traceparent version"


def _members(count: int, prefix: str = "k") -> str:
    return ",".join(f"{prefix}{i}=v{i}" for i in range(count))


_KEY_256 = "a" * 256
_L1_MULTI_TENANT_MAX = "t" * 241 + "@" + "s" * 14
_VALUE_256 = "v" * 256
_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ",=")
_LONG_SIZES = "a=" + "x" * 200 + ",b=" + "y" * 150 + ",c=" + "z" * 100 + ",d=" + "w" * 60  # 522 chars

TRACEPARENT_CASES = [
    # (name, rule, carrier, expected)
    ("sampled", FLAGS, {"traceparent": TP}, Read(1)),
    ("unsampled", FLAGS, {"traceparent": tp("00")}, Read(0)),
    ("random flag alone", RANDOM, {"traceparent": tp("02")}, Read(2)),
    ("sampled and random", RANDOM, {"traceparent": tp("03")}, Read(3)),
    ("reserved flag 04 kept as read", OTHER_FLAGS, {"traceparent": tp("04")}, Read(4)),
    ("every flag", OTHER_FLAGS, {"traceparent": tp("ff")}, Read(0xFF)),
    ("reserved high bit", OTHER_FLAGS, {"traceparent": tp("80")}, Read(0x80)),
    ("sampled among reserved bits", FLAGS, {"traceparent": tp("09")}, Read(9)),
    ("flags 10: a bit, not sampled", FLAGS, {"traceparent": tp("10")}, Read(0x10)),
    ("leading space", OWS_TP, {"traceparent": " " + TP}, Read(1)),
    ("trailing tab", OWS_TP, {"traceparent": TP + "\t"}, Read(1)),
    ("spaces and tabs around", OWS_TP, {"traceparent": " \t " + TP + " \t"}, Read(1)),
    ("leading newline", OWS_TP, {"traceparent": "\n" + TP}, None),
    ("trailing CR LF", OWS_TP, {"traceparent": TP + "\r\n"}, None),
    ("space inside", V00, {"traceparent": "00- " + TID[1:] + "-" + SID + "-01"}, None),
    ("00 with an extra field", V00, {"traceparent": TP + "-extra"}, None),
    ("00 with a trailing dash", V00, {"traceparent": TP + "-"}, None),
    ("00 with a character after flags", V00, {"traceparent": TP + "0"}, None),
    ("00 with one flags digit", V00, {"traceparent": TP[:-1]}, None),
    ("00 with a short trace id", V00, {"traceparent": tp(trace_id=TID[:-1])}, None),
    ("00 with a long trace id", V00, {"traceparent": tp(trace_id=TID + "0")}, None),
    ("00 with a short parent id", V00, {"traceparent": tp(span_id=SID[:-1])}, None),
    ("00 with a long parent id", V00, {"traceparent": tp(span_id=SID + "0")}, None),
    ("00 with underscores for dashes", V00, {"traceparent": TP.replace("-", "_")}, None),
    ("00 with a dash missing", V00, {"traceparent": TP.replace("-", "", 1)}, None),
    ("upper-case trace id", HEX, {"traceparent": tp(trace_id=TID.upper())}, None),
    ("upper-case parent id", HEX, {"traceparent": tp(span_id="00F067AA0BA902B7")}, None),
    ("upper-case flags", HEX, {"traceparent": tp("0A")}, None),
    ("upper-case version", HEX, {"traceparent": tp(version="0A")}, None),
    ("all upper case", HEX, {"traceparent": TP.upper()}, None),
    ("non-hex in trace id", TRACE_ID, {"traceparent": tp(trace_id="g" + TID[1:])}, None),
    ("underscore in trace id (int() takes it)", TRACE_ID, {"traceparent": tp(trace_id=TID[:4] + "_" + TID[5:])}, None),
    ("non-ASCII digit in trace id", TRACE_ID, {"traceparent": tp(trace_id="\u0660" + TID[1:])}, None),
    ("non-hex in parent id", PARENT_ID, {"traceparent": tp(span_id="z" + SID[1:])}, None),
    ("sign in parent id (int() takes it)", PARENT_ID, {"traceparent": tp(span_id="+" + SID[1:])}, None),
    ("non-hex flags", FLAGS, {"traceparent": tp("0g")}, None),
    ("all-zero trace id", TRACE_ID, {"traceparent": tp(trace_id="0" * 32)}, None),
    ("all-zero parent id", PARENT_ID, {"traceparent": tp(span_id="0" * 16)}, None),
    ("both ids zero", TRACE_ID, {"traceparent": tp(trace_id="0" * 32, span_id="0" * 16)}, None),
    (
        "smallest ids",
        TRACE_ID,
        {"traceparent": tp(trace_id="0" * 31 + "1", span_id="0" * 15 + "1")},
        Read(1, trace_id="0" * 31 + "1", span_id="0" * 15 + "1"),
    ),
    (
        "largest ids",
        TRACE_ID,
        {"traceparent": tp(trace_id="f" * 32, span_id="f" * 16)},
        Read(1, trace_id="f" * 32, span_id="f" * 16),
    ),
    ("version ff", V, {"traceparent": tp(version="ff")}, None),
    ("version ff with an extra field", V, {"traceparent": tp(version="ff") + "-x"}, None),
    ("version of one digit", V, {"traceparent": TP[1:]}, None),
    ("version of three digits", V, {"traceparent": "0" + TP}, None),
    ("version not hex", V, {"traceparent": tp(version="xx")}, None),
    ("version 01, 55 characters", VERSIONING, {"traceparent": tp(version="01")}, Read(1)),
    ("version 01 with an extra field", VERSIONING, {"traceparent": tp(version="01") + "-extra"}, Read(1)),
    ("version 01 with fields of any text", VERSIONING, {"traceparent": tp(version="01") + "-a-b=c;d"}, Read(1)),
    ("version 01 with a trailing dash", VERSIONING, {"traceparent": tp(version="01") + "-"}, Read(1)),
    ("version fe with an extra field", VERSIONING, {"traceparent": tp("00", "fe") + "-x"}, Read(0)),
    ("version 10, random flag", VERSIONING, {"traceparent": tp("02", "10") + "-what-ever"}, Read(2)),
    ("version 01 padded", OWS_TP, {"traceparent": " " + tp(version="01") + "-x\t"}, Read(1)),
    ("version 01, flags not followed by a dash", VERSIONING, {"traceparent": tp(version="01") + "x"}, None),
    ("version 01, three flags digits", VERSIONING, {"traceparent": tp("011", "01")}, None),
    ("version 01 shorter than 55", VERSIONING, {"traceparent": tp(version="01")[:54]}, None),
    ("version 01, short trace id, extra field", VERSIONING, {"traceparent": tp("01", "01", TID[:-1]) + "-x"}, None),
    ("version 01, upper-case parent id", VERSIONING, {"traceparent": tp("01", "01", span_id=SID.upper())}, None),
    ("version 01, all-zero trace id", VERSIONING, {"traceparent": tp("01", "01", "0" * 32)}, None),
    ("version 01, all-zero parent id", VERSIONING, {"traceparent": tp("01", "01", span_id="0" * 16)}, None),
    ("version 01, non-hex flags", VERSIONING, {"traceparent": tp("zz", "01")}, None),
    ("version 01, every flag: only known kept", VERSIONING_FLAGS, {"traceparent": tp("ff", "01")}, Read(3)),
    ("version 01, reserved flag only", VERSIONING_FLAGS, {"traceparent": tp("04", "01")}, Read(0)),
    ("version 01, sampled among reserved", VERSIONING_FLAGS, {"traceparent": tp("f5", "01")}, Read(1)),
    ("empty header", V, {"traceparent": ""}, None),
    ("whitespace only", V, {"traceparent": " \t "}, None),
    ("garbage", V, {"traceparent": "garbage"}, None),
    ("two traceparent fields", MULTI_TP, {"traceparent": [TP, TP]}, None),
    ("two different traceparent fields", MULTI_TP, {"traceparent": [TP, tp("00")]}, None),
    ("one traceparent field as a list", MULTI_TP, {"traceparent": [TP]}, Read(1)),
    ("two fields combined with a comma", MULTI_TP, {"traceparent": TP + "," + TP}, None),
    ("two fields combined, comma and space", MULTI_TP, {"traceparent": TP + ", " + TP}, None),
    ("two version-01 fields combined", MULTI_TP, {"traceparent": tp(version="01") + "," + TP}, None),
    ("tracestate alone", NO_TP, {"tracestate": "congo=t61rcWkgMzE"}, None),
    ("tracestate with an invalid traceparent", TP_FIRST, {"traceparent": tp(version="ff"), "tracestate": "a=1"}, None),
    ("invalid tracestate, valid traceparent", TS_NOT_TP, {"traceparent": TP, "tracestate": "$$$"}, Read(1)),
    ("tracestate of one bad member", TS_NOT_TP, {"traceparent": tp("00"), "tracestate": "A=1"}, Read(0)),
]

TRACESTATE_CASES = [
    # (name, rule, tracestate value, the tracestate header read)
    ("one member", TS_LIST, "congo=t61rcWkgMzE", "congo=t61rcWkgMzE"),
    (
        "two members, order kept",
        TS_LIST,
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    ),
    ("spaces around members", TS_LIST, " a=1 ,  b=2 ", "a=1,b=2"),
    ("tabs around members", TS_LIST, "\ta=1\t,\tb=2\t", "a=1,b=2"),
    ("empty header", TS_EMPTY, "", ""),
    ("whitespace-only header", TS_EMPTY, " \t ", ""),
    ("commas only", TS_EMPTY, ",,,", ""),
    ("empty members", TS_EMPTY, ",a=1,,b=2,", "a=1,b=2"),
    ("whitespace-only member", TS_EMPTY, "a=1, \t ,b=2", "a=1,b=2"),
    ("key starting with a digit", TS_KEY, "1a=x", "1a=x"),
    ("key of digits", TS_KEY, "42=x", "42=x"),
    ("key with every key character", TS_KEY, "a0_-*/@z=x", "a0_-*/@z=x"),
    ("multi-tenant key", TS_KEY, "fw529a3039@dt=x", "fw529a3039@dt=x"),
    ("multi-tenant key, tenant starting with a digit", TS_KEY, "1t@sys=x", "1t@sys=x"),
    ("multi-tenant key, system starting with a digit", TS_KEY, "t@1sys=x", "t@1sys=x"),
    ("key with two at signs", TS_KEY, "a@b@c=x", "a@b@c=x"),
    ("key ending in an at sign", TS_KEY, "t@=x", "t@=x"),
    ("key of 256 characters", TS_KEY, f"{_KEY_256}=x", f"{_KEY_256}=x"),
    ("key of 257 characters", TS_KEY, f"{_KEY_256}a=x,b=2", ""),
    ("Level 1's longest multi-tenant key", TS_KEY, f"{_L1_MULTI_TENANT_MAX}=x", f"{_L1_MULTI_TENANT_MAX}=x"),
    ("tenant of 250 characters", TS_KEY, "t" * 250 + "@sys=x", "t" * 250 + "@sys=x"),
    ("system of 20 characters", TS_KEY, "t@" + "s" * 20 + "=x", "t@" + "s" * 20 + "=x"),
    ("key starting with an underscore", TS_KEY, "_a=1,b=2", ""),
    ("key starting with an at sign", TS_KEY, "@dt=1,b=2", ""),
    ("key starting with a dash", TS_KEY, "-a=1,b=2", ""),
    ("upper-case key", TS_KEY, "A=1,b=2", ""),
    ("key with a dot", TS_KEY, "a.b=1,b=2", ""),
    ("key with a space inside", TS_KEY, "a b=1,b=2", ""),
    ("space before the equals sign", TS_KEY, "a =1,b=2", ""),
    ("empty key", TS_KEY, "=1,b=2", ""),
    ("non-ASCII key", TS_KEY, "\u00e9=1,b=2", ""),
    ("empty value", TS_VALUE, "a=,b=2", ""),
    ("value of spaces only", TS_VALUE, "a=   ,b=2", ""),
    ("value with an equals sign", TS_VALUE, "a=b=c,b=2", ""),
    ("value with a tab inside", TS_VALUE, "a=x\ty,b=2", ""),
    ("value with a newline inside", TS_VALUE, "a=x\ny,b=2", ""),
    ("value with DEL", TS_VALUE, "a=x\x7f,b=2", ""),
    ("non-ASCII value", TS_VALUE, "a=\u00e9,b=2", ""),
    ("value of 256 characters", TS_VALUE, f"a={_VALUE_256}", f"a={_VALUE_256}"),
    ("value of 257 characters", TS_VALUE, f"a={_VALUE_256}v,b=2", ""),
    ("value of every allowed character", TS_VALUE, f"a={_PRINTABLE}", f"a={_PRINTABLE}"),
    ("value with a space inside", TS_VALUE, "a=x y", "a=x y"),
    ("leading spaces of a value", TS_LEADING, "a=  x", "a=  x"),
    ("trailing spaces of a value", TS_LEADING, "a=x  ,b=2", "a=x,b=2"),
    ("leading space kept, trailing dropped", TS_LEADING, "a= 1 ", "a= 1"),
    ("member without an equals sign", TS_INVALID, "abc,b=2", ""),
    ("bad members among good ones", TS_INVALID, "a=1,B=2,c=3,d=,e=5", ""),
    ("repeated key", TS_DUP, "a=1,b=2,a=3", "a=1,b=2"),
    ("repeated member", TS_DUP, "a=1,a=1", "a=1"),
    ("repeated key, the first invalid", TS_INVALID, "a=,a=2", ""),
    ("32 members", TS_32, _members(32), _members(32)),
    ("32 members with empty ones between", TS_32, _members(32).replace(",", ", ,"), _members(32)),
    ("33 members", TS_32, _members(33), ""),
    ("40 members with empty ones between", TS_32, _members(40).replace(",", ", ,"), ""),
    ("33 members, one invalid", TS_32, "Bad=1," + _members(32), ""),
    ("32 members and a repeat: 33 list-members", TS_32, _members(32) + ",k0=again", ""),
    ("exactly 512 characters", TS_LIMIT, "a=" + "x" * 254 + ",b=" + "y" * 253, "a=" + "x" * 254 + ",b=" + "y" * 253),
    ("513 characters, a long member goes", TS_LIMIT, "a=" + "x" * 254 + ",b=" + "y" * 254, "a=" + "x" * 254),
    (
        "long members go first, right-most first",
        TS_LIMIT,
        _LONG_SIZES,
        "a=" + "x" * 200 + ",c=" + "z" * 100 + ",d=" + "w" * 60,
    ),
    (
        "then members from the end",
        TS_LIMIT,
        ",".join(f"k{i:02d}={'v' * 20}" for i in range(25)),
        ",".join(f"k{i:02d}={'v' * 20}" for i in range(20)),
    ),
    ("a huge key", TS_KEY, "a=1,b=2," + "c" * 20000 + "=3", ""),
    ("a huge header of many members", TS_32, _members(3000), ""),
    ("spaces past 16 KiB between members: read", TS_LIST, "a=1," + " " * 20000 + ",b=2", "a=1,b=2"),
    ("a header over 32 KiB: discarded unread", TS_INVALID, "a=1," + " " * 40000 + ",b=2", ""),
]

TRACESTATE_HEADERS = [
    # (name, rule, carrier's tracestate (a list: repeated fields), the tracestate header read)
    ("two tracestate fields", TS_MULTI, ["a=1", "b=2"], "a=1,b=2"),
    ("an empty field among them", TS_MULTI, ["a=1", "", "b=2"], "a=1,b=2"),
    ("a key repeated across fields", TS_MULTI, ["a=1", "a=2,b=2"], "a=1,b=2"),
    ("one field as a list", TS_MULTI, ["a=1,b=2"], "a=1,b=2"),
    ("a bad field: the combined header is discarded", TS_INVALID, ["A=1", "b=2"], ""),
]

_TENANT_242 = "t" * 242 + "@v"
_SYSTEM_15 = "t@" + "v" * 15
_SUITE_FIELDS_33 = [  # the suite's 33 members, in the four fields it sends them in
    ",".join(f"bar{i:02d}={i:02d}" for i in range(1, 11)),
    ",".join(f"bar{i:02d}={i:02d}" for i in range(11, 21)),
    ",".join(f"bar{i:02d}={i:02d}" for i in range(21, 31)),
    "bar31=31,bar32=32,bar33=33",
]

# The W3C test suite's tracestate requests (w3c/trace-context test/test.py, STRICT_LEVEL=2;
# its traceparent ends in -00) that a real Gym server answered wrongly before these rules
# (tools/w3c-suite), one row each: (its test and what the row sends, rule, the tracestate
# fields, the tracestate header read).  The fast path forwarded the valid members of a header
# it must discard (``@foo``, 33 members, a 257-character key, an empty value); the stock path
# (the SDK's propagator) dropped a header with a key Level 2 allows (``foo@``, a tenant of 242
# characters, a system of 15) or with a repeated key.  The same tests' other requests were
# answered right on both paths, and are rows above: "key of 256 characters", "Level 1's
# longest multi-tenant key", "value with an equals sign", "32 members", "two tracestate fields".
SUITE_CASES = [
    ("key_illegal_vendor_format: foo@", TS_KEY, ["foo@=1,bar=2"], "foo@=1,bar=2"),
    ("key_illegal_vendor_format: @foo", TS_INVALID, ["@foo=1,bar=2"], ""),
    ("key_illegal_vendor_format: foo@@bar", TS_KEY, ["foo@@bar=1,bar=2"], "foo@@bar=1,bar=2"),
    ("key_illegal_vendor_format: foo@bar@baz", TS_KEY, ["foo@bar@baz=1,bar=2"], "foo@bar@baz=1,bar=2"),
    ("member_count_limit: 33 in four fields", TS_32, _SUITE_FIELDS_33, ""),
    ("key_length_limit: 257", TS_INVALID, ["foo=1", "z" * 257 + "=1"], ""),
    ("key_length_limit: tenant 242, system 1", TS_KEY, ["foo=1", f"{_TENANT_242}=1"], f"foo=1,{_TENANT_242}=1"),
    ("key_length_limit: system 15", TS_KEY, ["foo=1", f"{_SYSTEM_15}=1"], f"foo=1,{_SYSTEM_15}=1"),
    ("value_illegal_characters: foo=,bar=3", TS_INVALID, ["foo=,bar=3"], ""),
    ("duplicated_keys: foo=1,foo=1", TS_DUP, ["foo=1,foo=1"], "foo=1"),
    ("duplicated_keys: foo=1,foo=2", TS_DUP, ["foo=1,foo=2"], "foo=1"),
    ("duplicated_keys: foo=1 twice, two fields", TS_DUP, ["foo=1", "foo=1"], "foo=1"),
    ("duplicated_keys: foo=1 then foo=2, two fields", TS_DUP, ["foo=1", "foo=2"], "foo=1"),
]


def _cases():
    for name, rule, carrier, expected in TRACEPARENT_CASES:
        yield pytest.param(carrier, expected, rule, id=name)
    yield from _tracestate_cases()


def _tracestate_cases():
    for name, rule, tracestate, state in TRACESTATE_CASES + TRACESTATE_HEADERS:
        carrier = {"traceparent": TP, "tracestate": tracestate}
        yield pytest.param(carrier, Read(1, state), rule, id="tracestate: " + name)
    for name, rule, fields, state in SUITE_CASES:  # repeated fields joined, as the ingress joins them
        carrier = {"traceparent": tp("00"), "tracestate": ",".join(fields)}
        yield pytest.param(carrier, Read(0, state), rule, id="W3C suite: " + name)
    # tracestate under other traceparents: parsed all the same
    yield pytest.param({"traceparent": tp("00"), "tracestate": "a=1,b=2"}, Read(0, "a=1,b=2"), TS_LIST, id="unsampled")
    yield pytest.param(
        {"traceparent": tp("01", "01") + "-x", "tracestate": "a=1"}, Read(1, "a=1"), TS_VERSION, id="version 01"
    )


@pytest.fixture
def fast_path_off(monkeypatch):
    """``GYM_AUTOINSTR_FAST_PATH=off``: ``w3c`` goes through ``propagate`` (the SDK's
    propagator), as a server started so does."""
    monkeypatch.setenv("GYM_AUTOINSTR_FAST_PATH", "off")
    parts.reset()
    assert not w3c.w3c_default()
    yield
    monkeypatch.delenv("GYM_AUTOINSTR_FAST_PATH")
    parts.reset()


@pytest.mark.parametrize("carrier,expected,rule", list(_cases()))
def test_extract_and_send_on(carrier, expected, rule):
    """What is read from the headers, and what goes out for the context read."""
    _check_extract_and_send_on(carrier, expected, rule)


@pytest.mark.parametrize("carrier,expected,rule", list(_tracestate_cases()))
def test_tracestate_rules_hold_with_the_fast_path_off(fast_path_off, carrier, expected, rule):
    """The same tracestate rows through the stock path: the SDK's propagator reads the
    traceparent (these rows' traceparents read alike on both paths), ``w3c`` the
    tracestate, and the SDK's propagator writes both."""
    _check_extract_and_send_on(carrier, expected, rule)


def _check_extract_and_send_on(carrier, expected, rule):
    assert rule
    read = _read(dict(carrier))
    assert read == (expected.seen if expected is not None else None), rule
    if expected is None:
        return
    parent = w3c.extract(dict(carrier))
    sent: dict = {}
    w3c.inject_span(trace.get_current_span(parent), sent, parent)
    trace_id, span_id, flags, state = expected.seen
    wanted = {"traceparent": f"00-{trace_id}-{span_id}-{flags & 0x03:02x}"}  # DOWNGRADE, OTHER_FLAGS, RANDOM
    if state:
        wanted["tracestate"] = state  # sent on as read (its truncation done)
    assert sent == wanted, DOWNGRADE


def test_the_tables_are_long_enough_to_mean_something():
    assert len(list(_cases())) > 100


def _span(flags: int = 1, state: TraceState | None = None) -> NonRecordingSpan:
    return NonRecordingSpan(
        SpanContext(int(TID, 16), int(SID, 16), is_remote=False, trace_flags=TraceFlags(flags), trace_state=state)
    )


def _sent(span: NonRecordingSpan, ctx: context.Context | None = None) -> dict:
    carrier: dict = {}
    w3c.inject_span(span, carrier, ctx)
    return carrier


@pytest.mark.parametrize(
    "flags,sent_flags",
    [(0x00, "00"), (0x01, "01"), (0x02, "02"), (0x03, "03"), (0x04, "00"), (0x05, "01"), (0xFE, "02"), (0xFF, "03")],
)
def test_reserved_flags_are_sent_as_zero(flags, sent_flags):
    """traceparent > other flags: vendors MUST set them to zero; random trace id flag: kept."""
    assert _sent(_span(flags)) == {"traceparent": tp(sent_flags)}


@pytest.mark.parametrize("flags,tracestate", [("02", None), ("00", b"a=1")], ids=["W3C suite, Level 2", "tracestate"])
def test_a_dropped_callers_context_goes_on_with_a_parent_id_of_ours(monkeypatch, flags, tracestate):
    """Processing model: the parent-id sent on MUST be the current operation's, sampled or not
    (a request the sampler drops runs under a span id of its own); the flags as read (RANDOM)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    from gym_autoinstr.advice import ingress
    from gym_autoinstr.telemetry import sampling

    monkeypatch.setattr(sampling._spans, "_tracer", type("Tracer", (), {"sampler": ParentBased(ALWAYS_ON)})())
    headers = [(b"traceparent", tp(flags).encode()), (b"tracestate", tracestate)][: 2 if tracestate else 1]
    context, dropped = ingress._caller({"headers": headers})
    sent = sampling.dropped_call(context)[1]["traceparent"]
    assert dropped and sent[:36] + sent[52:] == tp(flags)[:36] + tp(flags)[52:] and sent[36:52] != SID


def test_an_invalid_span_context_sends_nothing():
    """Mutating traceparent: no valid context, nothing to send (a new trace starts downstream)."""
    assert _sent(NonRecordingSpan(SpanContext(0, int(SID, 16), is_remote=False))) == {}


def _state_read(tracestate: str) -> TraceState:
    parent = w3c.extract({"traceparent": TP, "tracestate": tracestate})
    return trace.get_current_span(parent).get_span_context().trace_state


def test_a_changed_member_goes_first_and_level_2_keys_survive_changes():
    """Mutating tracestate: modified and new keys move to the left, unmodified ones keep their
    order; a key Level 2 allows (``t@1sys``, which Level 1's grammar, the API's, refuses) is
    kept through the change."""
    state = _state_read("congo=t61rcWkgMzE,t@1sys=a,rojo=00f067aa0ba902b7")
    assert _sent(_span(state=state.update("rojo", "new")))["tracestate"] == "rojo=new,congo=t61rcWkgMzE,t@1sys=a"
    assert _sent(_span(state=state.add("ours", "1")))["tracestate"] == (
        "ours=1,congo=t61rcWkgMzE,t@1sys=a,rojo=00f067aa0ba902b7"
    )
    assert _sent(_span(state=state.delete("congo")))["tracestate"] == "t@1sys=a,rojo=00f067aa0ba902b7"
    assert state.add("congo", "again") is state  # adding MUST NOT repeat a key
    assert state.update("Bad", "1") is state and state.add("a", "x,y") is state  # invalid: no change
    assert state.delete("absent") is state


def test_a_33rd_member_drops_the_right_most():
    """tracestate > list: adding an entry over 32 removes the right-most list-member."""
    state = _state_read(_members(32))
    added = state.add("ours", "1")
    assert list(added.items())[0] == ("ours", "1") and len(added) == 32 and "k31" not in added and "k30" in added
    assert len(state.update("k5", "new")) == 32  # an update of a present key drops nothing


def test_a_tracestate_over_the_limit_is_truncated_on_the_way_out():
    """tracestate limits: what we send is at most MAX_TRACESTATE_LENGTH, whole members taken
    out, those over 128 characters first (the API lets a TraceState grow past it)."""
    state = TraceState([("a", "x" * 200), ("b", "y" * 200), ("c", "z" * 100), ("d", "w" * 20)])
    assert len(state.to_header()) > w3c.MAX_TRACESTATE_LENGTH
    assert _sent(_span(state=state))["tracestate"] == "a=" + "x" * 200 + ",c=" + "z" * 100 + ",d=" + "w" * 20
    unsampled = _sent(_span(0, state=state))  # the dropped path's headers, kept per span
    assert unsampled["tracestate"] == "a=" + "x" * 200 + ",c=" + "z" * 100 + ",d=" + "w" * 20


def test_baggage_goes_by_its_propagator_and_the_trace_context_by_these_rules():
    """With baggage in play the trace context is still read and written here (strictly);
    the baggage by the global propagator's W3C Baggage propagator."""
    carrier = {"traceparent": tp("ff", "01") + "-x", "tracestate": "a=1,b=2,a=3", "baggage": "tenant=t1"}
    parent = w3c.extract(carrier)
    assert _read({k: v for k, v in carrier.items() if k != "baggage"}) == (TID, SID, 3, "a=1,b=2")
    assert trace.get_current_span(parent).get_span_context().trace_flags == 3
    assert baggage.get_baggage("tenant", parent) == "t1"
    sent = _sent(trace.get_current_span(parent), parent)
    assert sent == {"traceparent": tp("03"), "tracestate": "a=1,b=2", "baggage": "tenant=t1"}
    token = context.attach(baggage.set_baggage("k", "v"))
    try:
        assert _sent(_span(0xFF)) == {"traceparent": tp("03"), "baggage": "k=v"}
    finally:
        context.detach(token)


def _sdk_read(carrier: dict) -> tuple | None:
    return _read(carrier, propagate.extract)


# Where the SDK's TraceContextTextMapPropagator (API 1.45) reads otherwise: (name, carrier,
# ours, the SDK's answer when these tests were written).  Both are W3C-permitted on the
# repeated key (vendors MAY discard duplicates); the W3C test suite keeps the header there,
# and a Level 2 key too (the fast path off, ``w3c`` reads the tracestate itself).
SDK_DIFFERENCES = [
    (
        "a repeated key: the SDK drops the header",
        {"traceparent": TP, "tracestate": "a=1,b=2,a=3"},
        Read(1, "a=1,b=2"),
        (TID, SID, 1, ""),
    ),
    (
        "a Level 2 key Level 1 refuses: the SDK drops the header",
        {"traceparent": TP, "tracestate": "t@1sys=x,b=2"},
        Read(1, "t@1sys=x,b=2"),
        (TID, SID, 1, ""),
    ),
    (
        "a version-01 header's reserved flags: the SDK keeps them",
        {"traceparent": tp("ff", "01")},
        Read(3),
        (TID, SID, 0xFF, ""),
    ),
    ("two traceparent fields: the SDK reads the first", {"traceparent": [TP, tp("00")]}, None, (TID, SID, 1, "")),
    (
        "a tracestate over 512 characters: the SDK sends all of it, we truncate",
        {"traceparent": TP, "tracestate": _LONG_SIZES},
        Read(1, "a=" + "x" * 200 + ",c=" + "z" * 100 + ",d=" + "w" * 60),
        (TID, SID, 1, _LONG_SIZES),
    ),
]


@pytest.mark.parametrize("carrier,ours,sdk", [pytest.param(*row[1:], id=row[0]) for row in SDK_DIFFERENCES])
def test_where_the_sdk_differs(carrier, ours, sdk):
    """Ours is checked; the SDK's answer is either the one recorded or, if it has changed
    since, ours (not a failure of either)."""
    assert _read(dict(carrier)) == (ours.seen if ours is not None else None)
    assert _sdk_read(dict(carrier)) in (sdk, _read(dict(carrier)))


def test_the_sdk_sends_reserved_flags_we_do_not():
    span = _span(0x04)
    theirs: dict = {}
    propagate.inject(theirs, context=trace.set_span_in_context(span))
    assert _sent(span) == {"traceparent": tp("00")}
    assert theirs["traceparent"] in (tp("04"), tp("00"))


@pytest.mark.parametrize(
    "trace_id,span_id,flags",
    [(0xABC, 0xDEF, 1), (0xABC, 0xDEF, 0x86), ((1 << 128) - 1, (1 << 64) - 1, 3), (1 << 128, 5, 0xFF), (5, 1 << 64, 4)],
)
def test_the_sent_traceparent_is_the_sdks_but_for_reserved_flags(trace_id, span_id, flags):
    """Ids and version as ``traceparent`` (the SDK's form) writes them, in range or not (a
    custom id generator's: never an exception on the request path); flags but sampled and
    random as zero whenever the byte is in range."""
    span_context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags))
    sdk_form = w3c.traceparent(span_context)
    assert w3c.sent_traceparent(span_context) == sdk_form[:-2] + f"{flags & 0x03:02x}"
