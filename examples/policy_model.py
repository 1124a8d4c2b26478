#!/usr/bin/env python3
"""A deterministic, OpenAI-compatible "policy model" endpoint (stdlib only).

It stands in for the real LLM behind NeMo Gym's ``responses_api_models/openai_model``
server, which forwards ``POST {openai_base_url}/responses`` and
``POST {openai_base_url}/chat/completions`` to it (``openai_base_url`` is usually
``http://HOST:PORT/v1``).

Behaviour:

* the first turn (no tool result in the input) calls the first function tool the
  request offers, e.g. ``get_weather({"city": "San Francisco"})``;
* a turn whose input carries a tool result (``function_call_output`` item, or a
  ``tool`` chat message) answers with final assistant text;
* a request without tools answers with text straight away (with ``--answer TEXT``,
  that text: e.g. a fenced python block for Gym's ``code_gen`` verifier).

Every answer echoes the requested ``model`` and carries ``usage``.  Ids are
counter based; nothing is random and ``created`` timestamps are fixed.

Test hooks (never part of the OpenAI API):

* ``GET /_received``: JSON list of ``{"seq", "method", "path", "traceparent",
  "tracestate"}`` for every API request received (headers only, never bodies);
* ``POST /_reset``: forget the recorded requests;
* ``POST /_drop`` with ``{"count": N}``: close the connection of each of the next N
  model calls without answering (the caller sees the server disconnect).

Run: ``python examples/policy_model.py --host 127.0.0.1 --port 0``; it prints
``policy model listening on http://HOST:PORT`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import socket
import sys
from typing import Any

CREATED_AT = 1_700_000_000  # fixed: responses are byte-for-byte reproducible
DEFAULT_MODEL = "policy-model"
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


# ---------------------------------------------------------------------------
# deterministic "model"
# ---------------------------------------------------------------------------


def _strings(value: Any) -> list[str]:
    """All string leaves of a JSON value (used for a crude, stable token count)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def count_tokens(value: Any) -> int:
    return max(1, sum(len(s.split()) for s in _strings(value)))


