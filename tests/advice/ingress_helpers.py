"""What the ingress test modules share (``test_ingress.py``, ``test_ingress_dropped.py``): a
caller's ids, the ASGI scope uvicorn makes for a POST, the SERVER spans recorded, and our
middleware around a bare ASGI app that notes the span context it runs under."""

from __future__ import annotations

from opentelemetry.trace import SpanKind

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
HOST = (b"host", b"127.0.0.1:8000")


def _http_scope(path: str, *extra: tuple[bytes, bytes], headers=None) -> dict:
    """The ASGI scope of a POST to ``path`` on 127.0.0.1:8000, as uvicorn makes it: the
    host header and ``extra``, or ``headers`` as given (of any shape)."""
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "scheme": "http",
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "headers": [HOST, *extra] if headers is None else headers,
    }


def _server_spans(spans):
    return [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]


async def _served(middleware, scope: dict, send=None) -> None:
    """``middleware`` serves one request: ``scope``, a body of ``{}``; what it sends goes to
    ``send`` (by default nowhere)."""

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    async def nowhere(message):
        pass

    await middleware(scope, receive, send or nowhere)


def _seeing_middleware(server_name: str):
    """Our middleware around a bare ASGI app that notes the span context current while it
    runs: ``(middleware, seen)``."""
    from opentelemetry import trace

    from gym_autoinstr.advice.ingress import GymServerMiddleware

    seen: list = []

    async def app(scope, receive, send):
        seen.append(trace.get_current_span().get_span_context())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return GymServerMiddleware(app, server_name=server_name), seen
