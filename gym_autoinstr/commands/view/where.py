"""``--where``: numeric conditions on a trace's outcome and size, e.g. ``reward<0.5``.

A condition is ``FIELD OPERATOR NUMBER`` (spaces allowed), the operators
``< <= > >= == !=``, the fields:

* ``reward``: the verifier's reward (``Trace.reward``; a masked sample's too);
* ``tokens``: model tokens, in and out together (``Trace.tokens``);
* ``duration``: the trace's duration in milliseconds; ``2s`` and ``150ms`` say the unit;
* ``task``: the task index (``nemo.gym.task.index``);
* ``repeat``: the repeat of that task (``nemo.gym.rollout.index``);
* ``masked``: 1 for a masked sample (``nemo.gym.mask_sample``: its reward is not a valid
  measurement), 0 for one with a valid reward: ``masked==0`` leaves masked samples out.

A trace without the field (no reward, no task index) matches no condition on it.  Bad
input raises ``WhereError``, whose message names the problem and the way to write it."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from gym_autoinstr.commands.view.model import Trace

FIELDS: dict[str, tuple[Callable[[Trace], float | None], str]] = {
    "reward": (lambda t: t.reward, "the verifier's reward"),
    "tokens": (lambda t: t.total_tokens, "model tokens, in + out"),
    "duration": (lambda t: t.duration_ms, "ms; or with a unit: 2s, 150ms"),
    "task": (lambda t: t.task_index, "task index"),
    "repeat": (lambda t: t.rollout_index, "the task's repeat index"),
    "masked": (
        lambda t: None if t.reward is None else 1 if t.mask_sample else 0,
        "1 for a masked sample, 0 for a valid reward",
    ),
}
# Longest first: ``<=`` is not ``<`` followed by ``=``.
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
EXAMPLE = "--where 'reward<0.5'"
_CONDITION = re.compile(r"\s*([A-Za-z_][\w.]*)?\s*([<>=!]+)?\s*(.*?)\s*")
_DURATION = re.compile(r"(.*?)\s*(ms|s)?", re.IGNORECASE)


class WhereError(ValueError):
    """A ``--where`` condition that cannot be read: the message says why and how to write it."""


def fields_text() -> str:
    return ", ".join(f"{name} ({about})" for name, (_get, about) in FIELDS.items())


@dataclass(frozen=True)
class Condition:
    text: str
    field: str
    op: str
    value: float

    def matches(self, trace: Trace) -> bool:
        found = FIELDS[self.field][0](trace)
        return found is not None and OPERATORS[self.op](found, self.value)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_where(text: str) -> Condition:
    """``text`` (``reward<0.5``, ``duration >= 2s``) as a ``Condition``; ``WhereError``
    when it is not one."""
    matched = _CONDITION.fullmatch(text)
    name, op, value_text = matched.groups() if matched else (None, None, text)
    where = f"--where {text!r}"
    if not name:
        raise WhereError(f"{where}: no field; write FIELD OPERATOR NUMBER ({EXAMPLE}), a field among: {fields_text()}")
    field = name.lower()
    if field not in FIELDS:
        raise WhereError(f"{where}: unknown field {name!r}; the fields: {fields_text()}")
    operators = " ".join(OPERATORS)
    if not op:
        raise WhereError(
            f"{where}: no operator after {name!r}; write FIELD OPERATOR NUMBER ({EXAMPLE}), "
            f"an operator among: {operators}"
        )
    if op not in OPERATORS:
        hint = " (== compares for equality)" if op == "=" else ""
        raise WhereError(f"{where}: unknown operator {op!r}{hint}; the operators: {operators}")
    if not value_text:
        raise WhereError(f"{where}: no number after {op!r}; write FIELD OPERATOR NUMBER ({EXAMPLE})")
    if field == "duration":
        number_text, unit = _DURATION.fullmatch(value_text).groups()  # type: ignore[union-attr]
        value = _number(number_text)
        if value is None:
            raise WhereError(
                f"{where}: {value_text!r} is not a duration; write milliseconds (150) or give the unit (150ms, 2s)"
            )
        value *= 1000 if (unit or "").lower() == "s" else 1
    else:
        value = _number(value_text)
        if value is None:
            raise WhereError(f"{where}: {value_text!r} is not a number; write FIELD OPERATOR NUMBER ({EXAMPLE})")
    return Condition(text, field, op, value)
