"""Runs read into the table, each file once, each run's rows kept in a cache beside the
user's other caches, so a later command reads the runs' tables alone (and a live run the
files that changed since).

A run is a directory holding span files (a run directory of the embedded default, a
Collector's file exporter's directory, a Slurm job's trace directory); a path given may
be one, a folder of them (a campaign), or one file.  The files of every path given are
read as one set: a trace whose processes wrote in two runs is one trace.  A trace's row
says which of its run's files hold its spans, so drawing it reads those alone.

The cache: ``$GYM_AUTOINSTR_CACHE_DIR/runs/``, else ``$XDG_CACHE_HOME/gym-autoinstr/runs/``
(else ``~/.cache/...``), written with ``marshal``: ``tables/`` (a run's files' sizes and
modification times, and its rows; beside them its trace ids, what ``--trace`` looks in
first; a set of paths whose runs share traces: their merged rows) and, for a run still
being written (a segment not yet gzipped), ``files/`` (each file's partials).  A table
whose files changed is read again, from the partials of the files that did not.  A
cache that cannot be written (a read-only home) is not kept: every command then reads
every file."""

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

try:
    from orjson import loads as _loads  # (a dependency of Gym's: a third of the JSON's time saved)
except ImportError:  # pragma: no cover - Gym without it
    _loads = json.loads

FORMAT = 3  # bumped whenever what a row holds changes: older tables are merged again
PARTIAL_FORMAT = 2  # bumped whenever what a partial holds changes: older files' caches are read again
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
class Run:
    """One run's span files (a directory's; a file given is a run of its own): what its rows'
    ``R_FILES`` number, and its table in the cache is kept by (``key``)."""

    label: str  # its name: its directory below the path given
    key: str  # its directory (the file given), resolved
    files: list[Path]


@dataclass
class Source:
    """The paths given: run directories, folders of them (campaigns), files."""

    key: str  # the paths given, resolved: what a table of theirs is cached by
    files: list[Path]  # their span files, each process's in order
    labels: list[str]  # for each file, the run it belongs to (its directory, below ``path``)
    run_keys: list[str] = field(default_factory=list)  # for each file, its run's ``key``

    def runs(self) -> list[Run]:
        runs: dict[str, Run] = {}
        for file, label, key in zip(self.files, self.labels, self.run_keys):
            runs.setdefault(key, Run(label, key, [])).files.append(file)
        return list(runs.values())


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
        found = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used: kept (``prune``)
    return found


