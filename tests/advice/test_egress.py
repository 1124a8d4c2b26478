"""Egress on Gym's real ``server_utils.request`` against a real local HTTP server."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from opentelemetry.trace import SpanKind, StatusCode

from tests.harness.servers import run_async, serve

pytest.importorskip("nemo_gym")


def _echo_app() -> FastAPI:
    app = FastAPI()
    seen: list[dict] = []
    app.state.seen = seen

    @app.post("/echo")
    async def echo(request: Request):
        seen.append({k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate", "x-caller")})
        return {"ok": True}

    @app.post("/ng-rollout/{rollout_id}/v1/responses")  # Gym's per-rollout prefix
    async def prefixed(rollout_id: str):
        return {}

    return app


def _call(url: str, **kwargs):
    from nemo_gym import server_utils

    async def go():
        response = await server_utils.request("POST", url, **kwargs)
        status = response.status
        await response.read()
        return status

    return run_async(go())


def _client_spans(spans):
    return [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]


def test_one_client_span_per_request_with_context_injected(instrumented, spans):
    app = _echo_app()
    with serve(app) as base:
        status = _call(
            f"http://user:hunter2@{base[len('http://') :]}/echo?api_key=SECRET&task=private#frag", json={"a": 1}
        )
    assert status == 200
    (span,) = _client_spans(spans)
    assert span.name == "POST"  # not a server of the fleet: no route known, `{method}` alone
    assert "url.template" not in span.attributes
    assert span.attributes["http.request.method"] == "POST"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["url.full"].endswith("/echo")
    full = span.attributes["url.full"]
    assert "SECRET" not in full and "private" not in full and "hunter2" not in full and "frag" not in full
    (received,) = app.state.seen
    trace_id, span_id = received["traceparent"].split("-")[1:3]
    assert int(trace_id, 16) == span.context.trace_id
    assert int(span_id, 16) == span.context.span_id


def test_caller_headers_are_not_mutated(instrumented, spans):
    app = _echo_app()
    headers = {"x-caller": "yes"}
    with serve(app) as base:
        _call(f"{base}/echo", headers=headers, data=b"{}")
    assert headers == {"x-caller": "yes"}
    assert app.state.seen[0]["x-caller"] == "yes"
    assert "traceparent" in app.state.seen[0]


def test_headers_given_as_name_value_pairs_get_the_context_too(instrumented, spans):
    """Gym 0.7's sandbox HTTP transport sends httpx's ``multi_items()``: a list of pairs
    (an old traceparent among them is replaced, the caller's list is left alone)."""
    app = _echo_app()
    headers = [("x-caller", "pairs"), ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")]
    with serve(app) as base:
        assert _call(f"{base}/echo", headers=headers, data=b"{}") == 200
    (span,) = _client_spans(spans)
    (received,) = app.state.seen
    assert received["x-caller"] == "pairs"
    assert int(received["traceparent"].split("-")[2], 16) == span.context.span_id
    assert headers[1][1].startswith("00-111")


def test_client_span_is_child_of_the_current_span(instrumented, spans):
    from opentelemetry import trace

    app = _echo_app()
    tracer = trace.get_tracer("test")
    with serve(app) as base:
        with tracer.start_as_current_span("outer") as outer:
            _call(f"{base}/echo", json={})
    (span,) = _client_spans(spans)
    assert span.parent is not None and span.parent.span_id == outer.context.span_id
    assert span.context.trace_id == outer.context.trace_id


def test_4xx_does_not_set_error(instrumented, spans):
    app = _echo_app()
    with serve(app) as base:
        status = _call(f"{base}/missing", json={})
    assert status == 404
    (span,) = _client_spans(spans)
    assert span.attributes["http.response.status_code"] == 404
    assert span.status.status_code != StatusCode.ERROR


def test_retries_stay_inside_one_span_with_resend_count(instrumented, spans):
    """A server that drops the first connection: Gym retries; we record one span, one resend."""
    import socket
    import threading

    from tests.harness.servers import free_port

    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    requests_seen: list[bytes] = []

    def serve_two():
        # first connection: read the request, close without answering (ServerDisconnectedError)
        conn, _ = listener.accept()
        requests_seen.append(conn.recv(65536))
        conn.close()
        conn, _ = listener.accept()
        requests_seen.append(conn.recv(65536))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        conn.close()

    thread = threading.Thread(target=serve_two, daemon=True)
    thread.start()
    try:
        status = _call(f"http://127.0.0.1:{port}/x", json={})
    finally:
        thread.join(5)
        listener.close()
    assert status == 200
    (span,) = _client_spans(spans)
    assert span.attributes["http.request.resend_count"] == 1
    # both attempts carried the same traceparent: the logical request's span
    parents = {
        line for r in requests_seen for line in r.decode().split("\r\n") if line.lower().startswith("traceparent")
    }
    assert len(requests_seen) == 2 and len(parents) == 1


def test_rollout_id_from_gyms_rollout_path(instrumented, spans):
    with serve(_echo_app()) as base:
        assert _call(f"{base}/ng-rollout/3-1/v1/responses", json={}) == 200
    (span,) = _client_spans(spans)
    assert span.attributes["nemo.gym.rollout.id"] == "3-1"


def test_under_a_dropped_parent_no_span_and_the_parents_context_goes_on(instrumented, spans):
    """The session provider's sampler is parent-based: a child of an unsampled parent is
    never recorded, so egress starts none and passes the caller's own context on."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    parent = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.DEFAULT),
    )
    app = _echo_app()
    with serve(app) as base:
        with trace.use_span(NonRecordingSpan(parent)):
            status = _call(f"{base}/echo", json={}, headers={"x-caller": "yes"})
        # and a sampled parent is traced as before
        with trace.get_tracer("test").start_as_current_span("outer"):
            _call(f"{base}/echo", json={})
    assert status == 200
    dropped, kept = app.state.seen
    assert dropped["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    assert dropped["x-caller"] == "yes"
    (span,) = _client_spans(spans)  # the sampled call's only
    assert kept["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"
    assert int(kept["traceparent"].split("-")[3], 16) & 1


def test_every_call_under_a_dropped_span_gets_the_same_headers_in_a_dict_of_its_own(instrumented, spans):
    """The headers written for a dropped span are kept per span: each call still gets its
    own copy (a callee writing into it changes nothing for the next call, nor the
    caller's own headers)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from gym_autoinstr.advice import egress

    parent = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.DEFAULT),
    )
    seen: list[dict] = []

    def gyms_request(method, url, **kwargs):  # writes into the headers it was given
        seen.append(dict(kwargs["headers"]))
        kwargs["headers"]["x-written-by-the-callee"] = "1"

    callers = [None, None, {"x-caller": "yes"}, None]
    with trace.use_span(NonRecordingSpan(parent)):
        for headers in callers:
            egress.request_advice(
                gyms_request, None, ("POST", "http://127.0.0.1:9/x"), {} if headers is None else {"headers": headers}
            )
    expected = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    assert [h.get("traceparent") for h in seen] == [expected] * 4
    assert all("x-written-by-the-callee" not in h for h in seen)
    assert seen[2]["x-caller"] == "yes" and callers[2] == {"x-caller": "yes"}
    assert not _client_spans(spans)


# -- GYM_AUTOINSTR_CLIENT_SPANS=failures (the failures-only shape) --------------------


@pytest.fixture
def failures_only(monkeypatch):
    """The failures-only shape on, and ``fleet(base)`` makes ``base`` a Gym server of the fleet."""
    from gym_autoinstr.advice import egress, fleet_addresses

    monkeypatch.setattr(egress._FAILURES_ONLY, "on", True)
    names: dict[str, str] = {}
    monkeypatch.setattr(fleet_addresses._state, "names", names)

    def fleet(base: str) -> None:
        names[base[len("http://") :]] = "resources"

    return fleet


def test_failures_only_call_between_gym_servers_has_no_client_span_carries_callers(instrumented, spans, failures_only):
    from opentelemetry import trace

    app = _echo_app()
    with serve(app) as base:
        failures_only(base)
        with trace.get_tracer("test").start_as_current_span("handler") as handler:
            assert _call(f"{base}/echo", json={}, headers={"x-caller": "yes"}) == 200
    assert _client_spans(spans) == []
    (received,) = app.state.seen
    _, trace_id, span_id, flags = received["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (handler.context.trace_id, handler.context.span_id)
    assert int(flags, 16) & 1 and received["x-caller"] == "yes"  # sampled


def test_failures_only_keeps_client_spans_outside_fleet_and_traced_request(instrumented, spans, failures_only):
    from opentelemetry import trace

    app = _echo_app()
    with serve(app) as base:
        with trace.get_tracer("test").start_as_current_span("handler") as handler:
            _call(f"{base}/echo", json={})  # not a server of the fleet: the model's upstream, say
        failures_only(base)
        _call(f"{base}/echo", json={})  # a fleet server, but no span of the caller to hang it on
    outside, unparented = _client_spans(spans)
    assert outside.parent.span_id == handler.context.span_id
    assert unparented.parent is None
    for span, received in zip((outside, unparented), app.state.seen):
        assert int(received["traceparent"].split("-")[2], 16) == span.context.span_id


def test_failures_only_failed_call_between_gym_servers_gets_client_span_with_error(instrumented, spans, failures_only):
    import asyncio

    import aiohttp
    from opentelemetry import trace

    app = _echo_app()

    @app.post("/slow")
    async def slow():
        await asyncio.sleep(2)
        return {}

    with serve(app) as base:
        failures_only(base)
        with trace.get_tracer("test").start_as_current_span("handler") as handler:
            with pytest.raises(Exception) as raised:  # Gym tries 3 times, then re-raises
                _call(f"{base}/slow", json={}, timeout=aiohttp.ClientTimeout(total=0.1))
    (span,) = _client_spans(spans)
    assert span.parent.span_id == handler.context.span_id
    assert span.status.status_code == StatusCode.ERROR
    from gym_autoinstr.telemetry.spans import error_type

    assert span.attributes["error.type"] == error_type(raised.value)
    assert span.attributes["url.full"].endswith("/slow") and span.attributes["http.request.method"] == "POST"
    # it covers the whole call: three tries and Gym's two pauses of 0.5 s between them
    assert span.end_time - span.start_time >= 1_000_000_000


def test_client_spans_setting_values():
    from gym_autoinstr.advice.egress import client_spans_on_failure_only as failures_only

    assert failures_only({}) is False and failures_only({"GYM_AUTOINSTR_CLIENT_SPANS": " All "}) is False
    assert failures_only({"GYM_AUTOINSTR_CLIENT_SPANS": "FAILURES"}) is True
    assert failures_only({"GYM_AUTOINSTR_CLIENT_SPANS": "lean"}) is False  # unknown: the default, with a warning


def test_resends_are_counted_on_gyms_session_alone(instrumented, spans):
    """The attempts are counted through Gym's own client session (an attribute of that
    session), on the current span when it is counting (``gym_attempts``, set by a traced
    request): aiohttp's ClientSession class is left as it is, so no other session's call
    pays for it, and a call through Gym's session under no counting span counts nothing."""
    import aiohttp
    import wrapt
    from nemo_gym import server_utils
    from opentelemetry import trace

    from gym_autoinstr.fastpath import context_ops, lean

    app = _echo_app()
    with serve(app) as base:
        assert _call(f"{base}/echo", json={}) == 200
    session = server_utils.get_global_aiohttp_client()
    assert "request" in vars(session)  # the counter, on this session
    assert not isinstance(vars(aiohttp.ClientSession)["request"], wrapt.FunctionWrapper)

    async def other_session_request() -> None:  # another session, under a counting span
        async with aiohttp.ClientSession() as other:
            assert "request" not in vars(other)
            other.request("GET", "http://127.0.0.1:9/never")._coro.close()  # made, not sent

    def never() -> None:
        session.request("GET", "http://127.0.0.1:9/never")._coro.close()  # made, not sent

    # the SDK's span (an instance attribute) and a lean span (a slot that starts as None)
    sdk_span = trace.get_tracer("test").start_span("call")
    lean_span = lean.LeanSpan(
        type("T", (), {})(), "call", sdk_span.get_span_context(), None, trace.SpanKind.CLIENT, {}, (), 1
    )
    assert lean_span.gym_attempts is None
    for span in (sdk_span, lean_span):
        token = context_ops.enter(span)
        try:
            never()  # not counting yet: nothing
            assert getattr(span, "gym_attempts", None) is None
            span.gym_attempts = 0
            run_async(other_session_request())
            assert span.gym_attempts == 0  # not Gym's session: not counted
            never()
            never()
            assert span.gym_attempts == 2
            child = trace.NonRecordingSpan(span.get_span_context())  # another span current: not this one's
            inner = context_ops.enter(child)
            try:
                never()
            finally:
                context_ops.leave(inner)
            assert span.gym_attempts == 2
        finally:
            context_ops.leave(token)
        never()  # no counting span current: nothing counted
        assert span.gym_attempts == 2
    (span,) = _client_spans(spans)
    assert "http.request.resend_count" not in span.attributes  # one attempt: no resend


# -- the callee, named on the CLIENT span ------------------------------------------------


def test_client_span_names_its_gym_callee_and_route(instrumented, spans, monkeypatch):
    """A call to a Gym server of the fleet: the callee's server name and its route (no
    per-rollout prefix) as attributes, and the span named ``{method} {url.template}`` (HTTP
    semantic conventions; the rollout id templated out); any other URL, ``{method}``."""
    from gym_autoinstr import attributes as attr
    from gym_autoinstr.advice import fleet_addresses

    names: dict[str, str] = {}
    monkeypatch.setattr(fleet_addresses._state, "names", names)
    with serve(_echo_app()) as base:
        assert _call(f"{base}/echo", json={}) == 200  # not (yet) a server of the fleet
        names[base[len("http://") :]] = "my_resources"
        assert _call(f"{base}/echo?api_key=SECRET", json={}) == 200
        assert _call(f"{base}/ng-rollout/4-2/v1/responses", json={}) == 200
    outside, echo, prefixed_call = _client_spans(spans)
    assert [s.name for s in (outside, echo, prefixed_call)] == [
        "POST",
        "POST /echo",
        "POST /ng-rollout/{rollout_id}/v1/responses",
    ]
    assert "url.template" not in outside.attributes
    assert echo.attributes["url.template"] == "/echo"
    assert prefixed_call.attributes["url.template"] == "/ng-rollout/{rollout_id}/v1/responses"
    assert attr.DESTINATION not in outside.attributes and attr.DESTINATION_ROUTE not in outside.attributes
    assert echo.attributes[attr.DESTINATION] == "my_resources"
    assert echo.attributes[attr.DESTINATION_ROUTE] == "/echo"
    assert prefixed_call.attributes[attr.DESTINATION] == "my_resources"
    assert prefixed_call.attributes[attr.DESTINATION_ROUTE] == "/v1/responses"
    assert prefixed_call.attributes["nemo.gym.rollout.id"] == "4-2"


def test_the_client_span_ends_when_the_whole_response_is_in_not_at_its_headers(instrumented, spans):
    """Gym's request returns at the response's headers; the body may come later (a
    callee's middleware streams it).  The CLIENT span lasts until its last byte is in, so
    the callee's SERVER span (ending at its last body message) never outlives it; the
    body is not read for that (Gym reads it, or not, as before)."""
    import asyncio
    import time

    from nemo_gym import server_utils

    async def slow_body(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"{}"})

    marks = {}
    with serve(slow_body) as base:

        async def go():
            response = await server_utils.request("POST", f"{base}/slow", json={})
            marks["headers"] = time.time_ns()
            await response.read()
            marks["body"] = time.time_ns()
            return response

        run_async(go())
    (span,) = _client_spans(spans)
    assert marks["headers"] - span.start_time < 0.2e9  # the headers came at once
    assert span.end_time >= marks["headers"] + 0.2e9  # the span waited for the body
    assert span.end_time <= marks["body"]


def test_a_body_gym_never_reads_still_ends_the_span_when_it_is_in(instrumented, spans):
    import time

    from nemo_gym import server_utils

    with serve(_echo_app()) as base:

        async def go():
            response = await server_utils.request("POST", f"{base}/echo", json={})
            return response.status  # the body is never read

        assert run_async(go()) == 200
        deadline = time.monotonic() + 5
        while not _client_spans(spans) and time.monotonic() < deadline:
            time.sleep(0.05)
    (span,) = _client_spans(spans)
    assert span.attributes["http.response.status_code"] == 200 and span.end_time >= span.start_time
