"""Runs read into the table, each file once: what a file says per trace (``facts``) is kept
in a cache beside the user's other caches, and so is each run's merged table, so a later
command reads a run's table alone (and a live run the files that changed since).

A run is a directory holding span files (a run directory of the embedded default, a
Collector's file exporter's directory, a Slurm job's trace directory); a path given may
be one, a folder of them (a campaign), or one file.  The files of every path given are
read as one set: a trace whose processes wrote in two of them is one trace.  A trace's
row says which of the files hold its spans, so drawing it reads those alone.

The cache: ``$GYM_AUTOINSTR_CACHE_DIR/runs/``, else ``$XDG_CACHE_HOME/gym-autoinstr/runs/``
(else ``~/.cache/...``): ``files/``
(a file's partials, by the file's path) and ``tables/`` (a path given: every file's size
and modification time, and the rows), written with ``marshal``; a file whose size or
time changed is read again, and a table whose files changed is merged again from the
files' partials.  A cache that cannot be written (a read-only home) is not
kept: every command then reads every file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gym_autoinstr import settings
from gym_autoinstr.commands.runs import facts
from gym_autoinstr.commands.runs.rollout import Rollout, link_jobs
from gym_autoinstr.setup.segments import FACTS_SUFFIX, GZ

FORMAT = 3  # bumped whenever what a row holds changes: older tables are merged again
PARTIAL_FORMAT = 1  # bumped whenever what a partial holds changes: older files' caches are read again
PARALLEL_BYTES = 8 << 20  # below this much unread, one process reads it all (workers cost more)


CACHE_VARIABLE = settings.CACHE_DIR.name


def cache_root() -> Path:
    """``GYM_AUTOINSTR_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/gym-autoinstr`` (else
    ``~/.cache/gym-autoinstr``); the runs' caches are in its ``runs/``."""
    chosen = settings.CACHE_DIR.read()
    if chosen:
        return Path(chosen) / "runs"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gym-autoinstr" / "runs"


@dataclass
class Source:
    """The paths given: run directories, folders of them (campaigns), files."""

    key: str  # the paths given, resolved: what the table is cached by
    files: list[Path]  # their span files, each process's in order
    labels: list[str]  # for each file, the run it belongs to (its directory, below ``path``)


@dataclass
class Campaign:
    """Every run read, and every trace's row in them (``Rollout``)."""

    sources: list[Source]
    rollouts: list[Rollout]
    stdin_spans: list[dict] = field(default_factory=list)

    def spans_of(self, chosen: Iterable[Rollout]) -> list[dict]:
        """The spans (``setup.files`` dicts) of the ``chosen`` traces, read from the files
        that hold them alone."""
        from gym_autoinstr.setup.files import segment_lines

        wanted: dict[Path, set[str]] = {}
        for rollout in chosen:
            if rollout.source is None:
                continue
            for index in rollout.files:
                wanted.setdefault(rollout.source.files[index], set()).add(rollout.trace_id)
        ids = {r.trace_id for r in chosen}
        spans: list[dict] = [s for s in self.stdin_spans if s["trace_id"] in ids]
        for file, traces in wanted.items():
            spans.extend(facts.trace_spans(segment_lines(file), traces))
        return spans

    @property
    def runs(self) -> list[str]:
        """The runs read, by name, in the order given."""
        return list(dict.fromkeys(label for source in self.sources for label in source.labels))


def _key(path: Path | str) -> str:
    text = str(path.resolve()) if isinstance(path, Path) else path
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:20]


def _stamp(path: Path) -> tuple[int, int]:
    try:
        status = path.stat()
    except OSError:
        return (-1, -1)
    return status.st_size, status.st_mtime_ns


def _load(path: Path) -> object:
    try:
        return marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None


def _save(path: Path, value: object) -> None:
    """Written whole or not at all (a reader never sees half a file); never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(marshal.dumps(value))
        os.replace(partial, path)
    except (OSError, ValueError):
        pass


def _facts_file(path: Path) -> Path:
    """A segment's facts file: gzipped once its segment closed (``<stem>.facts.gz``), else plain."""
    from gym_autoinstr.setup.files import SPANS_SUFFIX

    plain = path.with_name(path.name.removesuffix(GZ).removesuffix(SPANS_SUFFIX) + FACTS_SUFFIX)
    zipped = plain.with_name(plain.name + GZ)
    return zipped if zipped.exists() else plain


