"""Spans this process lost, counted per exporter and reason: nothing is lost unsaid.

Every place a span can be dropped or fail to leave the process adds to one ledger per
process (``LEDGER``): the encoding processor (a full queue, a span that would not
encode), the exporter wrapper (an export that failed after the exporter's own retries),
the run directory's writer (the disk budget, an unwritable directory) and the exit (spans
still queued when the last flush gave up).  A process killed outright leaves no exit
count: its note in the run directory (``setup/notes.py``) said how many spans were
queued when it was last written, and readers count those as ``killed`` when the process
is gone without a final note.

Readers: the exit line (``exit_line``), the note beside the spans, ``gym-autoinstr
view``'s header and ``doctor`` (``describe``), and the SDK self-observability metrics
(``telemetry/metrics.py``).  Counting costs an integer add per span and a lock per loss.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# Where each reason happens: in the processor (before export) or at the exporter.
PROCESSOR_REASONS = ("queue_full", "encode_failed", "already_shutdown")

# reason -> what happened, as a user reads it
REASONS = {
    "queue_full": "queue full",
    "encode_failed": "could not be encoded",
    "export_failed": "exporter failed",
    "disk_budget": "run's disk budget reached",
    "unwritable": "directory not writable",
    "exit_unflushed": "still queued at exit",
    "killed": "queued when the process was killed",
    "already_shutdown": "ended after shutdown",
}

# reason -> what to change
FIXES = {
    "queue_full": "raise OTEL_BSP_MAX_QUEUE_SIZE, or check that the exporter keeps up (a slow collector?)",
    "encode_failed": "a span held a value OTLP cannot carry: see the process's log for which",
    "export_failed": "check the collector (OTEL_EXPORTER_OTLP_ENDPOINT): was it up and reachable?",
    "disk_budget": "raise GYM_AUTOINSTR_RUN_MAX_GB, free disk space, or send spans to a collector",
    "unwritable": "set GYM_AUTOINSTR_OUTPUT_DIR to a writable directory",
    "exit_unflushed": "raise GYM_AUTOINSTR_FLUSH_TIMEOUT_MS, or check the collector answers promptly",
    "killed": "stop Gym with Ctrl-C (SIGINT) rather than SIGKILL, so servers flush on their way out",
    "already_shutdown": "nothing to set: spans ended after this process's telemetry shut down",
}


class Ledger:
    """The counts of one process.  ``sources`` are the span processors, asked for their
    ``ended`` and ``queued`` counts when a reader looks (nothing per span here)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lost: dict[tuple[str, str], list[float]] = {}  # (exporter, reason) -> [count, first, last]
        self.written: dict[str, int] = {}
        self.sources: list[tuple[str, Callable[[], tuple[int, int]]]] = []
        self.changes = 0  # bumped on every change a note should show

    def lose(self, exporter: str, reason: str, count: int = 1) -> None:
        if count <= 0:
            return
        now = time.time()
        with self._lock:
            entry = self.lost.get((exporter, reason))
            if entry is None:
                self.lost[(exporter, reason)] = [count, now, now]
            else:
                entry[0] += count
                entry[2] = now
            self.changes += 1

    def wrote(self, exporter: str, count: int) -> None:
        with self._lock:
            self.written[exporter] = self.written.get(exporter, 0) + count
            self.changes += 1

    def add_source(self, exporter: str, counts: Callable[[], tuple[int, int]]) -> None:
        """A processor in front of ``exporter``: ``counts()`` (a bound method, held weakly)
        returns (ended, queued)."""
        self.sources.append((exporter, weakref.WeakMethod(counts)))  # type: ignore[arg-type]

    def _counts(self) -> list[tuple[str, int, int]]:
        found = []
        for exporter, ref in list(self.sources):
            counts = ref()  # type: ignore[operator]
            if counts is None:
                continue
            try:
                ended, queued = counts()
            except Exception:
                continue
            found.append((exporter, ended, queued))
        return found

    def totals(self) -> dict[str, int]:
        found = self._counts()
        return {
            "ended": max((ended for _, ended, _ in found), default=0),  # (each processor sees every span)
            "written": max(self.written.values(), default=0),
            "queued": sum(queued for _, _, queued in found),
        }

    def queued_by_exporter(self) -> dict[str, int]:
        queued: dict[str, int] = {}
        for exporter, _, count in self._counts():
            queued[exporter] = queued.get(exporter, 0) + count
        return queued

    def by_exporter(self) -> dict[str, dict[str, Any]]:
        """{exporter: {"ended", "queued", "written", "lost": {reason: count}}} (the metrics)."""
        found: dict[str, dict[str, Any]] = {}

        def entry(exporter: str) -> dict[str, Any]:
            return found.setdefault(exporter, {"ended": 0, "queued": 0, "written": 0, "lost": {}})

        for exporter, ended, queued in self._counts():
            entry(exporter)["ended"] += ended
            entry(exporter)["queued"] += queued
        with self._lock:
            for exporter, written in self.written.items():
                entry(exporter)["written"] += written
            for (exporter, reason), (count, _, _) in self.lost.items():
                entry(exporter)["lost"][reason] = int(count)
        return found

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"exporter": exporter, "reason": reason, "count": int(c), "first": first, "last": last}
                for (exporter, reason), (c, first, last) in sorted(self.lost.items())
            ]

    def forget(self) -> None:
        """Forget the counts (a forked child starts its own; tests); the sources stay."""
        with self._lock:
            self.lost.clear()
            self.written.clear()
            self.changes += 1


