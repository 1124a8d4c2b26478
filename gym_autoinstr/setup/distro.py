"""The OpenTelemetry distro for Gym (entry point ``gym_autoinstr``).

A distro runs first in ``opentelemetry-instrument``'s start-up.  Ours only sets
defaults (never overriding what the user set) so that the rest of the start-up picks
Gym-friendly components:

* our configurator, even when ``opentelemetry-distro``'s is installed too;
* contrib's FastAPI instrumentation off: our ingress gives exactly one SERVER span per
  request without ASGI ``http send/receive`` children.  Set
  ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` yourself to choose otherwise.

A default it sets is named in ``GYM_AUTOINSTR_DISTRO_DEFAULTS``, which children inherit
with the value: what the user set and what we defaulted stay apart (``set_by_user``), so
a Slurm job script carries the user's settings, not our defaults.

And, at the end of the start-up (``opentelemetry_post_instrument`` entry point), the
children keep OpenTelemetry's sitecustomize: contrib before 0.63b0 takes its directory
off ``PYTHONPATH`` for good, so the servers ``gym env start`` spawns would run untraced
(0.63b0+ puts it back itself).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
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
        # ours: set here now, or inherited from a parent that set it (and not changed since)
        ours = {name for name in DEFAULTS if os.environ.get(name) and not set_by_user(name)}
        for name, value in DEFAULTS.items():
            if name not in os.environ:
                os.environ[name] = value
                ours.add(name)
        if ours:
            os.environ[settings.DISTRO_DEFAULTS.name] = ",".join(sorted(ours))
        else:
            os.environ.pop(settings.DISTRO_DEFAULTS.name, None)
        ACTIVE.configured = True


def set_by_user(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` is set to a value of the user's, not to our distro's default (set
    in this process or inherited from the parent it was set in)."""
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    if not value:
        return False
    ours = (settings.DISTRO_DEFAULTS.raw(environ) or "").split(",")
    return not (name in ours and value == DEFAULTS.get(name))


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


def keep_sitecustomize_for_children() -> None:
    """Put OpenTelemetry's sitecustomize directory back first on ``PYTHONPATH`` when this
    process started from it and the start-up took it off (contrib < 0.63b0 does, for good;
    newer contrib puts it back after this hook).  Nothing for a process that was not
    started by ``opentelemetry-instrument``, or whose ``PYTHONPATH`` still has it."""
    try:
        started = getattr(sys.modules.get("sitecustomize"), "__file__", None)
        if not started:
            return
        directory = os.path.dirname(os.path.abspath(started))
        from opentelemetry.instrumentation import auto_instrumentation

        if directory != os.path.dirname(os.path.abspath(auto_instrumentation.__file__)):
            return
        current = os.environ.get("PYTHONPATH", "")
        if directory not in current.split(os.pathsep):
            os.environ["PYTHONPATH"] = directory + (os.pathsep + current if current else "")
    except Exception:  # never into the start-up: children then run untraced, as before
        from gym_autoinstr._log import warn_once

        warn_once("sitecustomize-path", "could not keep OpenTelemetry's sitecustomize for child processes")
