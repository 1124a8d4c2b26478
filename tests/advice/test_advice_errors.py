"""An exception inside our advice never reaches Gym: requests, served routes and seams
all behave as if uninstrumented when the telemetry half breaks."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from gym_autoinstr._log import forget_said
from gym_autoinstr.advice import egress, ingress
from gym_autoinstr.advice.ingress import instrument_app
from tests.harness.servers import post_json, run_async, serve

pytest.importorskip("nemo_gym")


class Broken:
    def start_span(self, *args, **kwargs):
        raise RuntimeError("tracer exploded")


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict):
        return {"echo": body}

    return app


async def _request(url: str):
    from nemo_gym import server_utils

    response = await server_utils.request("POST", url, json={"n": 1})
    return response.status, await response.json()


def test_a_failing_tracer_leaves_requests_and_responses_intact(instrumented, spans, monkeypatch, caplog):
    forget_said()
    monkeypatch.setattr(egress, "tracer", lambda: Broken())
    monkeypatch.setattr(ingress, "tracer", lambda: Broken())
    app = _app()
    instrument_app(app, "agent")
    with serve(app) as base:
        assert run_async(_request(f"{base}/echo")) == (200, {"echo": {"n": 1}})
        assert post_json(f"{base}/echo", {"m": 2}) == (200, {"echo": {"m": 2}})
    assert "egress tracing skipped" in caplog.text and "ingress tracing skipped" in caplog.text


def test_a_failing_propagator_still_sends_the_request(instrumented, spans, monkeypatch, caplog):
    from opentelemetry.trace import SpanKind

    forget_said()

    from opentelemetry import propagate
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class Exploding(TraceContextTextMapPropagator):  # a user's own propagator, broken
        def inject(self, carrier, context=None, setter=None):
            raise ValueError("propagator exploded")

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(Exploding())
    try:
        app = _app()
        with serve(app) as base:
            assert run_async(_request(f"{base}/echo")) == (200, {"echo": {"n": 1}})
    finally:
        propagate.set_global_textmap(before)
    (client,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert client.attributes["http.response.status_code"] == 200  # still traced, just not propagated
    assert "trace context not injected" in caplog.text
