"""``view --follow``: a run directory read as its processes write it, summarised live.

``Follower.refresh`` reads each span segment from where the last refresh stopped, and the
run's notes; a rollout counts once its root has arrived and is then kept as a few numbers
(``Stats``), never as spans.  How, and what is visible when: docs/architecture.md
("Reading runs") and docs/live-view.md.  ``live.py`` draws it.
"""

from __future__ import annotations

import json
import math
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gym_autoinstr import attributes as attr
from gym_autoinstr import losses
from gym_autoinstr.commands.view.model import JOB_SPAN, build_traces, summary
from gym_autoinstr.setup.files import segment_lines, span_segments, spans_from_request
from gym_autoinstr.setup.notes import process_notes

GRACE = 2.0  # seconds a rooted trace waits for its other processes' spans
ORPHAN_WAIT = 10.0  # seconds a /run SERVER span waits for its parent before it counts as the root
RATE_WINDOW = 30.0  # seconds the rate is taken over
BATCH_DELAY = 1.0  # seconds a process may hold an ended span before writing it (OTEL_BSP_SCHEDULE_DELAY)
REFRESH = 1.5  # seconds between two refreshes
PENDING_MAX_SPANS = 200_000  # spans of unrooted traces held at most (the oldest traces go first)
PENDING_MAX_AGE = 900.0  # seconds an unrooted trace is held without a new span
RECENT_DONE = 50_000  # ids of summarised traces remembered, so a late span starts nothing
READ_BUDGET = 32 * 1024 * 1024  # bytes read per refresh at most (a long run is caught up over a few)
JOB_NOTE = "job-*.json"
# What a slimmed span keeps: what the summary, the outcome and the rollout test read.
KEPT_ATTRIBUTES = frozenset(
    {
        attr.REWARD,
        attr.MASK_SAMPLE,
        attr.TASK_INDEX,
        attr.ROLLOUT_INDEX,
        attr.FAILURE_STAGE,
        attr.ERROR_TYPE,
        attr.HTTP_ROUTE,
        attr.URL_FULL,
        attr.DESTINATION_ROUTE,
        attr.JOB_ID,
        attr.JOB_ROLLOUTS_EXPECTED,
        attr.JOB_ROLLOUTS_SENT,
        attr.JOB_ROLLOUTS_FAILED,
    }
)
KEPT_RESOURCE = (attr.SERVICE_NAME, attr.SERVER_TYPE)


def _route(span: dict) -> str:
    attributes = span["attributes"]
    return str(attributes.get(attr.HTTP_ROUTE) or span["name"].partition(" ")[2])


def _is_run_server(span: dict) -> bool:
    return span["kind"] == "SERVER" and _route(span).rstrip("/").endswith("/run")


def _is_run_client(span: dict) -> bool:
    if span["kind"] != "CLIENT":
        return False
    attributes = span["attributes"]
    target = str(attributes.get(attr.DESTINATION_ROUTE) or attributes.get(attr.URL_FULL) or "")
    return target.rstrip("/").endswith("/run")


def _slim(span: dict) -> dict:
    attributes = span["attributes"]
    resource = span.get("resource") or {}
    return {
        "trace_id": span["trace_id"],
        "span_id": span["span_id"],
        "parent_span_id": span["parent_span_id"],
        "name": span["name"],
        "kind": span["kind"],
        "start_ns": span["start_ns"],
        "end_ns": span["end_ns"],
        "status": span["status"],
        "attributes": {k: v for k, v in attributes.items() if k in KEPT_ATTRIBUTES},
        "resource": {k: resource[k] for k in KEPT_RESOURCE if k in resource},
    }


@dataclass
class Pending:
    """A trace whose spans are arriving: held until its root has (and ``GRACE`` after)."""

    spans: list[dict] = field(default_factory=list)
    last_seen: float = 0.0
    rooted_at: float | None = None  # when its root arrived
    run_server_at: float | None = None  # when a /run SERVER span with a parent arrived


@dataclass
class JobProgress:
    job_id: str
    expected: int | None = None
    started: float | None = None  # seconds (the note's, else the job span's start)
    ended: float | None = None  # seconds: its gym.job span's end, once that arrived
    done: int = 0
    failed: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    masked: int = 0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


@dataclass
class Failure:
    end_ns: int
    trace_id: str
    kind: str


