"""What the ingress test modules share (``test_ingress.py``, ``test_ingress_dropped.py``): a
caller's ids, the ASGI scope uvicorn makes for a POST, the SERVER spans recorded, and a bare
ASGI app that notes the span context it runs under."""

from __future__ import annotations

from opentelemetry.trace import SpanKind

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _http_scope(path: str) -> dict:
    """The ASGI scope of a POST to ``path`` on 127.0.0.1:8000, as uvicorn makes it."""
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "scheme": "http",
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1:8000")],
    }


def _server_spans(spans):
    return [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]


def _context_seeing_app(seen: list):
    """A bare ASGI app that notes the span context current while it runs, and its receive."""
    from opentelemetry import trace

    async def app(scope, receive, send):
        seen.append(trace.get_current_span().get_span_context())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    return app, receive