def example_arguments(parameters: Any, city: str = "San Francisco") -> dict[str, Any]:
    """Deterministic arguments that satisfy a simple JSON schema."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties") or {}
    if not isinstance(properties, dict):
        return {}
    wanted = parameters.get("required") or list(properties)
    args: dict[str, Any] = {}
    for name in wanted:
        schema = properties.get(name) or {}
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if name == "city":
            args[name] = city
        elif isinstance(schema, dict) and schema.get("enum"):
            args[name] = schema["enum"][0]
        elif kind == "integer":
            args[name] = 1
        elif kind == "number":
            args[name] = 1.0
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = f"example {name}"
    return args


class PolicyModel:
    def __init__(self, city: str = "San Francisco", answer: str | None = None) -> None:
        self.city = city  # the tool argument it asks for (tests plant canaries here)
        self.answer = answer  # the final text when no tool was offered (e.g. a code block)
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.received: list[dict[str, Any]] = []

    def _next(self) -> int:
        return next(self._ids)

    def record(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.received.append(
            {
                "seq": next(self._seq),
                "method": method,
                "path": path,
                "traceparent": headers.get("traceparent"),
                "tracestate": headers.get("tracestate"),
            }
        )

    # ---- /v1/responses ----

    def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise HttpError(400, "streaming is not supported by this test model")
        model = body.get("model") or DEFAULT_MODEL
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            items = []
        tool_outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        tools = [t for t in (body.get("tools") or []) if isinstance(t, dict) and t.get("type") == "function"]
        n = self._next()
        if tools and not tool_outputs:
            tool = tools[0]
            arguments = json.dumps(example_arguments(tool.get("parameters"), self.city), sort_keys=True)
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n:06d}",
                    "call_id": f"call_{n:06d}",
                    "name": tool.get("name", "tool"),
                    "arguments": arguments,
                    "status": "completed",
                }
            ]
            out_tokens = count_tokens(arguments)
        else:
            text = (
                self.answer
                if self.answer is not None and not tools
                else self._final_text([o.get("output") for o in tool_outputs])
            )
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n:06d}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
            out_tokens = count_tokens(text)
        in_tokens = count_tokens([items, body.get("instructions")])
        return {
            "id": f"resp_{n:06d}",
            "object": "response",
            "created_at": CREATED_AT,
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "instructions": body.get("instructions"),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": None,
            "metadata": body.get("metadata") or {},
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "error": None,
            "incomplete_details": None,
            "usage": {
                "input_tokens": in_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": in_tokens + out_tokens,
            },
        }

    # ---- /v1/chat/completions ----

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise HttpError(400, "streaming is not supported by this test model")
        model = body.get("model") or DEFAULT_MODEL
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise HttpError(400, "'messages' must be a list")
        tool_messages = [m for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
        tools = [
            t.get("function") or {}
            for t in (body.get("tools") or [])
            if isinstance(t, dict) and t.get("type") == "function"
        ]
        n = self._next()
        if tools and not tool_messages:
            tool = tools[0]
            arguments = json.dumps(example_arguments(tool.get("parameters"), self.city), sort_keys=True)
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n:06d}",
                        "type": "function",
                        "function": {"name": tool.get("name", "tool"), "arguments": arguments},
                    }
                ],
            }
            finish_reason = "tool_calls"
            out_tokens = count_tokens(arguments)
        else:
            text = (
                self.answer
                if self.answer is not None and not tools
                else self._final_text([m.get("content") for m in tool_messages])
            )
            message = {"role": "assistant", "content": text}
            finish_reason = "stop"
            out_tokens = count_tokens(text)
        in_tokens = count_tokens(messages)
        return {
            "id": f"chatcmpl-{n:06d}",
            "object": "chat.completion",
            "created": CREATED_AT,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": in_tokens,
                "completion_tokens": out_tokens,
                "total_tokens": in_tokens + out_tokens,
            },
        }

    @staticmethod
    def _final_text(tool_results: list[Any]) -> str:
        if not tool_results:
            return "Hello! I am a deterministic test policy model."
        last = tool_results[-1]
        if not isinstance(last, str):
            last = json.dumps(last, sort_keys=True)
        return f"Based on the tool result, here is the answer: {last[:200]}"

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": DEFAULT_MODEL, "object": "model", "created": CREATED_AT, "owned_by": "gym-autoinstr"}],
        }


# ---------------------------------------------------------------------------
# minimal HTTP/1.1 server on asyncio streams
# ---------------------------------------------------------------------------


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, str, dict[str, str]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise HttpError(400, "incomplete request head") from None
        return None  # clean EOF between requests
    except asyncio.LimitOverrunError:
        raise HttpError(413, "request head too large") from None
    lines = raw.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(400, "malformed request line") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    return method.upper(), target, version.upper(), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        total = 0
        while True:
            size_line = await reader.readline()
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise HttpError(413, "request body too large")
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    length = int(headers.get("content-length") or 0)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, "request body too large")
    return await reader.readexactly(length) if length else b""


def _response_bytes(status: int, payload: Any, keep_alive: bool) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
        "\r\n"
    ).encode("latin-1")
    return head + body  # one buffer -> one write -> no Nagle/delayed-ACK stall


def _error(status: int, message: str, code: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "param": None, "code": None}}


class _Drop(Exception):
    """Close this connection without an answer (the ``/_drop`` test hook)."""


class Server:
    def __init__(self, model: PolicyModel, latency_s: float = 0.0) -> None:
        self.model = model
        self.latency_s = latency_s
        self.writers: set = set()
        self.drops = 0

    async def dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        route = path[3:] if path.startswith("/v1/") else path
        if route == "/_received" and method == "GET":
            return 200, list(self.model.received)
        if route == "/_reset" and method == "POST":
            self.model.received.clear()
            return 200, {"ok": True}
        if route == "/_drop" and method == "POST":
            self.drops = int(json.loads(body or b"{}").get("count", 1))
            return 200, {"ok": True}
        if route in ("/health", "/_health") and method == "GET":
            return 200, {"status": "ok"}
        if self.drops > 0 and route in ("/responses", "/chat/completions"):
            self.drops -= 1
            raise _Drop()

        self.model.record(method, path, headers)
        handlers = {
            "/responses": self.model.responses,
            "/chat/completions": self.model.chat_completions,
        }
        if route == "/models":
            if method != "GET":
                raise HttpError(405, f"{method} not allowed on {path}")
            return 200, self.model.models()
        handler = handlers.get(route)
        if handler is None:
            raise HttpError(404, f"no route for {method} {path}", "not_found_error")
        if method != "POST":
            raise HttpError(405, f"{method} not allowed on {path}")
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            raise HttpError(400, "request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "request body must be a JSON object")
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return 200, handler(payload)

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.writers.add(writer)
        try:
            while True:
                keep_alive = False
                try:
                    head = await _read_head(reader)
                    if head is None:
                        break
                    method, target, version, headers = head
                    connection = headers.get("connection", "").lower()
                    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
                    if headers.get("expect", "").lower() == "100-continue":
                        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    body = await _read_body(reader, headers)
                    path = target.split("?", 1)[0]
                    status, payload = await self.dispatch(method, path, headers, body)
                except HttpError as exc:
                    status, payload = exc.status, _error(exc.status, exc.message, exc.code)
                    keep_alive = keep_alive and exc.status not in (400, 413)
                except (asyncio.IncompleteReadError, ConnectionError, _Drop):
                    break
                except Exception as exc:  # noqa: BLE001 - answer 500 rather than drop
                    status, payload = 500, _error(500, f"{type(exc).__name__}: {exc}", "server_error")
                writer.write(_response_bytes(status, payload, keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # client went away, or shutting down with an idle keep-alive connection
        finally:
            self.writers.discard(writer)
            try:
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass


async def serve(
    host: str, port: int, latency_ms: float = 0.0, city: str = "San Francisco", answer: str | None = None
) -> None:
    server_impl = Server(PolicyModel(city, answer), latency_s=latency_ms / 1000.0)
    server = await asyncio.start_server(server_impl.handle_connection, host, port, limit=MAX_HEADER_BYTES, backlog=1024)
    bound = server.sockets[0].getsockname()
    shown_host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"policy model listening on http://{shown_host}:{bound[1]}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    async with server:
        await stop.wait()
        server.close()
        for writer in list(server_impl.writers):  # idle keep-alive connections
            writer.close()
        await asyncio.sleep(0.05)
    print("policy model stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added to each model call")
    parser.add_argument("--city", default="San Francisco", help="the city it asks the weather tool about")
    parser.add_argument(
        "--answer", default=None, help="final text when the request offers no tool (e.g. a fenced code block)"
    )
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.latency_ms, args.city, args.answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
