"""The way most advice opens, written once: a gate, a preparation, and Gym's own call
untouched whenever the gate is shut, the preparation declines, or it fails (one warning
per key).  ``guarded_advice`` builds the wrapt advice once, at import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gym_autoinstr._log import warn_once
from gym_autoinstr.telemetry import groups


def call_with(wrapped: Any, prepared: tuple[tuple, dict]) -> Any:
    """Gym's call, with the arguments the preparation made (``(args, kwargs)``)."""
    return wrapped(*prepared[0], **prepared[1])


def guarded_advice(
    key: str, message: str, *, group: str | None = None, gate: Callable[[], bool] | None = None, then: Any = call_with
) -> Callable[[Callable[[Any, tuple, dict], Any]], Any]:
    """Make ``prepare(instance, args, kwargs)`` a wrapt advice that calls Gym's function
    untouched when ``group`` is off or ``gate()`` is false, when ``prepare`` returns None,
    or when it raises (then ``warn_once(key, message, error)``); else returns
    ``then(wrapped, prepared)`` (by default: Gym's call with the ``(args, kwargs)`` made)."""

    def decorate(prepare: Callable[[Any, tuple, dict], Any]) -> Any:
        @functools.wraps(prepare)
        def advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            if (group is not None and group not in groups.ENABLED) or (gate is not None and not gate()):
                return wrapped(*args, **kwargs)
            try:
                prepared = prepare(instance, args, kwargs)
            except Exception as error:
                warn_once(key, message, error)
                prepared = None
            if prepared is None:
                return wrapped(*args, **kwargs)
            return then(wrapped, prepared)

        return advice

    return decorate