LEDGER = Ledger()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=LEDGER.forget)


def lose(exporter: str, reason: str, count: int = 1) -> None:
    LEDGER.lose(exporter, reason, count)


# -- how a loss reads ----------------------------------------------------------------------


def _amount(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} M"
    if n >= 10_000:
        return f"{n / 1000:.0f} k"
    return f"{int(n):,}"


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def _short(service: str) -> str:
    return service.rsplit("/", 1)[-1] or service


def lost_entries(notes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every loss the process notes of a run record, each with its ``service``; a process
    gone without a final note (killed) adds its last ``queued`` count as ``killed``."""
    found = []
    for note in notes:
        service = str(note.get("service") or "?")
        for entry in note.get("lost") or ():
            if isinstance(entry, Mapping) and int(entry.get("count") or 0) > 0:
                found.append({**entry, "service": service})
        spans = note.get("spans") or {}
        queued = int(spans.get("queued") or 0) if isinstance(spans, Mapping) else 0
        if queued > 0 and not note.get("final") and note.get("alive") is False:
            updated = float(note.get("updated") or 0)
            found.append(
                {
                    "exporter": "*",
                    "reason": "killed",
                    "count": queued,
                    "first": updated,
                    "last": updated,
                    "service": service,
                }
            )
    return found


def spans_seen(notes: Iterable[Mapping[str, Any]]) -> int:
    total = 0
    for note in notes:
        spans = note.get("spans") or {}
        if isinstance(spans, Mapping):
            total += int(spans.get("ended") or 0)
    return total


def describe(notes: Iterable[Mapping[str, Any]]) -> str | None:
    """ "12 spans of 2.1 M lost: agent, queue full, 14:02:01-14:03:10; ..." for a run's
    process notes, or None when nothing was lost."""
    notes = list(notes)
    entries = lost_entries(notes)
    if not entries:
        return None
    total = sum(int(e["count"]) for e in entries)
    parts = []
    for entry in sorted(entries, key=lambda e: -int(e["count"])):
        first, last = float(entry.get("first") or 0), float(entry.get("last") or 0)
        when = _clock(first) if int(first) == int(last) else f"{_clock(first)}-{_clock(last)}"
        exporter = entry.get("exporter")
        via = f" ({exporter})" if exporter and exporter != "*" else ""
        reason = REASONS.get(str(entry.get("reason")), str(entry.get("reason")))
        parts.append(f"{_amount(int(entry['count']))} {_short(entry['service'])}{via}, {reason}, {when}")
    seen = spans_seen(notes)
    of = f" of {_amount(seen)}" if seen >= total else ""
    return f"{_amount(total)} span{'s' if total != 1 else ''}{of} lost: " + "; ".join(parts)


def exit_line(service: str) -> str | None:
    """The line a process logs at exit when it lost spans (None when it lost none)."""
    entries = LEDGER.entries()
    if not entries:
        return None
    note = {"service": service, "lost": entries, "spans": LEDGER.totals(), "final": True}
    return describe([note])
