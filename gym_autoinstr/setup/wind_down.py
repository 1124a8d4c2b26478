"""The end of a process's telemetry: what it lost counted and said, its files closed.

Two moments.  A Gym server stops serving (its uvicorn returned, after the exit flush):
its note in the run directory is rewritten with what is still queued, and its open
segments are closed and gzipped at once, before Ray's and Gym's own exit handlers spend
the second Gym waits between SIGINT and SIGKILL (``server_exited``).  Then the process
exits (``at_exit``, registered before the exit flush so that it runs after it): spans
still queued are lost (``exit_unflushed``), the note is final, a process that lost spans
says so in one line, and what was written since is gzipped, as far as time allows.
"""

from __future__ import annotations

import atexit
import time

from gym_autoinstr import losses
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.setup import files, notes

# How long either moment may spend gzipping (what is not done stays plain and readable).
COMPRESS_SECONDS = 1.0

_service: str | None = None


def register(service: str) -> None:
    """Account for this process's spans at its exit (once; ``service`` names it in the line)."""
    global _service
    if _service is None:
        atexit.register(at_exit)
    _service = service


def server_exited() -> None:
    try:
        note = notes.current()
        if note is not None:
            note.write(force=True)
        files.seal_writers(time.monotonic() + COMPRESS_SECONDS)
    except Exception as error:
        warn_once("server-exit", "could not close the run directory's files: %r", error)


def at_exit() -> None:
    try:
        for exporter, queued in losses.LEDGER.queued_by_exporter().items():
            losses.LEDGER.lose(exporter, "exit_unflushed", queued)
        note = notes.current()
        if note is not None:
            note.close()
        line = losses.exit_line(_service or "this process")
        if line and _can_log():
            logger.warning("%s%s", line, f" (counts in {note.path})" if note is not None else "")
        # last, as it may be cut short: Gym gives a server about a second after SIGINT
        files.seal_writers(time.monotonic() + COMPRESS_SECONDS)
    except Exception as error:  # the exit of Gym's process must not fail for this
        warn_once("exit-accounting", "could not account for spans at exit: %r", error)


def _can_log() -> bool:
    """Our log's streams are still open (at exit, an embedder or a test harness may have closed them)."""
    return not any(getattr(getattr(h, "stream", None), "closed", False) for h in logger.handlers)
