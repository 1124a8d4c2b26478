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
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

ACTIVE: dict[str, bool] = {"configured": False}

DEFAULTS = {
    "OTEL_PYTHON_CONFIGURATOR": "gym_autoinstr",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi",
}


class GymDistro(BaseDistro):
    def _configure(self, **kwargs: Any) -> None:
        for name, value in DEFAULTS.items():
            os.environ.setdefault(name, value)
        ACTIVE["configured"] = True
