"""Ingress middleware on real FastAPI apps served by real uvicorn, and on bare ASGI apps: one
SERVER span per request (its name, attributes, status and end), probes and turned-off groups
untraced, and the caller's context as the handler sees it.  Requests the sampler drops:
``test_ingress_dropped.py``."""

from __future__ import annotations

import urllib.request

from fastapi import BackgroundTasks, FastAPI
from opentelemetry.trace import SpanKind, StatusCode

from gym_autoinstr.advice.ingress import instrument_app
from tests.advice.ingress_helpers import PARENT_ID, TRACE_ID, _http_scope, _seeing_middleware, _served, _server_spans
from tests.harness.servers import post_json, serve


def _gym_like_app() -> FastAPI:
    app = FastAPI()

    @app.post("/run")
    async def run(body: dict):
        return {"echo": body}

    @app.post("/ng-rollout/{rollout_id}/v1/responses")
    async def responses(rollout_id: str, body: dict):
        return {"rollout": rollout_id}

    @app.post("/boom")
    async def boom(body: dict):
        raise RuntimeError("secret prompt text")

    @app.get("/")
    async def liveness():
        return {"status": "ok"}

    return app


def test_one_server_span_adopting_the_callers_context(instrumented, spans):
    app = _gym_like_app()
    assert instrument_app(app, "my_agent")
    with serve(app) as base:
        status, _ = post_json(f"{base}/run?api_key=SECRET", {"x": 1}, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    assert status == 200
    (span,) = _server_spans(spans)  # FastAPI's built-in telemetry is off: exactly one
    assert span.name == "POST /run"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.attributes["http.route"] == "/run"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["url.path"] == "/run"
    assert not any("SECRET" in str(v) for v in span.attributes.values())
    # no ASGI send/receive children (this server's one-off start-up span may be there)
    assert [
        s.name for s in spans.get_finished_spans() if s.parent is not None and s.parent.span_id == span.context.span_id
    ] == []
    assert {s.name for s in spans.get_finished_spans() if s.kind != SpanKind.SERVER} <= {"gym.server.startup"}


def test_route_template_names_the_span(instrumented, spans):
    app = _gym_like_app()
    instrument_app(app, "model")
    with serve(app) as base:
        post_json(f"{base}/ng-rollout/r-42/v1/responses", {})
    (span,) = _server_spans(spans)
    assert span.name == "POST /ng-rollout/{rollout_id}/v1/responses"
    assert span.attributes["url.path"] == "/ng-rollout/r-42/v1/responses"


def test_probes_are_not_traced(instrumented, spans):
    app = _gym_like_app()
    instrument_app(app, "agent")
    with serve(app) as base:
        with urllib.request.urlopen(f"{base}/", timeout=10) as response:
            assert response.status == 200
    assert _server_spans(spans) == []


def test_server_error_sets_error_status_without_the_message(instrumented, spans):
    app = _gym_like_app()
    instrument_app(app, "agent")
    with serve(app) as base:
        status, _ = post_json(f"{base}/boom", {})
    assert status == 500
    (span,) = _server_spans(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["http.response.status_code"] == 500
    assert span.attributes["error.type"] == "RuntimeError"
    assert "secret prompt text" not in str(span.status.description) + str(span.attributes) + str(span.events)


def test_groups_off_means_no_server_spans(instrumented, spans, monkeypatch):
    from gym_autoinstr.telemetry import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset())
    app = _gym_like_app()
    instrument_app(app, "agent")
    with serve(app) as base:
        status, body = post_json(f"{base}/run", {"y": 2})
    assert (status, body) == (200, {"echo": {"y": 2}})
    assert spans.get_finished_spans() == ()


def test_instrumenting_twice_adds_one_middleware(instrumented, spans):
    app = _gym_like_app()
    assert instrument_app(app, "agent") is True
    assert instrument_app(app, "agent") is False
    with serve(app) as base:
        post_json(f"{base}/run", {})
    assert len(_server_spans(spans)) == 1


def test_shutdown_flushes_through_lifespan(instrumented, spans, monkeypatch):
    from gym_autoinstr.advice import ingress

    calls: list[str] = []

    async def fake_flush_async(timeout=None, *, reason=""):
        calls.append(reason)
        return True

    monkeypatch.setattr(ingress, "flush_async", fake_flush_async)
    app = _gym_like_app()
    instrument_app(app, "agent")
    with serve(app):
        pass
    assert calls == ["server shutdown"]


def test_route_found_behind_gyms_rollout_prefix_middleware(instrumented, spans):
    """Gym 0.5+ strips /ng-rollout/<id> in a copy of the scope before routing."""

    class StripRolloutPrefix:  # the shape of Gym's RolloutContextMiddleware
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            path = scope.get("path", "")
            if scope.get("type") == "http" and path.startswith("/ng-rollout/"):
                rest = "/" + path[len("/ng-rollout/") :].partition("/")[2]
                scope = {**scope, "path": rest, "raw_path": rest.encode()}
            await self.app(scope, receive, send)

    app = FastAPI()

    @app.post("/v1/responses")
    async def responses(body: dict):
        return {"ok": True}

    app.add_middleware(StripRolloutPrefix)
    instrument_app(app, "model")
    with serve(app) as base:
        status, _ = post_json(f"{base}/ng-rollout/0-7/v1/responses", {})
    assert status == 200
    (span,) = _server_spans(spans)
    assert span.name == "POST /v1/responses"
    assert span.attributes["http.route"] == "/v1/responses"
    assert span.attributes["url.path"] == "/ng-rollout/0-7/v1/responses"


def test_an_unsampled_caller_gets_no_span_and_its_context_reaches_the_handler(instrumented, spans):
    from opentelemetry import trace

    app = FastAPI()
    seen: list = []

    @app.post("/run")
    async def run(body: dict):
        seen.append(trace.get_current_span().get_span_context())
        return {}

    assert instrument_app(app, "my_agent")
    with serve(app) as base:
        status, _ = post_json(f"{base}/run", {}, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})
        post_json(f"{base}/run", {}, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    assert status == 200
    dropped, kept = seen
    assert format(dropped.trace_id, "032x") == TRACE_ID and dropped.span_id != int(PARENT_ID, 16)  # its own (W3C)
    assert not dropped.trace_flags.sampled and not dropped.is_remote
    (span,) = _server_spans(spans)  # the sampled request's only
    assert span.context.span_id == kept.span_id and span.parent.span_id == int(PARENT_ID, 16)


def test_the_middleware_changes_no_context_until_its_coroutine_runs(instrumented, spans):
    """The coroutine the middleware hands back may run in another task than the call (a
    server wrapping it in ``create_task``): an unsampled caller's context is attached and
    detached inside it, never in the caller's context."""
    import asyncio

    from opentelemetry import context as otel_context

    middleware, seen = _seeing_middleware("context_server")
    sent: list = []

    async def send(message):
        sent.append(message["type"])

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    scope = _http_scope("/run", headers=[(b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00".encode())])

    async def caller():
        before = otel_context.get_current()
        awaitable = middleware(scope, receive, send)
        assert otel_context.get_current() is before
        await asyncio.get_running_loop().create_task(awaitable)
        assert otel_context.get_current() is before

    asyncio.run(caller())
    (inside,) = seen
    assert format(inside.trace_id, "032x") == TRACE_ID and inside.span_id != int(PARENT_ID, 16)
    assert not inside.trace_flags.sampled
    assert sent == ["http.response.start", "http.response.body"]
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []


def test_the_callers_context_is_read_the_same_from_headers_of_any_shape(instrumented, spans):
    """The ASGI headers as a list, a tuple, a one-shot iterable, or with a repeated header
    of another name: every shape gets the caller's context, sampled or not; a tracestate
    alone (no traceparent) makes a root."""
    import asyncio

    middleware, seen = _seeing_middleware("shapes_server")
    host = (b"host", b"127.0.0.1:8000")

    def request(headers):
        asyncio.run(_served(middleware, _http_scope("/run", headers=headers)))
        return seen[-1]

    for flags in ("00", "01"):
        parent = (b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-{flags}".encode())
        shapes = {
            "list": [host, parent],
            "tuple": (host, parent),
            "repeated header": [host, (b"accept", b"*/*"), (b"accept", b"text/plain"), parent],
            "one-shot iterable": iter([host, parent]),
        }
        for shape, headers in shapes.items():
            context = request(headers)
            assert format(context.trace_id, "032x") == TRACE_ID, (flags, shape)
            # no span (00) or our SERVER span (01): a span id of our own, not the caller's
            assert context.span_id != int(PARENT_ID, 16) and not context.is_remote, shape
    servers = _server_spans(spans)
    assert len(servers) == 4 and {s.parent.span_id for s in servers} == {int(PARENT_ID, 16)}

    root = request([host, (b"tracestate", b"vendor=1")])
    assert format(root.trace_id, "032x") != TRACE_ID and _server_spans(spans)[-1].parent is None


def test_the_server_span_ends_when_the_response_is_sent_not_after_the_apps_after_work(instrumented, spans):
    """A FastAPI background task runs after the response, inside the app's call: the
    caller has its answer by then, so the SERVER span (and the request duration) ends
    when the last body message went out, not when the app returns."""
    import asyncio
    import time

    marks: dict[str, int] = {}
    app = FastAPI()

    async def after_work():
        marks["after_work_started"] = time.time_ns()
        await asyncio.sleep(0.3)
        marks["app_done"] = time.time_ns()

    @app.post("/verify")
    async def verify(body: dict, tasks: BackgroundTasks):
        tasks.add_task(after_work)
        return {"reward": 1.0}

    assert instrument_app(app, "my_resources")
    with serve(app) as base:
        before = time.time_ns()
        status, _ = post_json(f"{base}/verify", {"x": 1})
        answered = time.time_ns()
        deadline = time.monotonic() + 5
        while "app_done" not in marks and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
    assert status == 200
    (span,) = [s for s in _server_spans(spans) if s.name == "POST /verify"]
    assert before <= span.start_time < span.end_time <= answered  # the caller had its answer
    assert span.end_time <= marks["after_work_started"] < marks["app_done"]


def test_a_relayed_response_ends_the_span_at_its_last_byte_not_at_the_closing_empty_message(instrumented, spans):
    """Starlette's BaseHTTPMiddleware (Gym's session middleware) relays a response as its
    bytes, then an empty closing message, which a busy loop may send milliseconds later:
    the caller has the whole answer at the last byte, and so the span ends there."""
    import asyncio
    import time

    from gym_autoinstr.advice.ingress import GymServerMiddleware

    marks: dict[str, int] = {}

    async def relayed(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        marks["bytes_out"] = time.time_ns()
        await asyncio.sleep(0.2)  # the loop busy elsewhere
        marks["closing"] = time.time_ns()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    asyncio.run(_served(GymServerMiddleware(relayed, server_name="my_resources"), _http_scope("/verify")))
    (span,) = [s for s in _server_spans(spans) if s.name.startswith("POST")]
    assert span.end_time <= marks["bytes_out"] < marks["closing"]
