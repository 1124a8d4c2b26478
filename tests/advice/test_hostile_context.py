"""Hostile inbound trace context never crashes a server, never grows without bound,
and nothing of it is copied into span attributes; outside baggage is not passed on."""

from __future__ import annotations

import urllib.request

import pytest
from fastapi import FastAPI, Request
from opentelemetry import baggage
from opentelemetry.trace import SpanKind

from gym_autoinstr.advice.ingress import instrument_app
from tests.harness.servers import serve

GOOD_TRACE = "0af7651916cd43dd8448eb211c80319c"
GOOD = f"00-{GOOD_TRACE}-b7ad6b7169203331-01"


def _app(seen: list) -> FastAPI:
    app = FastAPI()

    @app.get("/echo")
    async def echo(request: Request):
        seen.append(dict(baggage.get_all()))
        return {"ok": True}

    return app


def _get(url: str, headers: list[tuple[str, str]]) -> int:
    request = urllib.request.Request(url, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


HOSTILE = {
    "malformed": [("traceparent", "00-not-hex-at-all-01")],
    "oversized": [("traceparent", "00-" + "a" * 5000 + "-b7ad6b7169203331-01")],
    "all-zero": [("traceparent", "00-00000000000000000000000000000000-0000000000000000-01")],
    "future-version-garbage": [("traceparent", "ff-" + GOOD_TRACE + "-b7ad6b7169203331-01")],
    "huge-tracestate": [("traceparent", GOOD), ("tracestate", ",".join(f"k{i}=v{i}" for i in range(600)))],
    "secret-baggage": [
        ("traceparent", GOOD),
        ("baggage", "user=SECRET-CANARY-b4g," + ",".join(f"x{i}={'y' * 100}" for i in range(300))),
    ],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_inbound_context(case, instrumented, spans):
    seen: list = []
    app = _app(seen)
    instrument_app(app, "agent")
    with serve(app) as base:
        assert _get(f"{base}/echo", HOSTILE[case]) == 200
    (span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    values = " ".join(str(v) for v in span.attributes.values())
    assert "SECRET" not in values and "tracestate" not in values and "k599" not in values
    assert len(span.attributes) < 12
    assert seen == [{}]  # outside baggage does not reach the handler's context (nor, so, any hop)
    if case in ("malformed", "oversized", "all-zero", "future-version-garbage"):
        assert span.parent is None  # invalid context: a new trace, never a crash
    else:
        assert format(span.context.trace_id, "032x") == GOOD_TRACE
        assert len(span.context.trace_state) <= 32


def test_two_conflicting_traceparents_start_a_new_trace(instrumented, spans):
    app = _app([])
    instrument_app(app, "agent")
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    with serve(app) as base:
        import http.client

        host, port = base[len("http://") :].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.putrequest("GET", "/echo")
        connection.putheader("traceparent", GOOD)
        connection.putheader("traceparent", other)
        connection.endheaders()
        assert connection.getresponse().status == 200
        connection.close()
    (span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert span.parent is None


def test_baggage_is_accepted_when_asked(instrumented, spans, monkeypatch):
    from gym_autoinstr.advice import ingress

    monkeypatch.setenv("GYM_AUTOINSTR_ACCEPT_BAGGAGE", "true")
    monkeypatch.setattr(ingress._Propagation, "textmap", None)
    seen: list = []
    app = _app(seen)
    instrument_app(app, "agent")
    try:
        with serve(app) as base:
            assert _get(f"{base}/echo", [("traceparent", GOOD), ("baggage", "team=rl")]) == 200
    finally:
        ingress._Propagation.textmap = None
    assert seen == [{"team": "rl"}]
