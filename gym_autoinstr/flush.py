"""Time-boxed flushing of the SDK's span and metric pipelines.

``BatchSpanProcessor.force_flush`` exports on the calling thread and does not honour
its timeout: on the event loop it would block every request, and with a dead collector
it can hang for the exporter's own timeout, well past Gym's one-second grace between
SIGINT and SIGKILL.  So every flush here runs on a daemon thread that we wait for at
most ``GYM_AUTOINSTR_FLUSH_TIMEOUT_MS`` (default 500 ms), and never on the event loop.
"""

from __future__ import annotations

import asyncio
import os
import threading

from ._log import logger, warn_once

DEFAULT_FLUSH_TIMEOUT_MS = 500


def flush_timeout_seconds() -> float:
    raw = os.environ.get("GYM_AUTOINSTR_FLUSH_TIMEOUT_MS")
    if raw is None or not raw.strip():
        return DEFAULT_FLUSH_TIMEOUT_MS / 1000
    try:
        value = float(raw)
        if value < 0:
            raise ValueError
    except ValueError:
        warn_once(
            "flush-timeout",
            "GYM_AUTOINSTR_FLUSH_TIMEOUT_MS=%r is not a non-negative number of milliseconds; "
            "using %d. Set it to e.g. 500.",
            raw,
            DEFAULT_FLUSH_TIMEOUT_MS,
        )
        return DEFAULT_FLUSH_TIMEOUT_MS / 1000
    return value / 1000


def _flush_providers() -> None:
    from opentelemetry import metrics, trace

    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is None:
            continue
        try:
            force_flush()
        except Exception as error:  # the exporter's problem must not become Gym's
            warn_once(f"flush-error:{type(error).__name__}", "flushing telemetry failed: %s", error)


def flush(timeout: "float | None" = None, *, reason: str = "") -> bool:
    """Flush spans and metrics, waiting at most ``timeout`` seconds; True if it finished."""
    timeout = flush_timeout_seconds() if timeout is None else timeout
    worker = threading.Thread(target=_flush_providers, name="gym-autoinstr-flush", daemon=True)
    worker.start()
    worker.join(timeout)
    finished = not worker.is_alive()
    if not finished:
        warn_once(
            "flush-timeout-hit",
            "telemetry flush%s did not finish within %.0f ms (collector slow or unreachable?); "
            "continuing shutdown without waiting. Raise GYM_AUTOINSTR_FLUSH_TIMEOUT_MS to wait longer.",
            f" at {reason}" if reason else "",
            timeout * 1000,
        )
    else:
        logger.debug("telemetry flushed%s", f" at {reason}" if reason else "")
    return finished


async def flush_async(timeout: "float | None" = None, *, reason: str = "") -> bool:
    """``flush`` for code running on an event loop: the loop keeps running meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: flush(timeout, reason=reason))
