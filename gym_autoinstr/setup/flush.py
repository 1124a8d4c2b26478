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
import time
from collections.abc import Callable
from dataclasses import dataclass

from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.losses import LEDGER


def flush_timeout_seconds() -> float:
    return settings.FLUSH_TIMEOUT_MS.read() / 1000


def _flush_providers() -> None:
    from opentelemetry import metrics, trace

    from gym_autoinstr.telemetry import runtime

    # GC pauses wait for the loop-lag probe (up to its interval); a process's last ones
    # would be lost at exit.  Safe here: this is the flush thread, never a GC callback.
    runtime.drain_gc_pauses()
    providers = [trace.get_tracer_provider(), metrics.get_meter_provider()]
    try:
        from gym_autoinstr.fastpath import contract

        providers.append(contract.load(contract.LOGS_API).get_logger_provider())
    except (ImportError, AttributeError):
        pass
    for provider in providers:
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is None:
            continue
        try:
            force_flush()
        except Exception as error:  # the exporter's problem must not become Gym's
            warn_once(f"flush-error:{type(error).__name__}", "flushing telemetry failed: %s", error)


class _Flusher:
    """A daemon thread, started ahead of time, that flushes on request.

    From Python 3.12 no thread can be started once interpreter shutdown begins, and
    that is exactly when the last flush is needed; so the thread that does the work
    exists from configuration on, and a flush request only wakes it and waits for it
    (at most the timeout).  Forked children get their own thread on first use.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._requested = 0
        self._completed = 0
        # The newest request a caller gave up waiting for.  While the thread is still
        # stuck before it (an export blocked on a dead or silent collector), a later
        # flush cannot finish either: it is queued, not waited for, so the waits of
        # one shutdown (lifespan, uvicorn exit, atexit) do not add up past Gym's grace.
        self._abandoned = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def start(self) -> bool:
        with self._condition:
            if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
                return True
            thread = threading.Thread(target=self._run, name="gym-autoinstr-flush", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutdown: too late to start one
                return False
            self._thread, self._pid = thread, os.getpid()
            return True

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._requested > self._completed)
                target = self._requested
            _flush_providers()
            with self._condition:
                self._completed = max(self._completed, target)
                self._condition.notify_all()

    def request(self) -> bool:
        """Ask for a flush and return at once (nothing waits for it, nothing is abandoned)."""
        if not self.start():
            return False
        with self._condition:
            self._requested += 1
            self._condition.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        if not self.start():
            return False
        with self._condition:
            self._requested += 1
            target = self._requested
            self._condition.notify_all()
            if self._completed < self._abandoned:
                return False
            finished = self._condition.wait_for(lambda: self._completed >= target, timeout)
            if not finished:
                self._abandoned = target
            return finished


_flusher = _Flusher()

# How the span exports are going, so that a shutdown does not wait on a pipeline that is
# known to be stuck: the SDK's export call blocks its batch thread (and force_flush
# behind it) through retries and backoff for up to the exporter's timeout (10 s).
_STUCK_AFTER_SECONDS = 1.0


@dataclass(slots=True)
class _Exports:
    since: float | None = None  # when the running export started (monotonic)
    failing: bool = False  # the last export failed


_exports = _Exports()


class WatchedExporter:
    """Delegates to a span exporter, records whether its exports succeed, and counts the
    spans written and the spans lost (``losses.py``) under the exporter's ``label``: a
    failed export is after the exporter's own retries; its ``failure_reason`` (the run
    directory's writer: disk budget, unwritable) says why, else ``export_failed``."""

    def __init__(self, exporter: object, label: str = "otlp") -> None:
        self._exporter = exporter
        self._label = label

    def export(self, batch: object) -> object:
        _exports.since = time.monotonic()
        ok = False
        try:
            result = self._exporter.export(batch)  # type: ignore[attr-defined]
            ok = getattr(result, "name", None) == "SUCCESS"
            return result
        finally:
            _exports.since = None
            # (the run directory's writer fails at once, for a reason of its own: not a stuck export)
            reason = None if ok else getattr(self._exporter, "failure_reason", None)
            _exports.failing = not ok and not isinstance(reason, str)
            try:
                count = len(batch)  # type: ignore[arg-type]
            except TypeError:
                count = 0
            if ok:
                LEDGER.wrote(self._label, count)
            else:
                LEDGER.lose(self._label, reason if isinstance(reason, str) else "export_failed", count)

    def shutdown(self) -> object:
        return self._exporter.shutdown()  # type: ignore[attr-defined]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._exporter, name)


def exports_stuck() -> bool:
    """The last span export failed, or one has been running for over a second."""
    since = _exports.since
    return bool(_exports.failing) or (since is not None and time.monotonic() - since > _STUCK_AFTER_SECONDS)


def start_flusher() -> None:
    """Start the flush thread now, while threads can still be started."""
    _flusher.start()


def request_flush() -> bool:
    """Start exporting what is buffered, on the flush thread, without waiting for it:
    for code that must not be slowed (a Ray task's end), not even by a dead collector."""
    return _flusher.request()


# What must happen before a flush: spans still open that belong in it end (advice/outcome.py:
# CLIENT spans held for a parse that has not come).
_before_flush: list[Callable[[], None]] = []


def before_flush(action: Callable[[], None]) -> None:
    """Run ``action`` (quick, never raising into the flush) at the start of every flush."""
    _before_flush.append(action)


def flush(timeout: float | None = None, *, reason: str = "") -> bool:
    """Flush spans and metrics, waiting at most ``timeout`` seconds; True if it finished."""
    for action in _before_flush:
        try:
            action()
        except Exception as error:
            warn_once("flush-before", "before flushing: %r", error)
    timeout = flush_timeout_seconds() if timeout is None else timeout
    if exports_stuck():
        # The flush is still requested (it exports whatever is queued if the collector
        # comes back before the process ends) but not waited for.
        _flusher.flush(0)
        warn_once(
            "flush-skipped",
            "telemetry flush%s: not waiting, span exports are failing or stuck (collector slow or "
            "unreachable?); spans not yet exported are lost.",
            f" at {reason}" if reason else "",
        )
        return False
    finished = _flusher.flush(timeout)
    if not finished:
        warn_once(
            "flush-timeout-hit",
            "telemetry flush%s did not finish within %.0f ms (collector slow or unreachable?); "
            "continuing without waiting. Raise GYM_AUTOINSTR_FLUSH_TIMEOUT_MS to wait longer.",
            f" at {reason}" if reason else "",
            timeout * 1000,
        )
    else:
        logger.debug("telemetry flushed%s", f" at {reason}" if reason else "")
    return finished


async def flush_async(timeout: float | None = None, *, reason: str = "") -> bool:
    """``flush`` for code running on an event loop: the loop keeps running meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: flush(timeout, reason=reason))