def _plain_size(path: Path) -> int | None:
    """A segment's size as text: a gzip's last four bytes say it (segments are far below 4 GB)."""
    try:
        if not path.name.endswith(GZ):
            return path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(-4, os.SEEK_END)
            return int.from_bytes(handle.read(4), "little")
    except OSError:
        return None


def _facts_records(path: Path) -> list[dict]:
    from gym_autoinstr.setup.segments import open_text

    records = []
    try:
        handle = open_text(path)  # plain or gzipped (a gzip cut short: read up to the cut)
        with handle if hasattr(handle, "__enter__") else contextlib.nullcontext(handle):
            for line in handle:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line cut short: what follows is not trusted
    except OSError:
        return []
    return records


def segment_partials(path: Path) -> dict[str, list]:
    """A span file's partials: from its facts file where that covers the segment from its
    first byte (the spans past it, of a segment still being written or of a process killed
    between two writes, read themselves); else from its spans."""
    from gym_autoinstr.setup.files import segment_lines

    covered, records = 0, []
    for record in sorted(_facts_records(_facts_file(path)), key=lambda r: r.get("from", -1)):
        if record.get("from") != covered:
            break  # a gap (a batch whose facts were not written): not enough
        covered = record.get("at", -1)
        records.append(record)
    size = _plain_size(path)
    usable = records and size is not None and (covered == size or (covered < size and not path.name.endswith(GZ)))
    if not usable:
        return facts.partials_of(segment_lines(path), str(path))
    partials: dict[str, list] = {}
    for record in records:
        facts.add_facts_line(partials, record)
    if covered < size:
        for trace_id, part in facts.partials_of(segment_lines(path, skip=covered), str(path)).items():
            if trace_id in partials:
                facts.merge(partials[trace_id], part)
            else:
                partials[trace_id] = part
    return partials


def read_file(path: str, cache: str) -> dict[str, list]:
    """One file's partials, read and kept in ``cache`` (a worker's task: module level)."""
    stamp = _stamp(Path(path))
    partials = segment_partials(Path(path))
    _save(Path(cache), (PARTIAL_FORMAT, stamp, partials))
    return partials


def _read_file_marshalled(path: str, cache: str) -> bytes:
    return marshal.dumps(read_file(path, cache))


def _cached_partials(file: Path, cache: Path) -> dict[str, list] | None:
    found = _load(cache)
    if isinstance(found, tuple) and len(found) == 3 and found[0] == PARTIAL_FORMAT and tuple(found[1]) == _stamp(file):
        return found[2]
    return None


class _Pool:
    """Worker processes for the files no cache holds, started on first need (2 cores:
    reading a large campaign the first time is JSON parsing, bound by the CPU)."""

    def __init__(self) -> None:
        self.executor = None

    def map(self, jobs: list[tuple[str, str]]) -> list[dict[str, list]]:
        size = sum(_stamp(Path(path))[0] for path, _cache in jobs)
        workers = min(os.cpu_count() or 1, len(jobs))
        if workers < 2 or size < PARALLEL_BYTES:
            return [read_file(path, cache) for path, cache in jobs]
        if self.executor is None:
            import concurrent.futures
            import multiprocessing
            import threading

            # fork: nothing to import again, and no script's top level run twice; only where
            # this process has no other thread to copy half-way (else a fresh interpreter)
            single = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if single else "spawn")
            self.executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
        # the largest first: the last file read is a small one
        order = sorted(range(len(jobs)), key=lambda i: -_stamp(Path(jobs[i][0]))[0])
        futures = {i: self.executor.submit(_read_file_marshalled, *jobs[i]) for i in order}
        return [marshal.loads(futures[i].result()) for i in range(len(jobs))]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()


def _merge(parts: Iterable[tuple[int, dict[str, list]]], only: set[str] | None = None) -> list[tuple]:
    """Files' partials (with each file's index) merged by trace, as rows; ``only``: those traces."""
    merged: dict[str, list] = {}
    files: dict[str, list[int]] = {}
    for index, partial in parts:
        for trace_id, part in partial.items():
            if only is not None and trace_id not in only:
                continue
            into = merged.get(trace_id)
            if into is None:
                merged[trace_id] = part
                files[trace_id] = [index]
            else:
                facts.merge(into, part)
                files[trace_id].append(index)
    return [facts.resolve(trace_id, part, tuple(files[trace_id])) for trace_id, part in merged.items()]


