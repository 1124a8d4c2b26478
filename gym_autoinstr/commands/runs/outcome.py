"""How a rollout ended, read from its trace's spans: its reward (and whether it is masked),
its task and repeat indexes in Gym's output file, its model tokens.

The attributes (set by the advice on the rollout's spans, named in ``gym_autoinstr/attributes.py``):

* ``nemo.gym.reward`` (double), ``nemo.gym.mask_sample`` (bool, Gym 0.7: the reward is
  not a valid measurement): on the rollout's root (the collection driver's CLIENT
  ``POST /run``, or the agent's SERVER ``POST /run`` when a rollout is sent to the agent
  directly), on ``gym.rollout``, on ``gym.verify`` and the CLIENT span calling
  ``/verify``.  A trace's reward is the first found in the order root, ``gym.rollout``,
  ``gym.verify``; its mask likewise.
* ``nemo.gym.task.index``, ``nemo.gym.rollout.index`` (int: the task, and which repeat
  of it): on the root of a rollout Gym's collection driver sent; they join the trace
  with its row in Gym's output file (``_ng_task_index``, ``_ng_rollout_index``).
* tokens: ``gen_ai.usage.input_tokens`` / ``output_tokens`` on each model call's CLIENT
  span (``gen_ai.operation.name`` = ``chat``), once per call; the rollout's total as
  ``nemo.gym.rollout.usage.input_tokens`` / ``output_tokens`` on its ``invoke_agent``
  spans (the root and ``gym.rollout``).  Earlier files differ: some carry the total as
  ``gen_ai.usage.*`` on the ``invoke_agent`` spans and every call's usage on its
  ``gym.model.*`` seam too (``chat``), older ones on the seams alone.  A trace's tokens
  (``tokens``) are counted once whichever it is: the rollout's total when a span carries
  one (``nemo.gym.rollout.usage.*``, else ``gen_ai.usage.*`` on an ``invoke_agent``
  span; the outermost, then the earliest), else one count per model call (the outermost
  ``chat`` span carrying usage on each path: the CLIENT span, or the seam under it when
  the CLIENT span has none), else (files whose spans name no operation) the sum over
  every span that has usage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from gym_autoinstr import attributes as attr

# The spans a trace's reward is looked for on after its root, in this order.
REWARD_SPANS = ("gym.rollout", "gym.verify")


class SpanRow(Protocol):
    """A span and its depth in its trace (``model.Row``)."""

    span: dict
    depth: int


def number(value: object) -> float | None:
    """A numeric attribute as a float; None for a missing, boolean or unreadable one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def whole(value: object) -> int | None:
    """An integer attribute (an index); None for a missing, boolean or unreadable one."""
    found = number(value)
    return int(found) if found is not None and math.isfinite(found) else None


def _attributes(span: dict) -> dict:
    return span.get("attributes") or {}


def _in_order(rows: Sequence[SpanRow], key: str) -> object:
    """``key`` on the trace's root, else on its ``gym.rollout`` span, else on ``gym.verify``
    (the earliest of each); None when none of them has it."""
    if not rows:
        return None
    root = _attributes(rows[0].span)
    if key in root:
        return root[key]
    for name in REWARD_SPANS:
        for row in rows:
            attributes = _attributes(row.span)
            if row.span.get("name") == name and key in attributes:
                return attributes[key]
    return None


def reward(rows: Sequence[SpanRow]) -> float | None:
    return number(_in_order(rows, attr.REWARD))


def mask_sample(rows: Sequence[SpanRow]) -> bool | None:
    value = _in_order(rows, attr.MASK_SAMPLE)
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return None if value is None else bool(value)


def index(rows: Sequence[SpanRow], key: str) -> int | None:
    """``key`` (``TASK_INDEX``, ``ROLLOUT_INDEX``) on the first span having it, root first."""
    for row in rows:
        attributes = _attributes(row.span)
        if key in attributes:
            return whole(attributes[key])
    return None


def _usage(attributes: dict, keys: tuple[str, str] = (attr.INPUT_TOKENS, attr.OUTPUT_TOKENS)) -> tuple[int, int] | None:
    if keys[0] not in attributes and keys[1] not in attributes:
        return None
    return whole(attributes.get(keys[0])) or 0, whole(attributes.get(keys[1])) or 0


def _outermost(rows: Sequence[SpanRow], found) -> tuple[int, int] | None:
    """What ``found`` (a span's attributes -> usage or None) gives on the outermost span
    that has it, the earliest of those; None when no span has it."""
    candidates = [(row.depth, row.span["start_ns"], usage) for row in rows if (usage := found(_attributes(row.span)))]
    return min(candidates, key=lambda candidate: candidate[:2])[2] if candidates else None


def tokens(rows: Sequence[SpanRow]) -> tuple[int, int] | None:
    """Tokens in and out, each model call counted once (the module's docstring says how);
    None when no span has them.  ``rows``: depth-first, parents before their subtree."""
    total = _outermost(
        rows, lambda attributes: _usage(attributes, (attr.ROLLOUT_INPUT_TOKENS, attr.ROLLOUT_OUTPUT_TOKENS))
    )
    if total is None:
        total = _outermost(
            rows, lambda attributes: attributes.get(attr.OPERATION) == "invoke_agent" and _usage(attributes)
        )
    if total is not None:
        return total
    tokens_in = tokens_out = 0
    found = False
    covered = -1  # the depth of the chat span being counted, whose subtree is not counted again
    for row in rows:
        if covered >= 0 and row.depth <= covered:
            covered = -1
        attributes = _attributes(row.span)
        if covered < 0 and attributes.get(attr.OPERATION) == "chat" and (usage := _usage(attributes)):
            tokens_in, tokens_out, found, covered = tokens_in + usage[0], tokens_out + usage[1], True, row.depth
    if found:
        return tokens_in, tokens_out
    for row in rows:  # files that name no operation: every span with usage
        usage = _usage(_attributes(row.span))
        if usage:
            tokens_in, tokens_out, found = tokens_in + usage[0], tokens_out + usage[1], True
    return (tokens_in, tokens_out) if found else None


def failure(rows: Sequence[SpanRow]) -> dict[str, str]:
    """How the rollout failed, from its first span (depth-first) that says so:
    ``error.type`` and ``nemo.gym.failure.stage`` (either may be missing)."""
    found: dict[str, str] = {}
    for row in rows:
        attributes = _attributes(row.span)
        for key, name in ((attr.ERROR_TYPE, "error_type"), (attr.FAILURE_STAGE, "stage")):
            if name not in found and key in attributes:
                found[name] = str(attributes[key])
        if len(found) == 2:
            break
    return found