def _save(path: Path, data: bytes) -> None:
    """Written whole or not at all (a reader never sees half a file); never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
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
                    records.append(_loads(line))
                except ValueError:
                    break  # a line cut short: what follows is not trusted
    except OSError:
        return []
    return records


def segment_partials(path: Path, into: dict | None = None, index: int = 0) -> dict[str, list]:
    """A span file's partials (added ``into`` other files' when given, this one numbered
    ``index``): from its facts file where that covers the segment from its first byte (the
    spans past it, of a segment still being written or of a process killed between two
    writes, read themselves); else from its spans."""
    from gym_autoinstr.setup.files import segment_lines

    covered, records = 0, []
    for record in sorted(_facts_records(_facts_file(path)), key=lambda r: r.get("from", -1)):
        if record.get("from") != covered:
            break  # a gap (a batch whose facts were not written): not enough
        covered = record.get("at", -1)
        records.append(record)
    size = _plain_size(path)
    usable = records and size is not None and (covered == size or (covered < size and not path.name.endswith(GZ)))
    partials: dict[str, list] = {} if into is None else into
    if not usable:
        return facts.partials_of(segment_lines(path), str(path), partials, index)
    for record in records:
        facts.add_facts_line(partials, record, index)
    if covered < size:
        facts.partials_of(segment_lines(path, skip=covered), str(path), partials, index)
    return partials


def read_file(path: str, cache: str | None) -> bytes:
    """One file's partials, marshalled (kept in ``cache`` when one is given): a worker's task."""
    stamp = _stamp(Path(path))
    partials = segment_partials(Path(path))
    data = marshal.dumps(partials)
    if cache:
        _save(Path(cache), b"%d\n%d %d\n" % (PARTIAL_FORMAT, *stamp) + data)
    return data


def _cached_partials(file: Path, cache: Path) -> dict[str, list] | None:
    try:
        data = cache.read_bytes()
        form, stamp, body = data.split(b"\n", 2)
        if int(form) == PARTIAL_FORMAT and tuple(map(int, stamp.split())) == _stamp(file):
            return marshal.loads(body)
    except (OSError, ValueError, EOFError, TypeError):
        pass
    return None


def _file_partials(path: str, cache: str, keep: bool) -> dict[str, list]:
    found = _cached_partials(Path(path), Path(cache))
    if found is not None:
        return found
    return marshal.loads(read_file(path, cache)) if keep else segment_partials(Path(path))


def read_run(files: list[str], caches: list[str], keep: bool, table: str, stamps: list) -> bytes:
    """One run's rows, its files read (or their kept partials) and merged, written to its
    table in the cache; marshalled (a worker's task).  Without ``keep`` (a finished run),
    every file is read into one set of partials, a trace's once."""
    if keep:
        rows = _merge((i, _file_partials(f, c, keep)) for i, (f, c) in enumerate(zip(files, caches)))
    else:
        partials: dict[str, list] = {}
        for i, (file, cache) in enumerate(zip(files, caches)):
            found = _cached_partials(Path(file), Path(cache))
            if found is None:
                segment_partials(Path(file), partials, i)
            else:
                _merge_into(partials, i, found)
        rows = [facts.resolve(trace_id, partial) for trace_id, partial in partials.items()]
    return _save_table(Path(table), stamps, rows)


def _save_table(path: Path, stamps: list, rows: list[tuple]) -> bytes:
    """A run's rows (by start) and, beside them, its trace ids (what ``--trace`` looks for first)."""
    rows.sort(key=lambda row: row[facts.R_START])
    data = marshal.dumps((FORMAT, stamps, rows))
    _save(path, data)
    _save(path.with_suffix(".ids"), marshal.dumps((FORMAT, stamps, "\n" + "\n".join(r[facts.R_TRACE] for r in rows))))
    return data


def _valid(found: object, stamps: list) -> object:
    if isinstance(found, tuple) and len(found) == 3 and found[0] == FORMAT and found[1] == stamps:
        return found[2]
    return None


class _Pool:
    """Worker processes for the runs (or a run's files) no cache holds, started on first need
    (2 cores: reading a large campaign the first time is JSON parsing, bound by the CPU)."""

    def __init__(self) -> None:
        self.executor = None

    def _executor(self, jobs: int):
        if self.executor is None:
            import concurrent.futures
            import multiprocessing
            import threading

            # fork: nothing to import again, and no script's top level run twice; only where
            # this process has no other thread to copy half-way (else a fresh interpreter)
            single = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if single else "spawn")
            workers = min(os.cpu_count() or 1, jobs)
            self.executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
        return self.executor

    def map(self, task, jobs: list[tuple], sizes: list[int]) -> list[bytes]:
        """``task(*job)`` of each job, in worker processes when there is enough to read."""
        if min(os.cpu_count() or 1, len(jobs)) < 2 or sum(sizes) < PARALLEL_BYTES:
            return [task(*job) for job in jobs]
        executor = self._executor(len(jobs))
        # the largest first: the last one read is a small one
        futures = {i: executor.submit(task, *jobs[i]) for i in sorted(range(len(jobs)), key=lambda i: -sizes[i])}
        return [futures[i].result() for i in range(len(jobs))]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()


def _merge_into(merged: dict[str, list], index: int, partials: dict[str, list], only: set[str] | None = None) -> None:
    """One file's partials (the file numbered ``index``) into ``merged``; ``only``: those traces."""
    for trace_id, part in partials.items():
        if only is not None and trace_id not in only:
            continue
        part[facts.FILES] = [index]
        into = merged.get(trace_id)
        if into is None:
            merged[trace_id] = part
        else:
            facts.merge(into, part)


