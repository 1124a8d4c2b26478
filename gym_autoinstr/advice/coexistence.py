"""Standing down where Gym's own telemetry is live (0.7+ with a working nemo-lens).

Gym 0.7.0 ships call sites that are inert with every public nemo-lens: then we do the
work.  If a future nemo-lens makes them live (``get_telemetry()`` returns a handle that
is exporting), doubling every span would be worse than useless, so egress and ingress
stand down for that process.  Gym initialises its telemetry inside ``run_webserver``,
after our hooks are in place, so the answer is learned when ``init_telemetry`` returns.
"""

from __future__ import annotations

from typing import Any

from gym_autoinstr._log import logger

# Read as a plain module attribute on the per-request paths (a call per request and per
# seam otherwise); ``native_telemetry_live()`` elsewhere.
NATIVE_LIVE = False


def native_telemetry_live() -> bool:
    return NATIVE_LIVE


def _handle_is_exporting() -> bool:
    try:
        from nemo_gym.telemetry.setup import get_telemetry  # type: ignore[import-not-found]
    except Exception:
        return False
    try:
        handle = get_telemetry()
    except Exception:
        return False
    return bool(handle is not None and getattr(handle, "is_exporting", False))


def init_telemetry_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``nemo_gym.telemetry.setup.init_telemetry``: note whether Gym now exports."""
    global NATIVE_LIVE
    result = wrapped(*args, **kwargs)
    try:
        live = _handle_is_exporting()
    except Exception:
        live = False
    if live and not NATIVE_LIVE:
        logger.info("Gym's own OpenTelemetry call sites are live in this process: gym-autoinstr stands down")
    NATIVE_LIVE = live
    return result


def set_native_live_for_tests(value: bool) -> None:
    global NATIVE_LIVE
    NATIVE_LIVE = value
