"""Each process's note in the run directory: its span counts and what it lost.

``<stem>-<pid>.process.json`` beside the process's files, rewritten whole (aside, then
renamed) every ``INTERVAL`` seconds while its counts move, and once more at a clean exit
with ``"final": true``: the service, pid and start, spans ended / written / still queued,
and the losses of ``losses.py`` (exporter, reason, count, first and last time).  A reader
(``view``, ``view --follow``, ``doctor``) knows from it which processes still run, and a
process gone without a final note was killed with its last ``queued`` spans unsaved.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from gym_autoinstr._log import logger
from gym_autoinstr.losses import LEDGER
from gym_autoinstr.setup import runs

SUFFIX = ".process.json"
INTERVAL = 2.0


class NoteWriter:
    def __init__(self, directory: Path, stem: str, service: str) -> None:
        self.directory, self.stem, self.service = Path(directory), stem, service
        self.pid = os.getpid()
        self.started = time.time()
        self._last: tuple | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._final = False

    @property
    def path(self) -> Path:
        return self.directory / f"{self.stem}{SUFFIX}"

    def note(self, final: bool = False) -> dict[str, Any]:
        return {
            "service": self.service,
            "pid": self.pid,
            "host": socket.gethostname(),
            "process_start": runs._process_start(self.pid),
            "started": self.started,
            "updated": time.time(),
            "final": final,
            "spans": LEDGER.totals(),
            "lost": LEDGER.entries(),
        }

    def write(self, final: bool = False, force: bool = False) -> None:
        with self._lock:
            if self._final or os.getpid() != self.pid:
                return
            totals = LEDGER.totals()
            state = (LEDGER.changes, totals["ended"], totals["queued"], final)
            if state == self._last and not final and not force:
                return
            self._last = state
            self._final = final
            note = self.note(final)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial = self.directory / f".{self.path.name}.partial"
            partial.write_text(json.dumps(note) + "\n")
            os.replace(partial, self.path)
        except OSError as error:
            logger.debug("process note %s not written: %s", self.path, error)

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="gym-autoinstr-note", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            self.write()

    def close(self) -> None:
        self._stop.set()
        self.write(final=True)


_current: NoteWriter | None = None


def start(directory: Path, stem: str, service: str) -> NoteWriter:
    """This process's note, kept from now on (the first call; later ones return it)."""
    global _current
    if _current is None:
        _current = NoteWriter(directory, stem, service)
        _current.start()
    return _current


def current() -> NoteWriter | None:
    return _current


def process_notes(directory: Path) -> list[dict[str, Any]]:
    """The process notes under ``directory``, each with ``alive`` (its pid still runs the
    same process) and ``path``; notes that cannot be read are skipped."""
    found = []
    try:
        paths = sorted(p for p in Path(directory).rglob(f"*{SUFFIX}") if not p.name.startswith("."))
    except OSError:
        return []
    for path in paths:
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(note, dict):
            continue
        if note.get("final"):
            note["alive"] = False
        elif note.get("host") not in (None, socket.gethostname()):
            note["alive"] = None  # another host's process: unknown from here
        else:
            note["alive"] = runs._running(note)
        note["path"] = str(path)
        found.append(note)
    return found