@dataclass
class Stats:
    """Every finished rollout as a few numbers."""

    done: int = 0
    failed: int = 0
    durations: array = field(default_factory=lambda: array("d"))  # ms, one per rollout
    seams: dict[str, float] = field(default_factory=lambda: {"model": 0.0, "tools": 0.0, "verify": 0.0})
    total_ms: float = 0.0
    reward_sum: float = 0.0
    rewarded: int = 0
    masked: int = 0
    tasks: dict[int, list[float]] = field(default_factory=dict)  # task -> [reward sum, rewards]
    ends: deque = field(default_factory=deque)  # (end seconds, job id) within the rate window
    first_start: float | None = None
    last_end: float | None = None
    failures: list[Failure] = field(default_factory=list)  # the newest three, newest first
    _ordered: array = field(default_factory=lambda: array("d"), repr=False)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def percentile(self, share: float) -> float | None:
        """The nearest-rank percentile of the durations (as ``view --by-task``'s); sorted
        once per count, not per call."""
        if not self.durations:
            return None
        if len(self._ordered) != len(self.durations):
            self._ordered = array("d", sorted(self.durations))  # (8 bytes a rollout, not a float object)
        return self._ordered[max(math.ceil(share * len(self._ordered)), 1) - 1]

    def worst_tasks(self, n: int = 3) -> list[tuple[int, float, int]]:
        """(task, mean reward, rewards) of the ``n`` tasks of lowest mean reward."""
        means = [(total / count, task, count) for task, (total, count) in self.tasks.items() if count]
        return [(task, mean, count) for mean, task, count in sorted(means)[:n]]


