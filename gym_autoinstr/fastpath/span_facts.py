"""A few facts of each span, written beside the run directory's segments so that reading a
run's rollouts does not parse every span's JSON again (``commands/runs``).

The embedded default writes each batch of spans as one OTLP-JSON line of a segment
(``setup/segments.py``); with it, one line of the segment's facts file
(``<stem>-<pid>.NNNN.facts``): ``{"from": M, "at": N, "groups": [{"resource": {...}, "spans": [...]}]}``,
``from`` and ``at`` being where the batch's line starts and ends in the (plain) segment, ``resource`` the
few resource attributes a reader keeps, and per span a list:

    [trace id (hex), start ns, end ns, flags (1 error, 2 a root, kind << 2: OTLP's number),
     seam (``seam``: 1 model, 2 tools, 3 verify, else 0), name (a root's or a span's whose
     parent is in another process, gym.rollout's, gym.verify's; else 0), span id (the same
     roots'; else 0), [kept attributes: OTLP-JSON
     KeyValues] or 0, [[trace id, span id], ...] or 0]

the attributes being those ``KEYS`` names (``ROOT_KEYS`` on a root) and any ``nemo.gym.job.*``.  A few µs a span
(``fact``, when the span ends, beside its JSON); a reader checks ``at`` against the
segment's size and reads the spans themselves past it (a process killed between the two
writes).  Files written by anything else (a Collector) have no facts: their spans are read."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import StatusCode

from gym_autoinstr import attributes as attr

# The attributes a reader of rollouts uses: outcome (reward, mask, task and repeat, tokens,
# failure), the route (verify or a tool), and those ``view --attr`` answers from the table;
# on a span without a parent (a trace's root) also what names it (callee, method).
KEYS = frozenset(
    {
        *(attr.REWARD, attr.MASK_SAMPLE, attr.TASK_INDEX, attr.ROLLOUT_INDEX, attr.ROLLOUT_ID, attr.JOB_ID),
        *(attr.FAILURE_STAGE, attr.ROLLOUT_INPUT_TOKENS, attr.ROLLOUT_OUTPUT_TOKENS, attr.INPUT_TOKENS),
        *(attr.OUTPUT_TOKENS, attr.OPERATION, attr.REQUEST_MODEL, attr.RESPONSE_MODEL, attr.AGENT_NAME),
        *(attr.TOOL_NAME, attr.SERVER_TYPE, attr.SERVER_NAME, attr.RUN_ID, attr.HTTP_ROUTE, attr.ERROR_TYPE),
        *(attr.SERVICE_NAME, attr.HOST_NAME),
    }
)
ROOT_KEYS = KEYS | {
    attr.DESTINATION,
    attr.DESTINATION_ROUTE,
    attr.URL_FULL,
    attr.SERVER_ADDRESS,
    attr.HTTP_REQUEST_METHOD,
}
RESOURCE_KEYS = frozenset({attr.SERVICE_NAME, attr.SERVER_TYPE, attr.SERVER_NAME, attr.RUN_ID, attr.HOST_NAME})
_ERROR = StatusCode.ERROR
_text = json.encoder.encode_basestring_ascii  # (C) a JSON string, quotes included
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=str).encode


# What a SERVER span's time is, by the Gym server type of its process and its route
# (``commands/runs`` adds each up per trace: where a rollout's time went)
NO_SEAM, MODEL, TOOLS, VERIFY = 0, 1, 2, 3
_NOT_TOOLS = ("/seed_session", "/aggregate_metrics")
_SERVER_TYPES: dict[int, tuple[Any, object]] = {}


def seam(kind: int, server_type: object, route: str) -> int:
    """``kind`` OTLP's number (2: SERVER); ``route`` the span's ``http.route``, else its name's path."""
    if kind != 2:
        return NO_SEAM
    if server_type == "responses_api_models":
        return MODEL
    if server_type == "resources_servers":
        return VERIFY if route.endswith("/verify") else NO_SEAM if route.endswith(_NOT_TOOLS) else TOOLS
    return NO_SEAM


def _server_type(resource: Any) -> object:
    known = _SERVER_TYPES.get(id(resource))
    if known is None or known[0] is not resource:
        known = _SERVER_TYPES[id(resource)] = (
            resource,
            (getattr(resource, "attributes", None) or {}).get(attr.SERVER_TYPE),
        )
    return known[1]


def fact(span: Any, kept: list[str]) -> str:
    """One ended SDK span's facts, as JSON text; ``kept``: the OTLP-JSON KeyValue pairs of
    its attributes that ``KEYS`` (``ROOT_KEYS``) names (``wire_json.span`` gives them, from
    its one walk of the attributes: a second walk would cost as much as the span's JSON)."""
    context = span.context
    kind = span.kind.value + 1
    root = span.parent is None
    flags = (1 if span.status.status_code is _ERROR else 0) | (2 if root else 0) | (kind << 2)
    part = NO_SEAM
    if kind == 2:
        route = span.attributes.get(attr.HTTP_ROUTE) if span.attributes else None
        part = seam(kind, _server_type(span.resource), str(route or span.name.partition(" ")[2]))
    # a name and span id for a root, and for the first span of this process in the trace (its
    # parent elsewhere: the trace's earliest span here, what names it when its root is missing)
    parent = span.parent
    local_root = root or parent.is_remote
    name = span.name
    named = _text(name) if local_root or name in NAMED else "0"
    links = "0"
    if span.links:
        links = "[" + ",".join(f'["{k.context.trace_id:032x}","{k.context.span_id:016x}"]' for k in span.links) + "]"
    return (
        f'["{context.trace_id:032x}",{span.start_time or 0},{span.end_time or 0},{flags},{part},{named},'
        f"{chr(34) + format(context.span_id, '016x') + chr(34) if root else 0},"
        f"{'[' + ','.join(kept) + ']' if kept else 0},{links}]"
    )


NAMED = frozenset({"gym.rollout", "gym.verify"})  # the spans a trace's reward is looked for on after its root


def resource(sdk_resource: Any) -> str:
    """The resource attributes a reader keeps, as a JSON object's text."""
    attributes = getattr(sdk_resource, "attributes", None) or {}
    return _dumps({key: value for key, value in attributes.items() if key in RESOURCE_KEYS})


def group(resource_text: str, facts: list[str]) -> str:
    return '{"resource":' + resource_text + ',"spans":[' + ",".join(facts) + "]}"


def line(at: int, groups: list[str]) -> str:
    """A facts file's line for a batch whose segment line ends at byte ``at``."""
    return '{"at":' + str(at) + ',"groups":[' + ",".join(groups) + "]}"
