"""The OpenTelemetry distro for Gym (entry point ``gym_autoinstr``).

A distro runs first in ``opentelemetry-instrument``'s start-up.  Ours only sets
defaults (never overriding what the user set) so that the rest of the start-up picks
Gym-friendly components:

* our configurator, even when ``opentelemetry-distro``'s is installed too;
* contrib's FastAPI instrumentation off: our ingress gives exactly one SERVER span per
  request without ASGI ``http send/receive`` children.  Set
  ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` yourself to choose otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from gym_autoinstr import settings


@dataclass(slots=True)
class _Active:
    configured: bool = False  # our distro's _configure ran


ACTIVE = _Active()

DEFAULTS = {
    settings.PYTHON_CONFIGURATOR.name: "gym_autoinstr",
    settings.PYTHON_DISABLED_INSTRUMENTATIONS.name: "fastapi",
}


class GymDistro(BaseDistro):
    def _configure(self, **kwargs: Any) -> None:
        for name, value in DEFAULTS.items():
            os.environ.setdefault(name, value)
        ACTIVE.configured = True


def active_distro() -> str:
    """The distro ``opentelemetry-instrument`` picked in this process (its rule: the one
    named by ``OTEL_PYTHON_DISTRO``, else the first entry point found)."""
    if ACTIVE.configured:
        return "gym_autoinstr"
    named = settings.PYTHON_DISTRO.raw()
    if named:
        return named
    try:
        from importlib.metadata import entry_points

        first = next(iter(entry_points(group="opentelemetry_distro")), None)
    except Exception:
        first = None
    return first.name if first is not None else "none"
