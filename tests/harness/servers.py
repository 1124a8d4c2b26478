"""Small real HTTP servers for in-process tests (uvicorn in a thread)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.harness.ports import reserve_port


def free_port() -> int:
    return reserve_port()


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


_loop = None


def run_async(coroutine: Any) -> Any:
    """Run a coroutine on one event loop shared by the whole test session: Gym's global
    aiohttp client is bound to the loop it was created on."""
    global _loop
    import asyncio

    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coroutine)


def post_json(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    """POST a JSON body; the status and the decoded JSON answer ({} on an HTTP error)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, {}