def _merge(parts: Iterable[tuple[int, dict[str, list]]], only: set[str] | None = None) -> list[tuple]:
    """Files' partials (with each file's index) merged by trace, as rows; ``only``: those traces."""
    merged: dict[str, list] = {}
    for index, partials in parts:
        _merge_into(merged, index, partials, only)
    return [facts.resolve(trace_id, part) for trace_id, part in merged.items()]


def _read_runs(runs: list[Run], pool: _Pool) -> list[list[tuple]]:
    """The rows of runs no table holds: several at once a run to a worker, one large run a
    file to a worker (merged here)."""
    root = cache_root()
    caches = [[str(root / "files" / (_key(file) + ".m")) for file in run.files] for run in runs]
    # a run still being written keeps its files' partials (a later read reads only the files
    # that changed); a finished run (every segment gzipped) keeps its table alone
    keep = [any(not file.name.endswith(GZ) for file in run.files) for run in runs]
    sizes = [sum(_stamp(file)[0] for file in run.files) for run in runs]
    if len(runs) > 1:
        jobs = [
            ([str(f) for f in run.files], caches[i], keep[i], str(_table_path(run)), _run_stamps(run))
            for i, run in enumerate(runs)
        ]
        return [_valid(marshal.loads(data), jobs[i][4]) for i, data in enumerate(pool.map(read_run, jobs, sizes))]
    out = []
    for i, run in enumerate(runs):
        found = [_cached_partials(file, Path(cache)) for file, cache in zip(run.files, caches[i])]
        missing = [j for j, partial in enumerate(found) if partial is None]
        jobs = [(str(run.files[j]), caches[i][j] if keep[i] else None) for j in missing]
        for j, data in zip(missing, pool.map(read_file, jobs, [_stamp(run.files[j])[0] for j in missing])):
            found[j] = marshal.loads(data)
        rows = _merge(enumerate(found))
        _save_table(_table_path(run), _run_stamps(run), rows)
        out.append(rows)
    return out


def _table_path(run: Run) -> Path:
    return cache_root() / "tables" / (_key("run\n" + run.key) + ".m")


def _run_stamps(run: Run) -> list:
    return [(str(file), *_stamp(file)) for file in run.files]


def _source_rollouts(source: Source, pool: _Pool, trace: str | None) -> list[Rollout]:
    """The rollouts of the paths given: each run's from its table (``trace``: only the runs
    whose trace ids hold that prefix), the runs no table holds read; a trace whose files are
    in two runs (a submission's and its Slurm job's) is merged again from those files, and
    the whole kept as the paths' own table."""
    joined_path = cache_root() / "tables" / (_key(source.key) + ".m")
    stamps = [(str(file), *_stamp(file)) for file in source.files]
    joined = _valid(_load(joined_path), stamps)
    whole = Run("", "", source.files)
    if joined is not None:
        return [Rollout(row, source.labels[row[facts.R_FILES][0]], whole) for row in joined]
    runs, tables, unread = source.runs(), {}, []
    for run in runs:
        run_stamps = _run_stamps(run)
        if trace is not None:
            ids = _valid(_load(_table_path(run).with_suffix(".ids")), run_stamps)
            if ids is not None and "\n" + trace not in ids:
                continue
        rows = _valid(_load(_table_path(run)), run_stamps)
        if rows is None:
            unread.append(run)
        else:
            tables[run.key] = rows
    for run, rows in zip(unread, _read_runs(unread, pool) if unread else ()):
        tables[run.key] = rows or []
    rollouts: list[Rollout] = []
    seen: set[str] = set()
    twice: list[Rollout] = []  # a trace's row in a second run
    for run in runs:
        for row in tables.get(run.key, ()):
            rollout = Rollout(row, run.label, run)
            if row[facts.R_TRACE] in seen:
                twice.append(rollout)
            else:
                seen.add(row[facts.R_TRACE])
                rollouts.append(rollout)
    if len(runs) > 1:
        rollouts.sort(key=lambda rollout: rollout.row[facts.R_START])
    if twice:
        rollouts = _joined(source, rollouts, twice, whole)
        if trace is None:
            _save(joined_path, marshal.dumps((FORMAT, stamps, [r.row for r in rollouts])))
    return rollouts


