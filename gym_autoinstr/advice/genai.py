"""Model calls in GenAI terms, without their content.

A ``gym.model.*`` span says which model was asked, which answered and how many tokens
it cost, in OpenTelemetry's GenAI vocabulary (``gen_ai.*``).  Only scalar metadata is
read: the ``model`` names and the ``usage`` counters.  Prompts, completions and tool
arguments never leave the request or response object.

Gym's three model routes carry usage in two dialects: the Responses and Anthropic
Messages APIs say ``input_tokens``/``output_tokens``, Chat Completions says
``prompt_tokens``/``completion_tokens``.  A handler may return a pydantic model, a
plain dict, or (0.7+) a ready ``Response`` whose body is JSON bytes.
"""

from __future__ import annotations

import json
from typing import Any

OPERATION = "chat"  # all three routes are chat-style generation in GenAI semconv terms

# Gym 0.7 hands back model responses as JSON bytes: reading the usage means parsing the
# body a second time, on the request's path.  Larger bodies keep their spans without
# token counts rather than pay that twice.
_MAX_PARSED_BODY = 1024 * 1024


def _field(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def request_attributes(args: tuple, kwargs: dict, server: Any) -> dict[str, Any]:
    """``gen_ai.operation.name`` and ``gen_ai.request.model`` for an inbound model call."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": OPERATION}
    body = kwargs.get("body")
    if body is None:
        body = next((a for a in args if isinstance(a, dict) or hasattr(a, "model_fields")), None)
    model = _field(body, "model") if body is not None else None
    if not isinstance(model, str) or not model:
        # The server rewrites the model name for its upstream (``openai_model`` etc.).
        config = getattr(server, "config", None)
        for key in ("openai_model", "model"):
            candidate = getattr(config, key, None)
            if isinstance(candidate, str) and candidate:
                model = candidate
                break
    if isinstance(model, str) and model:
        attributes["gen_ai.request.model"] = model
    return attributes


def _response_payload(result: Any) -> Any:
    body = getattr(result, "body", None)
    if isinstance(body, (bytes, bytearray)) and not hasattr(result, "model_fields"):
        media_type = str(getattr(result, "media_type", "") or "")
        if "json" not in media_type or len(body) > _MAX_PARSED_BODY:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None
    return result


def response_attributes(result: Any) -> dict[str, Any]:
    """``gen_ai.response.model`` and token usage from a handler's return value, if present."""
    payload = _response_payload(result)
    if payload is None:
        return {}
    attributes: dict[str, Any] = {}
    model = _field(payload, "model")
    if isinstance(model, str) and model:
        attributes["gen_ai.response.model"] = model
    usage = _field(payload, "usage")
    if usage is not None:
        for name, keys in (
            ("gen_ai.usage.input_tokens", ("input_tokens", "prompt_tokens")),
            ("gen_ai.usage.output_tokens", ("output_tokens", "completion_tokens")),
        ):
            for key in keys:
                value = _field(usage, key)
                if isinstance(value, int) and not isinstance(value, bool):
                    attributes[name] = value
                    break
    return attributes
