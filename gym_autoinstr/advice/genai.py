"""Model calls in GenAI terms, without their content.

A ``gym.model.*`` span says which model was asked and which answered, in OpenTelemetry's
GenAI vocabulary (``gen_ai.*``).  Only scalar metadata is read: the ``model`` names.
Prompts, completions and tool arguments never leave the request or response object.

Token counts are not on these spans: the agent's CLIENT span of the same call carries them
(``outcome.py``: read when Gym parses the answer), and the GenAI UIs add a trace's
``gen_ai.usage.*`` up over its spans, so both would count each call twice.  (A 0.7 handler
returns a ready ``Response`` whose body is JSON bytes: nothing is read from it.)
"""

from __future__ import annotations

from typing import Any

from gym_autoinstr import attributes as attr
from gym_autoinstr.advice.outcome import field, is_model

OPERATION = "chat"  # all three routes are chat-style generation in GenAI semconv terms


def request_attributes(args: tuple, kwargs: dict, server: Any) -> dict[str, Any]:
    """``gen_ai.operation.name`` and ``gen_ai.request.model`` for an inbound model call."""
    attributes: dict[str, Any] = {attr.OPERATION: OPERATION}
    body = kwargs.get("body")
    if body is None:
        body = next((a for a in args if isinstance(a, dict) or is_model(a)), None)
    model = field(body, "model") if body is not None else None
    if not isinstance(model, str) or not model:
        # The server rewrites the model name for its upstream (``openai_model`` etc.).
        config = getattr(server, "config", None)
        for key in ("openai_model", "model"):
            candidate = getattr(config, key, None)
            if isinstance(candidate, str) and candidate:
                model = candidate
                break
    if isinstance(model, str) and model:
        attributes[attr.REQUEST_MODEL] = model
    return attributes


def response_attributes(result: Any) -> dict[str, Any]:
    """``gen_ai.response.model`` from a handler's return value, if present (nothing from a
    response whose body is already bytes)."""
    if not is_model(result) and isinstance(getattr(result, "body", None), (bytes, bytearray)):
        return {}
    model = field(result, "model")
    return {attr.RESPONSE_MODEL: model} if isinstance(model, str) and model else {}
