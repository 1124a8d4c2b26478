"""A process's lines in the run directory: rotated segments, closed ones gzipped, one
disk budget for the whole run.

Each process writes its own files (spans, metrics, logs: one ``SegmentWriter`` each) as
numbered segments, ``<stem>-<pid>.0001.jsonl``, ``.0002.jsonl``, ...  The newest is plain
text that grows by whole lines (a reader, ``view --follow`` among them, never sees half a
line of JSON); once it holds ``GYM_AUTOINSTR_SEGMENT_MB`` it is closed and gzipped on a
background thread (``<name>.gz``, written as a hidden ``.<name>.gz.partial`` and renamed,
then the plain file removed), and the process exiting cleanly gzips its open one too.
OTLP-JSON compresses about 15x: a run keeps ~1 KB a rollout instead of ~15.

The budget (``GYM_AUTOINSTR_RUN_MAX_GB``) bounds what the whole run directory holds,
every process's files together: each writer measures the directory now and then (at
start, at each rotation, every ``_CHECK_EVERY`` bytes of its own and every few seconds), says once when the
run passes 80% of it, and drops lines once it is reached, saying so and counting the
spans (``losses.py``).  An unwritable directory is said once and counted the same way.
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once

DEFAULT_PARENT = "gym-autoinstr-runs"  # where the run directories go by default (``files.resolve_output_dir``)
FACTS_SUFFIX = ".facts"  # a span segment's facts file (``fastpath/span_facts.py``), beside it
GZ = ".gz"
PARTIAL = ".partial"
_NEAR = 0.8  # of the budget: said once
_CHECK_EVERY = 8 * 1024 * 1024
_CHECK_SECONDS = 5.0
_COMPRESS_LEVEL = 6
_CHUNK = 1024 * 1024


def run_bytes(directory: Path) -> int:
    """What the run directory holds now (its files, one level of subfolders)."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                    elif entry.is_dir(follow_symlinks=False):
                        with os.scandir(entry.path) as inner:
                            total += sum(e.stat().st_size for e in inner if e.is_file(follow_symlinks=False))
                except OSError:
                    continue
    except OSError:
        return 0
    return total


def compress(path: Path, deadline: float | None = None) -> bool:
    """``path`` gzipped beside it as ``<name>.gz``, the plain file removed; False (the plain
    file kept) when it cannot be done, or not before ``deadline`` (monotonic)."""
    target = path.with_name(path.name + GZ)
    partial = path.with_name("." + target.name + PARTIAL)
    try:
        with open(path, "rb") as source, open(partial, "wb") as raw:
            with gzip.GzipFile(
                filename=path.name, mode="wb", fileobj=raw, compresslevel=_COMPRESS_LEVEL, mtime=0
            ) as out:
                while True:
                    chunk = source.read(_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)  # (zlib lets other threads run while it deflates)
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError
        os.replace(partial, target)
        os.unlink(path)
        return True
    except (OSError, TimeoutError) as error:
        try:
            os.unlink(partial)
        except OSError:
            pass
        if not isinstance(error, TimeoutError | FileNotFoundError):
            logger.debug("could not compress %s: %s", path, error)
        return False