def _plain_lines(path: Path, offset: int, budget: int) -> tuple[list[bytes], int]:
    """The complete lines of ``path`` from byte ``offset`` (about ``budget`` bytes of them,
    at least one line) and the offset after them; ``FileNotFoundError`` when it is gone."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(budget)
        while data and b"\n" not in data:  # one line longer than the budget: read on
            more = handle.read(budget)
            if not more:
                break
            data += more
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[: end + 1].splitlines(), offset + end + 1


class Follower:
    """One run directory, followed.  ``refresh()`` reads what is new and returns whether
    anything the screen shows changed; ``finish()`` summarises what is still held."""

    def __init__(
        self,
        directory: Path,
        *,
        clock: Callable[[], float] | None = None,
        grace: float = GRACE,
        orphan_wait: float = ORPHAN_WAIT,
        budget: int = READ_BUDGET,
    ) -> None:
        import time

        self.directory = Path(directory)
        self.clock = clock or time.time
        self.grace, self.orphan_wait, self.budget = grace, orphan_wait, budget
        self.lag = grace + BATCH_DELAY + REFRESH  # how long after its end a rollout may be counted
        self.started = self.clock()
        self.offsets: dict[str, int] = {}  # a segment (its plain name) -> bytes of it read
        self.read_whole: set[str] = set()  # segments read to their gzip's end
        self.pending: dict[str, Pending] = {}
        self.pending_spans = 0
        self.recent: OrderedDict[str, None] = OrderedDict()
        self.stats = Stats()
        self.jobs: dict[str, JobProgress] = {}
        self.job_notes: dict[str, tuple] = {}  # note path -> its inode, mtime and size when read
        self.notes: list[dict] = []  # the processes' notes (``setup/notes.py``), each with "alive"
        self.last_new = self.started  # when a span last arrived
        self.evicted = 0  # unrooted traces given up on (too old, or over the bound)
        self.bad_lines = 0
        self.caught_up = True  # the last refresh read everything there was

    # -- reading ---------------------------------------------------------------------------

    def refresh(self, *, whole: bool = False) -> bool:
        """Read what is new; summarise the traces whose time has come.  ``whole``: read to
        the end whatever the budget.  True when anything shown changed."""
        now = self.clock()
        arrived = self._read_segments(math.inf if whole else self.budget)
        if arrived:
            self.last_new = now
        changed = self._read_job_notes()
        notes = process_notes(self.directory)
        changed |= _notes_state(notes) != _notes_state(self.notes)
        self.notes = notes
        return self._sweep(now) or changed or arrived > 0

    def _read_segments(self, budget: float) -> int:
        spans = 0
        for path in span_segments(self.directory):
            if budget <= 0:
                self.caught_up = False
                return spans
            zipped = path.name.endswith(".gz")
            key = str(path)[:-3] if zipped else str(path)
            if key in self.read_whole:
                continue
            offset = self.offsets.get(key, 0)
            try:
                if zipped:
                    lines: list = list(segment_lines(path, offset))
                    self.read_whole.add(key)
                    self.offsets.pop(key, None)
                else:
                    lines, self.offsets[key] = _plain_lines(path, offset, int(min(budget, self.budget)))
                    budget -= self.offsets[key] - offset
            except OSError:  # gzipped and removed between the listing and now: next time
                continue
            for line in lines:
                spans += self._take_line(line)
        self.caught_up = True
        return spans

    def _take_line(self, line: str | bytes) -> int:
        if not line.strip():
            return 0
        try:
            request = json.loads(line)
        except ValueError:  # a write cut short by a crash
            self.bad_lines += 1
            return 0
        taken = 0
        now = self.clock()
        for span in spans_from_request(request):
            taken += 1
            trace_id = span["trace_id"]
            if trace_id in self.recent:
                continue  # a late span of a trace already summarised
            pending = self.pending.get(trace_id)
            if pending is None:
                pending = self.pending[trace_id] = Pending()
            slim = _slim(span)
            pending.spans.append(slim)
            pending.last_seen = now
            self.pending_spans += 1
            if slim["parent_span_id"] is None:
                pending.rooted_at = pending.rooted_at or now
            elif pending.run_server_at is None and _is_run_server(slim):
                pending.run_server_at = now
        return taken

    def _read_job_notes(self) -> bool:
        changed = False
        try:
            paths = list(self.directory.glob(JOB_NOTE))
        except OSError:
            return False
        for path in paths:
            try:
                stat = path.stat()
                seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # (a note is replaced whole: a new inode)
                if self.job_notes.get(str(path)) == seen:
                    continue
                note = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            self.job_notes[str(path)] = seen
            if not isinstance(note, dict) or not isinstance(note.get("job_id"), str):
                continue
            job = self._job(note["job_id"])
            expected = note.get("expected")
            if type(expected) is int and job.expected is None:
                job.expected = expected
            if isinstance(note.get("started"), int | float):
                job.started = float(note["started"])
            changed = True
        return changed

    def _job(self, job_id: str) -> JobProgress:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = JobProgress(job_id)
        return job

    # -- summarising -----------------------------------------------------------------------

    def _sweep(self, now: float, *, everything: bool = False) -> bool:
        """Summarise the rooted traces whose grace is over (``everything``: all rooted, and
        the /run SERVER spans still waiting for a parent); let go of stale unrooted ones."""
        changed = False
        for trace_id, pending in list(self.pending.items()):
            rooted = pending.rooted_at is not None and (everything or now - pending.rooted_at >= self.grace)
            orphan = pending.run_server_at is not None and (
                everything or now - pending.run_server_at >= self.orphan_wait
            )
            if rooted or orphan:
                self._finish_trace(trace_id)
                changed = True
            elif now - pending.last_seen > PENDING_MAX_AGE:
                self._drop(trace_id)
        if self.pending_spans > PENDING_MAX_SPANS:
            for trace_id, _pending in sorted(self.pending.items(), key=lambda item: item[1].last_seen):
                if self.pending_spans <= PENDING_MAX_SPANS * 0.9:
                    break
                self._drop(trace_id)
        window = now - self.lag - RATE_WINDOW
        while self.stats.ends and self.stats.ends[0][0] < window:
            self.stats.ends.popleft()
        return changed

    def _drop(self, trace_id: str) -> None:
        pending = self.pending.pop(trace_id)
        self.pending_spans -= len(pending.spans)
        self.evicted += 1

    def _remember(self, trace_id: str) -> None:
        self.recent[trace_id] = None
        if len(self.recent) > RECENT_DONE:
            self.recent.popitem(last=False)

    def _finish_trace(self, trace_id: str) -> None:
        pending = self.pending.pop(trace_id)
        self.pending_spans -= len(pending.spans)
        self._remember(trace_id)
        (trace,) = build_traces(pending.spans)
        root = trace.root
        if root["name"] == JOB_SPAN and root["parent_span_id"] is None:
            attributes = root["attributes"]
            job = self._job(str(attributes.get(attr.JOB_ID, root["span_id"])))
            job.ended = root["end_ns"] / 1e9
            job.started = job.started or root["start_ns"] / 1e9
            expected = attributes.get(attr.JOB_ROLLOUTS_EXPECTED)
            if isinstance(expected, int) and not isinstance(expected, bool):
                job.expected = expected
            return
        if trace.is_startup or not any(
            s["name"] == "gym.rollout" or _is_run_server(s) or _is_run_client(s) for s in trace.spans
        ):
            return
        self._count_rollout(trace)

    def _count_rollout(self, trace) -> None:
        stats = self.stats
        duration = trace.duration_ms
        stats.done += 1
        stats.durations.append(duration)
        stats.total_ms += duration
        for seam, ms in summary(trace).items():
            if seam in stats.seams:
                stats.seams[seam] += ms
        start, end = trace.start_ns / 1e9, trace.end_ns / 1e9
        stats.first_start = start if stats.first_start is None else min(stats.first_start, start)
        stats.last_end = end if stats.last_end is None else max(stats.last_end, end)
        job_id = next(
            (str(r.span["attributes"][attr.JOB_ID]) for r in trace.rows if attr.JOB_ID in r.span["attributes"]), None
        )
        job = self._job(job_id) if job_id is not None else None
        stats.ends.append((end, job_id))
        reward, masked = trace.reward, bool(trace.mask_sample)
        if job is not None:
            job.done += 1
        if reward is not None and masked:
            stats.masked += 1
            if job is not None:
                job.masked += 1
        elif reward is not None:
            stats.reward_sum += reward
            stats.rewarded += 1
            if job is not None:
                job.reward_sum += reward
                job.rewarded += 1
            task = trace.task_index
            if task is not None:
                totals = stats.tasks.setdefault(task, [0.0, 0])
                totals[0] += reward
                totals[1] += 1
        if trace.has_error:
            stats.failed += 1
            if job is not None:
                job.failed += 1
            failure = trace.failure
            kind = failure.get("error_type") or "ERROR"
            if failure.get("stage"):
                kind += f" ({failure['stage']})"
            stats.failures.append(Failure(trace.end_ns, trace.trace_id, kind))
            stats.failures.sort(key=lambda f: -f.end_ns)
            del stats.failures[3:]

    def finish(self) -> None:
        """Read everything there is and summarise every trace whose root has come."""
        self.refresh(whole=True)
        self._sweep(self.clock(), everything=True)

    # -- what is shown ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Traces with spans written and no root yet: rollouts under way whose inner calls
        (a model call, a tool) have ended."""
        return sum(1 for p in self.pending.values() if p.rooted_at is None)

    def rate(self, job_id: str | None = None) -> float:
        """Rollouts a second (of one job) over the last ``RATE_WINDOW`` seconds, as far as
        they can be known: the window ends at the newest rollout's end (rollouts that ended
        since are not counted yet, and must not look like a slowdown), or ``lag`` ago when
        that is later (nothing new: the rate falls)."""
        now = self.clock()
        until = now - self.lag
        if self.stats.last_end is not None:
            until = min(max(until, self.stats.last_end), now)
        since = until - RATE_WINDOW
        ends = [end for end, job in self.stats.ends if since <= end <= until and (job_id is None or job == job_id)]
        if not ends:
            return 0.0
        first = self.stats.first_start if self.stats.first_start is not None else ends[0]
        return len(ends) / max(min(RATE_WINDOW, until - first), 1.0)

    def eta(self, job: JobProgress) -> float | None:
        """Seconds until ``job`` is done at its recent rate; None when not known."""
        if job.expected is None or job.ended is not None:
            return None
        remaining = max(job.expected - job.done, 0)
        if remaining == 0:
            return 0.0
        rate = self.rate(job.job_id)
        return remaining / rate if rate > 0 else None

    def jobs_by_start(self) -> list[JobProgress]:
        return sorted(self.jobs.values(), key=lambda j: (j.started or math.inf, j.job_id))

    def losses(self) -> str | None:
        """What the process notes say was lost; None when nothing, "unknown" without notes."""
        if not self.notes:
            return "unknown (no process notes in the run directory)"
        return losses.describe(self.notes)

    def ended(self) -> str | None:
        """Why the run is over, or None while it goes on: every process that wrote a note
        has exited; or, with no notes, the jobs have ended and nothing came for 30 s."""
        if self.notes:
            if all(note.get("final") or note.get("alive") is False for note in self.notes):
                return "every process of the run has exited"
            return None
        if self.jobs and all(job.ended is not None for job in self.jobs.values()):
            idle = self.clock() - self.last_new
            if idle >= RATE_WINDOW and self.caught_up:
                return "its jobs have ended and nothing new came for 30 s"
        return None


def _notes_state(notes: list[dict]) -> list[tuple]:
    return [(n.get("pid"), n.get("final"), n.get("alive"), json.dumps(n.get("lost"), default=str)) for n in notes]
