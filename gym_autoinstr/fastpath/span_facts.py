"""A few facts of each span, written beside the run directory's segments so that reading a
run's rollouts does not parse every span's JSON again (``commands/runs``).

The embedded default writes each batch of spans as one OTLP-JSON line of a segment
(``setup/segments.py``); with it, one line of the segment's facts file
(``<stem>-<pid>.NNNN.facts``): ``{"from": M, "at": N, "groups": [{"resource": {...}, "spans": [...]}]}``,
``from`` and ``at`` being where the batch's line starts and ends in the (plain) segment, ``resource`` the
few resource attributes a reader keeps, and per span a list:

    [trace id (hex), span id (hex), has a parent (0/1), name, kind (OTLP's number),
     start ns, end ns, error (0/1), [kept attributes, OTLP-JSON KeyValues] or 0,
     [[trace id, span id], ...] or 0]

the attributes being those ``KEYS`` names and any ``nemo.gym.job.*``.  A few µs a span
(``fact``, when the span ends, beside its JSON); a reader checks ``at`` against the
segment's size and reads the spans themselves past it (a process killed between the two
writes).  Files written by anything else (a Collector) have no facts: their spans are read."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import StatusCode

JOB_PREFIX = "nemo.gym.job."
# The attributes a reader of rollouts uses: outcome (reward, mask, task and repeat, tokens,
# failure), naming a root (callee, method), and those ``view --attr`` answers from the table.
KEYS = frozenset(
    {
        "nemo.gym.reward",
        "nemo.gym.mask_sample",
        "nemo.gym.task.index",
        "nemo.gym.rollout.index",
        "nemo.gym.rollout.id",
        "nemo.gym.job.id",
        "nemo.gym.failure.stage",
        "nemo.gym.rollout.usage.input_tokens",
        "nemo.gym.rollout.usage.output_tokens",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.agent.name",
        "gen_ai.tool.name",
        "nemo.gym.http.destination.server.name",
        "nemo.gym.http.destination.route",
        "nemo.gym.server.type",
        "nemo.gym.server.name",
        "nemo.gym.run.id",
        "url.full",
        "server.address",
        "http.request.method",
        "http.route",
        "http.response.status_code",
        "error.type",
        "service.name",
        "host.name",
    }
)
RESOURCE_KEYS = frozenset(
    {"service.name", "nemo.gym.server.type", "nemo.gym.server.name", "nemo.gym.run.id", "host.name"}
)
_ERROR = StatusCode.ERROR
_text = json.encoder.encode_basestring_ascii  # (C) a JSON string, quotes included
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=str).encode


def fact(span: Any, kept: list[str]) -> str:
    """One ended SDK span's facts, as JSON text; ``kept``: the OTLP-JSON KeyValue pairs of
    its attributes that ``KEYS`` names (``wire_json.span`` gives them, from its one walk of
    the attributes: a second walk would cost as much as the span's whole JSON)."""
    context = span.context
    links = "0"
    if span.links:
        links = "[" + ",".join(f'["{k.context.trace_id:032x}","{k.context.span_id:016x}"]' for k in span.links) + "]"
    return (
        f'["{context.trace_id:032x}","{context.span_id:016x}",{0 if span.parent is None else 1},{_text(span.name)},'
        f"{span.kind.value + 1},{span.start_time or 0},{span.end_time or 0},"
        f"{1 if span.status.status_code is _ERROR else 0},{'[' + ','.join(kept) + ']' if kept else 0},{links}]"
    )


def resource(sdk_resource: Any) -> str:
    """The resource attributes a reader keeps, as a JSON object's text."""
    attributes = getattr(sdk_resource, "attributes", None) or {}
    return _dumps({key: value for key, value in attributes.items() if key in RESOURCE_KEYS})


def group(resource_text: str, facts: list[str]) -> str:
    return '{"resource":' + resource_text + ',"spans":[' + ",".join(facts) + "]}"


def line(at: int, groups: list[str]) -> str:
    """A facts file's line for a batch whose segment line ends at byte ``at``."""
    return '{"at":' + str(at) + ',"groups":[' + ",".join(groups) + "]}"