def _read_source(source: Source, pool: _Pool) -> list[tuple]:
    """The rows of the paths given: their table from the cache when no file changed, else
    their files' partials (each file's cached, or read) merged by trace, a run at a time
    (a campaign's partials are never all in memory at once); a trace whose files are in
    two runs (a submission's and its Slurm job's) is merged again from those files."""
    root = cache_root()
    table_path = root / "tables" / (_key(source.key) + ".m")
    stamps = [(str(file), *_stamp(file)) for file in source.files]
    table = _load(table_path)
    if isinstance(table, tuple) and len(table) == 3 and table[0] == FORMAT and table[1] == stamps:
        return table[2]
    caches = [root / "files" / (_key(file) + ".m") for file in source.files]

    def partials(indexes: list[int]) -> list[tuple[int, dict[str, list]]]:
        found = {i: _cached_partials(source.files[i], caches[i]) for i in indexes}
        missing = [i for i in indexes if found[i] is None]
        for i, read in zip(missing, pool.map([(str(source.files[i]), str(caches[i])) for i in missing])):
            found[i] = read
        return [(i, found[i] or {}) for i in indexes]

    by_run: dict[str, list[int]] = {}
    for index, label in enumerate(source.labels):
        by_run.setdefault(label, []).append(index)
    rows: list[tuple] = []
    seen: dict[str, int] = {}  # trace id -> its row
    again: set[str] = set()
    for indexes in by_run.values():
        for row in _merge(partials(indexes)):
            trace_id = row[facts.R_TRACE]
            if trace_id in seen:
                again.add(trace_id)
            else:
                seen[trace_id] = len(rows)
                rows.append(row)
    if again:  # rare: read those traces' files again, all of them together
        holding = sorted({i for row in rows if row[facts.R_TRACE] in again for i in row[facts.R_FILES]})
        others = sorted(set(range(len(source.files))) - set(holding))
        for row in _merge(partials(holding + others), only=again):
            rows[seen[row[facts.R_TRACE]]] = row
    rows.sort(key=lambda row: row[facts.R_START])
    _save(table_path, (FORMAT, stamps, rows))
    return rows


def find_files(paths: Sequence[str]) -> Source:
    """The span files under ``paths`` (a directory's, below it too; a file given), each once,
    and the run each belongs to: the directory holding it, named below the path given."""
    from gym_autoinstr.setup.files import span_segments

    files: list[Path] = []
    labels: list[str] = []
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        for file in [path] if path.is_file() else span_segments(path):
            if file.resolve() in seen:  # a directory and a file in it: the file once
                continue
            seen.add(file.resolve())
            below = file.parent.relative_to(path) if file != path else Path(".")
            files.append(file)
            labels.append(str(path) if str(below) == "." else str(below))
    key = "\n".join(sorted(str(Path(p).resolve()) for p in paths))
    return Source(key, files, labels)


def load(paths: Sequence[str]) -> Campaign:
    """Every trace under ``paths`` (``-``: standard input, read whole and not kept)."""
    import gc

    wanted = [p for p in paths if str(p) != "-"]
    sources = [find_files(wanted)] if wanted else []
    pool = _Pool()
    rollouts: list[Rollout] = []
    stdin_spans: list[dict] = []
    collecting = gc.isenabled()
    gc.disable()  # a million rows, no cycles among them: the collector would walk them again and again
    try:
        for source in sources:
            labels = source.labels
            rollouts.extend(Rollout(row, labels[row[facts.R_FILES][0]], source) for row in _read_source(source, pool))
        if len(wanted) < len(paths):
            rollouts.extend(_stdin(stdin_spans))
    finally:
        pool.close()
        if collecting:
            gc.freeze()
            gc.enable()
    if len(wanted) < len(paths):
        rollouts.sort(key=lambda r: r.start_ns)
    link_jobs(rollouts)
    return Campaign(sources, rollouts, stdin_spans)


def _stdin(spans: list[dict]) -> list[Rollout]:
    from gym_autoinstr.setup.files import json_lines, spans_from_request

    partials: dict[str, list] = {}
    for request in json_lines(iter(sys.stdin), "stdin"):
        facts.add_request(partials, request)
        spans.extend(spans_from_request(request))
    return [Rollout(facts.resolve(t, p, ()), "-", None) for t, p in partials.items()]