def _joined(source: Source, rollouts: list[Rollout], twice: list[Rollout], whole: Run) -> list[Rollout]:
    """Every row with its files numbered as the paths' files, the traces found in two runs
    merged again from their files (rare: those files read again, together)."""
    index = {file: i for i, file in enumerate(source.files)}
    again = {rollout.trace_id for rollout in twice}
    rows, holding = {}, set()
    for rollout in rollouts + twice:
        numbers = tuple(index[rollout.source.files[i]] for i in rollout.files)
        rows[rollout.trace_id] = rollout.row[: facts.R_FILES] + (numbers,) + rollout.row[facts.R_FILES + 1 :]
        if rollout.trace_id in again:
            holding.update(numbers)
    root = cache_root()
    parts = (
        (i, _file_partials(str(source.files[i]), str(root / "files" / (_key(source.files[i]) + ".m")), False))
        for i in sorted(holding)
    )
    for row in _merge(parts, only=again):
        rows[row[facts.R_TRACE]] = row
    joined = sorted(rows.values(), key=lambda row: row[facts.R_START])
    return [Rollout(row, source.labels[row[facts.R_FILES][0]], whole) for row in joined]


def find_files(paths: Sequence[str]) -> Source:
    """The span files under ``paths`` (a directory's, below it too; a file given), each once,
    and the run each belongs to: the directory holding it, named below the path given."""
    from gym_autoinstr.setup.files import span_segments

    source = Source("\n".join(sorted(str(Path(p).resolve()) for p in paths)), [], [], [])
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        for file in [path] if path.is_file() else span_segments(path):
            resolved = file.resolve()
            if resolved in seen:  # a directory and a file in it: the file once
                continue
            seen.add(resolved)
            below = file.parent.relative_to(path) if file != path else Path(".")
            source.files.append(file)
            source.labels.append(str(path) if str(below) == "." else str(below))
            source.run_keys.append(str(resolved if file == path else resolved.parent))
    return source


def load(paths: Sequence[str], trace: str | None = None) -> Campaign:
    """Every trace under ``paths`` (``-``: standard input, read whole and not kept); with
    ``trace`` (an id or its start), the runs holding such a trace alone (every run when none
    does: what was read is then told as usual)."""
    import gc

    wanted = [p for p in paths if str(p) != "-"]
    sources = [find_files(wanted)] if wanted else []
    prune(cache_root())
    pool = _Pool()
    rollouts: list[Rollout] = []
    stdin_spans: list[dict] = []
    collecting = gc.isenabled()
    gc.disable()  # a million rows, no cycles among them: the collector would walk them again and again
    try:
        for source in sources:
            found = _source_rollouts(source, pool, trace.lower()) if trace else []
            rollouts.extend(found or _source_rollouts(source, pool, None))
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


KEEP_DAYS = 30  # a cache file not written or read for this long is removed (at most one look a day)


def prune(root: Path, now: float | None = None) -> None:
    """The cache's files unused for ``KEEP_DAYS`` removed (a run deleted, a live run's files
    since gzipped); a run read again is read from its files.  Never raises."""
    import time

    now = time.time() if now is None else now
    marker = root / ".pruned"
    try:
        if now - marker.stat().st_mtime < 86400:
            return
    except OSError:
        pass
    try:
        root.mkdir(parents=True, exist_ok=True)
        marker.touch()
        for folder in (root / "tables", root / "files"):
            for file in folder.iterdir() if folder.is_dir() else ():
                status = file.stat()
                if now - max(status.st_mtime, status.st_atime) > KEEP_DAYS * 86400:
                    file.unlink()
    except OSError:
        pass


def _stdin(spans: list[dict]) -> list[Rollout]:
    from gym_autoinstr.setup.files import json_lines, spans_from_request

    partials: dict[str, list] = {}
    for request in json_lines(iter(sys.stdin), "stdin"):
        facts.add_request(partials, request)
        spans.extend(spans_from_request(request))
    return [
        Rollout(facts.resolve(t, p)[: facts.R_FILES] + ((),) + facts.resolve(t, p)[facts.R_FILES + 1 :], "-", None)
        for t, p in partials.items()
    ]