class _Compressor:
    """One daemon thread per process gzipping closed segments in the order they closed."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Path] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def submit(self, path: Path) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._queue = queue.Queue()
                thread = threading.Thread(target=self._run, name="gym-autoinstr-gzip", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # interpreter shutdown: left plain (still read)
                    return
                self._thread, self._pid = thread, os.getpid()
            self._queue.put(path)

    def _run(self) -> None:
        while True:
            compress(self._queue.get())
            self._queue.task_done()

    def drain(self, deadline: float) -> None:
        """Compress what is still waiting, on this thread, and let the segment the daemon
        thread is compressing finish, until ``deadline``."""
        while time.monotonic() < deadline:
            try:
                path = self._queue.get_nowait()
            except queue.Empty:
                break
            compress(path, deadline)
            self._queue.task_done()
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)


COMPRESSOR = _Compressor()

_SEGMENT = re.compile(r"\.(\d{4,})$")


class SegmentWriter:
    """Whole lines appended to this process's numbered segments of one kind (``suffix``:
    ``.jsonl`` spans, ``.metrics.jsonl``, ``.logs.jsonl``).  ``write_line`` returns False
    when the line is dropped; ``failure_reason`` then says why (``losses.REASONS``)."""

    def __init__(self, directory: Path, stem: str, suffix: str = ".jsonl") -> None:
        self.directory = Path(directory)
        self.stem, self.suffix = stem, suffix
        self.segment_bytes = max(int(settings.SEGMENT_MB.read() * 1024 * 1024), 64 * 1024)
        self.budget = int(settings.RUN_MAX_GB.read() * 1024**3)
        self.number = 1
        self.in_segment = 0
        self.failure_reason: str | None = None
        self._since_check = 0
        self._run_bytes: int | None = None  # the directory's size when last measured
        self._checked = 0.0
        self._near_said = False
        self._broken = False
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.directory / f"{self.stem}.{self.number:04d}{self.suffix}"

    def write_line(self, text: str, facts: str | None = None) -> bool:
        """``text`` as the segment's next line; ``facts`` (a span batch's, ``span_facts``)
        as the next line of the segment's facts file, saying where the line ends."""
        line = (text + "\n").encode("utf-8")
        with self._lock:
            if self._broken:
                self.failure_reason = "unwritable"
                return False
            if not self._within_budget(len(line)):
                self.failure_reason = "disk_budget"
                return False
            if self.in_segment and self.in_segment + len(line) > self.segment_bytes:
                self._rotate()
            try:
                # one write of one whole line in append mode: a reader never sees half of it
                with open(self.path, "ab") as handle:
                    handle.write(line)
            except OSError as first:
                error: OSError | None = first
                if not self.directory.exists():  # (the first line: the directory is made now)
                    try:
                        self.directory.mkdir(parents=True, exist_ok=True)
                        with open(self.path, "ab") as handle:
                            handle.write(line)
                        error = None
                    except OSError as again:
                        error = again
                if error is not None:
                    self._broken = True
                    self.failure_reason = "unwritable"
                    warn_once(
                        "file-unwritable",
                        "cannot write telemetry to %s (%s); this process's spans are dropped and counted, "
                        "Gym keeps running. Set %s to a writable directory.",
                        self.path,
                        error.strerror or error,
                        settings.OUTPUT_DIR.name,
                    )
                    return False
            if facts is not None:
                self._write_facts(self.in_segment, self.in_segment + len(line), facts)
            self.in_segment += len(line)
            self._since_check += len(line)
            if self._run_bytes is not None:
                self._run_bytes += len(line)
        return True

    def _write_facts(self, start: int, end: int, groups: str) -> None:
        """A facts line (``fastpath/span_facts.py``); none when it cannot be written (a
        reader then reads the segment's spans themselves)."""
        try:
            with open(self._facts_path(), "ab") as handle:
                handle.write(f'{{"from":{start},"at":{end},"groups":[{groups}]}}\n'.encode())
        except OSError:
            pass

    def _facts_path(self) -> Path:
        return self.directory / f"{self.stem}.{self.number:04d}{FACTS_SUFFIX}"

    def _rotate(self) -> None:
        closed, facts = self.path, self._facts_path()
        self.number += 1
        self.in_segment = 0
        COMPRESSOR.submit(closed)
        if facts.exists():  # a span segment's facts close (and are gzipped) with it
            COMPRESSOR.submit(facts)
        self._since_check = _CHECK_EVERY  # measure again: the closed segment will shrink

    def _within_budget(self, size: int) -> bool:
        # the other processes' files grow too: measured again every _CHECK_EVERY bytes of
        # ours (a hundredth of a small budget), and every _CHECK_SECONDS
        now = time.monotonic()
        if (
            self._run_bytes is None
            or self._since_check >= min(_CHECK_EVERY, self.budget // 100)
            or now - self._checked > _CHECK_SECONDS
        ):
            self._run_bytes = run_bytes(self.directory)
            self._since_check = 0
            self._checked = now
        used = self._run_bytes + size
        if used > self.budget:
            warn_once(
                "run-budget-reached",
                "the run directory %s holds %.1f GB, its budget (%s=%g): further spans are dropped and counted. "
                "Raise %s, free space, or send spans to a collector (OTEL_EXPORTER_OTLP_ENDPOINT).",
                self.directory,
                used / 1024**3,
                settings.RUN_MAX_GB.name,
                self.budget / 1024**3,
                settings.RUN_MAX_GB.name,
            )
            return False
        if not self._near_said and used > _NEAR * self.budget:
            self._near_said = True
            logger.warning(
                "the run directory %s holds %.1f GB, %d%% of its budget (%s=%g); past it spans are dropped. "
                "Raise %s to keep more.",
                self.directory,
                used / 1024**3,
                int(100 * used / self.budget),
                settings.RUN_MAX_GB.name,
                self.budget / 1024**3,
                settings.RUN_MAX_GB.name,
            )
        return True

    def seal(self, deadline: float) -> None:
        """The process is ending: close the open segment and gzip it (and any still waiting)
        if there is time before ``deadline`` (monotonic); what is not done stays plain and
        readable.  A line written after this starts the next segment."""
        with self._lock:
            path = self.path if self.in_segment else None
            facts = self._facts_path() if path is not None else None
            if path is not None:
                self.number += 1
                self.in_segment = 0
        COMPRESSOR.drain(deadline)
        if path is not None and time.monotonic() < deadline:
            compress(path, deadline)
            if facts is not None and facts.exists() and time.monotonic() < deadline:
                compress(facts, deadline)


# -- reading ---------------------------------------------------------------------------------


def segment_key(path: Path) -> tuple[str, int]:
    """(the process's stem and kind, the segment's number) for ordering a process's files."""
    name = path.name.removesuffix(GZ)
    for suffix in (".metrics.jsonl", ".logs.jsonl", ".jsonl"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            match = _SEGMENT.search(base)
            if match:
                return base[: match.start()] + suffix, int(match.group(1))
            return base + suffix, 0
    return name, 0


def open_text(path: Path, on_cut: Callable[[Path], None] | None = None):
    """``path``'s lines, plain or gzipped: a gzip cut short (a crash) ends where it was cut."""
    if path.name.endswith(GZ):
        return _gzip_lines(path, on_cut)
    return open(path, encoding="utf-8", errors="replace")


def _gzip_lines(path: Path, on_cut: Callable[[Path], None] | None):
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
        try:
            yield from handle
        except (EOFError, gzip.BadGzipFile, OSError):
            if on_cut is not None:
                on_cut(path)
