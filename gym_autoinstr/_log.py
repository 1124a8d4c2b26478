"""One logger for the package, and a way to say a thing once per process.

Telemetry that floods a user's console is a bug of its own: every warning that can
repeat (per request, per import, per export) goes through ``warn_once`` keyed by its
cause, every note (nothing to fix) through ``note_once``.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("gym_autoinstr")

_said: set[str] = set()
_said_lock = threading.Lock()


def _ensure_visible() -> None:
    # Under `opentelemetry-instrument` nothing has configured logging yet when our code
    # runs; without a handler the root logger would print only bare messages, and
    # before Python 3.12's lastResort change some would be lost.  A handler of our own
    # that writes to stderr keeps warnings readable and attributable.
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("gym-autoinstr: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)


_ensure_visible()


def _first_time(key: str) -> bool:
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen; return whether it was logged."""
    if not _first_time(key):
        return False
    logger.warning(message, *args)
    return True


def note_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at INFO the first time ``key`` is seen (worth knowing, nothing to fix:
    what ``gym-autoinstr doctor`` rates "info"); return whether it was logged."""
    if not _first_time(key):
        return False
    logger.info(message, *args)
    return True


def forget_said() -> None:
    """Tests only: let every once-only message be said again."""
    with _said_lock:
        _said.clear()
