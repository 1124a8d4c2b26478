"""``view --follow`` on the screen: the block redrawn every refresh, the status lines when
piped, the final summary, and the loop (``main``).

In a terminal the block is redrawn in place, fitted to the window's width and height
(lines of lesser weight, older failures and jobs first, give way when the window is
short): through rich's ``Live`` when rich is importable (Gym's venv has it; we do not
require it), else by an ANSI redraw (cursor home, each line cleared to its end, the rest
of the screen cleared), which never blanks the screen between two frames.  Piped (standard
output not a terminal), one plain status line per refresh that changed something.  The
run's end (``Follower.ended``), ``--timeout`` or Ctrl-C stops it: the block goes, and the
final summary is printed, plain, with the same fields.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from gym_autoinstr.commands.view.follow import REFRESH, Follower, JobProgress
from gym_autoinstr.commands.view.text import cut
from gym_autoinstr.setup.files import DEFAULT_PARENT, span_segments
from gym_autoinstr.setup.notes import process_notes

JOBS_SHOWN = 3  # on the screen: the newest jobs
JOBS_LISTED = 10  # in the final summary


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%H:%M:%S")


def _n(number: int) -> str:
    return f"{number:,}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    return _span(ms / 1000)


def _span(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# -- the fields, each as text ------------------------------------------------------------------


def rollouts_text(follower: Follower) -> str:
    stats = follower.stats
    return (
        f"{_n(stats.done)} done, {_n(stats.failed)} failed, {follower.rate():.1f}/s over the last 30 s, "
        f"{_n(follower.in_flight)} in flight"
    )


def job_text(follower: Follower, job: JobProgress) -> str:
    size = f"{_n(job.done)} of {_n(job.expected)}" if job.expected is not None else f"{_n(job.done)} of ?"
    if job.ended is not None:
        took = f", took {_span(job.ended - job.started)}" if job.started is not None else ""
        where = f"ended {_clock(job.ended)}{took}"
    else:
        eta = follower.eta(job)
        where = "ETA " + (_span(eta) if eta is not None else "?") + f", started {_clock(job.started)}"
    percent = f" ({100 * job.done / job.expected:.0f}%)" if job.expected else ""
    return (
        f"{job.job_id[:8]}  {size} done{percent}, {_n(job.failed)} failed, mean reward "
        f"{_reward(job.mean_reward)}, {where}"
    )


def reward_text(follower: Follower) -> str:
    stats = follower.stats
    if stats.mean_reward is None and not stats.masked:
        return "none yet"
    worst = ", ".join(f"{task}: {mean:.3f} ({count})" for task, mean, count in stats.worst_tasks())
    return f"mean {_reward(stats.mean_reward)} over {_n(stats.rewarded)} ({_n(stats.masked)} masked apart)" + (
        f"; worst tasks: {worst}" if worst else ""
    )


def duration_text(follower: Follower) -> str:
    stats = follower.stats
    if not stats.done:
        return "none yet"
    seams = sorted(stats.seams.items(), key=lambda item: -item[1])
    share = ", ".join(
        f"{name} {_ms(total / stats.done)} ({100 * total / stats.total_ms:.0f}%)" if stats.total_ms else name
        for name, total in seams
    )
    return f"p50 {_ms(stats.percentile(0.5))}, p95 {_ms(stats.percentile(0.95))}; per rollout: {share}"


def lost_text(follower: Follower) -> str:
    return follower.losses() or "none"


def failure_texts(follower: Follower) -> list[str]:
    return [f"{_clock(f.end_ns / 1e9)}  {f.trace_id[:12]}  {f.kind}" for f in follower.stats.failures]


def processes_text(follower: Follower) -> str:
    notes = follower.notes
    if not notes:
        return "unknown (no process notes)"
    running = sum(1 for n in notes if not n.get("final") and n.get("alive") is not False)
    return f"{running} running, {len(notes) - running} exited"


# -- the screen, the status line, the summary ----------------------------------------------


def screen_lines(follower: Follower, width: int, height: int, *, interval: float = REFRESH) -> list[str]:
    """The block: each line cut to ``width``; lines of lesser weight left out until it fits
    ``height``."""
    catching_up = "" if follower.caught_up else " (catching up)"
    weighted: list[tuple[int, str]] = [
        (0, f"following {follower.directory}  {_clock(follower.clock())} UTC, every {interval:g} s{catching_up}"),
        (0, f"rollouts   {rollouts_text(follower)}"),
    ]
    jobs = follower.jobs_by_start()[-JOBS_SHOWN:]
    for age, job in enumerate(reversed(jobs)):  # the newest first
        weighted.append((1 + 3 * age, f"job        {job_text(follower, job)}"))
    weighted += [
        (1, f"reward     {reward_text(follower)}"),
        (2, f"duration   {duration_text(follower)}"),
        (1, f"spans lost {lost_text(follower)}"),
    ]
    failures = failure_texts(follower)
    for number, text in enumerate(failures):
        weighted.append((2 + 2 * number, ("failures   " if number == 0 else " " * 11) + text))
    if not failures:
        weighted.append((3, "failures   none"))
    weighted.append((5, f"processes  {processes_text(follower)}"))
    while len(weighted) > max(height, 1):
        lightest = max(range(len(weighted)), key=lambda i: (weighted[i][0], i))
        del weighted[lightest]
    return [cut(text, width) for _weight, text in weighted]


def status_line(follower: Follower) -> str:
    """One line of the same fields, for a pipe (without the time, to compare two)."""
    parts = [f"rollouts {rollouts_text(follower)}"]
    parts += [f"job {job_text(follower, job)}" for job in follower.jobs_by_start()[-1:]]
    stats = follower.stats
    parts.append(f"reward {_reward(stats.mean_reward)}")
    parts.append(f"p50 {_ms(stats.percentile(0.5))} p95 {_ms(stats.percentile(0.95))}")
    parts.append(f"spans lost {lost_text(follower)}")
    return "; ".join(parts)


def final_lines(follower: Follower, reason: str) -> list[str]:
    stats = follower.stats
    lines = [f"run {follower.directory}: followed {_clock(follower.started)}-{_clock(follower.clock())} UTC; {reason}"]
    overall = ""
    if stats.first_start is not None and stats.last_end is not None and stats.last_end > stats.first_start:
        overall = (
            f", {stats.done / (stats.last_end - stats.first_start):.1f}/s on average "
            f"({_clock(stats.first_start)}-{_clock(stats.last_end)} UTC)"
        )
    lines.append(f"rollouts: {_n(stats.done)} done, {_n(stats.failed)} failed{overall}")
    jobs = follower.jobs_by_start()
    if len(jobs) > JOBS_LISTED:
        lines.append(f"jobs: {len(jobs)}, the newest {JOBS_LISTED} below")
    lines += [f"job {job_text(follower, job)}" for job in jobs[-JOBS_LISTED:]]
    lines.append(f"reward: {reward_text(follower)}")
    lines.append(f"duration: {duration_text(follower)}")
    lines.append(f"spans lost: {lost_text(follower)}")
    failures = failure_texts(follower)
    lines.append("failures: " + ("; ".join(failures) if failures else "none"))
    lines.append(f"processes: {processes_text(follower)}")
    if follower.in_flight:
        lines.append(f"not ended when it stopped: {_n(follower.in_flight)} traces (spans written, no root yet)")
    return lines


# -- the displays ------------------------------------------------------------------------------


class _Piped:
    def __init__(self, out) -> None:
        self.out, self.last = out, None

    def show(self, follower: Follower, interval: float) -> None:
        line = status_line(follower)
        if line != self.last:
            self.last = line
            self.out.write(f"{_clock(follower.clock())} {line}\n")
            self.out.flush()

    def close(self) -> None:
        pass


class _Ansi:
    """A fixed block at the top of the screen, redrawn in place."""

    def __init__(self, out) -> None:
        self.out = out
        self.out.write("\x1b[?25l\x1b[H\x1b[2J")  # hide the cursor; start on a clear screen

    def show(self, follower: Follower, interval: float) -> None:
        import shutil

        size = shutil.get_terminal_size((100, 24))
        lines = screen_lines(follower, max(size.columns - 1, 20), max(size.lines - 1, 3), interval=interval)
        self.out.write("\x1b[H" + "\n".join(line + "\x1b[K" for line in lines) + "\x1b[J")
        self.out.flush()

    def close(self) -> None:
        self.out.write("\x1b[H\x1b[J\x1b[?25h")
        self.out.flush()


class _Rich:
    def __init__(self, out) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out, highlight=False)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="crop",
        )
        self.live.start()

    def show(self, follower: Follower, interval: float) -> None:
        from rich.text import Text

        width, height = self.console.size
        lines = screen_lines(follower, max(width - 1, 20), max(height - 1, 3), interval=interval)
        text = Text(no_wrap=True, overflow="crop")
        for number, line in enumerate(lines):
            label, gap, rest = line.partition("  ")
            text.append(label, style="bold" if number else "bold cyan")
            text.append(gap + rest + ("\n" if number < len(lines) - 1 else ""))
        self.live.update(text, refresh=True)

    def close(self) -> None:
        self.live.stop()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def display_for(out, *, use_rich: bool | None = None):
    """The display for ``out``: piped lines, or rich's Live (when importable, unless
    ``use_rich`` is False), or the ANSI redraw."""
    if not _is_terminal(out):
        return _Piped(out)
    if use_rich is not False:
        try:
            return _Rich(out)
        except ImportError:
            pass
    return _Ansi(out)


class _Interrupted:
    """Ctrl-C sets a flag (the loop ends at a refresh boundary: nothing is half read)."""

    def __init__(self) -> None:
        self.set = False
        self.previous = None

    def __enter__(self) -> _Interrupted:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, _signum, _frame) -> None:
        self.set = True

    def __exit__(self, *exc) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def follow(
    directory: Path,
    *,
    out=None,
    interval: float = REFRESH,
    timeout: float | None = None,
    use_rich: bool | None = None,
    follower: Follower | None = None,
) -> int:
    out = out or sys.stdout
    follower = follower or Follower(directory)
    deadline = None if timeout is None else time.monotonic() + timeout
    reason = ""
    with _Interrupted() as interrupted:
        display = display_for(out, use_rich=use_rich)
        try:
            while True:
                follower.refresh()
                ended = follower.ended()
                if ended:
                    reason = f"the run has ended ({ended})"
                    break
                display.show(follower, interval)
                wake = time.monotonic() + interval
                while time.monotonic() < wake and not interrupted.set:
                    time.sleep(min(0.1, max(wake - time.monotonic(), 0)))
                if interrupted.set:
                    reason = "stopped (Ctrl-C)"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    reason = f"stopped after --timeout {timeout:g} s"
                    break
        finally:
            display.close()
        follower.finish()
    out.write("\n".join(final_lines(follower, reason)) + "\n")
    out.flush()
    if follower.offsets or follower.read_whole or follower.notes or follower.job_notes:
        return 0
    print(f"{_NOTHING % directory}, and none came while followed: give --follow {_RUN_DIRECTORY}", file=sys.stderr)
    return 1


_NOTHING = "gym-autoinstr view: no span files (*.jsonl, *.jsonl.gz) nor process notes in %s"
_RUN_DIRECTORY = f"a run directory (./{DEFAULT_PARENT}/<run id>)"


def main(paths: Sequence[str], *, interval: float = REFRESH, timeout: float | None = None) -> int:
    """``gym-autoinstr view --follow [RUN]``: 0 when it stopped (the run's end, --timeout,
    Ctrl-C), 1 when nothing of a run came, 2 for a path that is not a directory, 141 when the
    reader went away."""
    paths = list(paths or ["."])
    if len(paths) != 1 or str(paths[0]) == "-" or not Path(paths[0]).is_dir():
        given = f"{len(paths)} paths given" if len(paths) != 1 else f"{paths[0]} is not a directory"
        print(f"gym-autoinstr view: --follow takes {_RUN_DIRECTORY}; {given}", file=sys.stderr)
        return 2
    if not span_segments(Path(paths[0])) and not process_notes(Path(paths[0])):
        print(f"{_NOTHING % paths[0]} yet: is it {_RUN_DIRECTORY}? Waiting (Ctrl-C to stop)", file=sys.stderr)
    try:
        return follow(Path(paths[0]), interval=interval, timeout=timeout)
    except BrokenPipeError:
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
