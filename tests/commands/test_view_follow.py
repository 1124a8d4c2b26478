"""``gym-autoinstr view --follow``: a run directory followed while its "processes" write it.

Each "process" here is a tracer provider of its own whose finished spans the test writes
as OTLP-JSON lines (the files exporter's encoding) into that process's segment when it
chooses: a line at a time, half a line, a segment gzipped the way the writer closes one.
The follower's clock is the test's (``Clock``), so the rate, the ETA, the grace a rooted
trace waits and the idle end are checked without sleeping; ``refresh`` is called directly.
The real thing (a real job, a real terminal) is ``test_realgym_follow.py``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gym_autoinstr import losses
from gym_autoinstr.commands.view import follow as follow_module
from gym_autoinstr.commands.view import live
from gym_autoinstr.commands.view.follow import Follower
from gym_autoinstr.setup.files import encode_otlp_json
from gym_autoinstr.setup.notes import process_notes
from gym_autoinstr.setup.runs import _process_start
from tests.commands.view_helpers import _cli

BASE = 1_700_000_000.0  # seconds: the spans' time and the follower's clock
MS = 1_000_000


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Process:
    """One process of the run: a provider whose finished spans ``flush`` appends as one
    line to its segment ``<stem>-<pid>.<n>.jsonl``."""

    def __init__(self, directory: Path, service: str, server_type: str, pid: int) -> None:
        self.directory, self.service, self.pid = directory, service, pid
        self.memory = InMemorySpanExporter()
        provider = TracerProvider(
            resource=Resource.create({"service.name": f"nemo-gym/{service}", "nemo.gym.server.type": server_type})
        )
        provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = provider.get_tracer("tests.follow")
        self.segment = 1

    def path(self, segment: int | None = None) -> Path:
        return self.directory / f"{self.service}-{self.pid}.{segment or self.segment:04d}.jsonl"

    def line(self) -> bytes:
        spans = self.memory.get_finished_spans()
        self.memory.clear()
        return (encode_otlp_json(spans) + "\n").encode() if spans else b""

    def flush(self) -> bytes:
        line = self.line()
        with open(self.path(), "ab") as handle:
            handle.write(line)
        return line

    def rotate(self) -> None:
        """Close the open segment as the writer does: gzip aside (hidden), rename, remove."""
        plain = self.path()
        data = plain.read_bytes()
        partial = plain.with_name(f".{plain.name}.gz.partial")
        partial.write_bytes(gzip.compress(data))
        os.replace(partial, plain.with_name(plain.name + ".gz"))
        plain.unlink()
        self.segment += 1

    def note(self, *, final: bool, lost: list | None = None, alive_pid: int | None = None) -> None:
        pid = alive_pid or self.pid
        note = {
            "service": f"nemo-gym/{self.service}",
            "pid": pid,
            "process_start": _process_start(pid),
            "started": BASE,
            "updated": BASE + 1,
            "final": final,
            "spans": {"ended": 1000, "written": 1000, "queued": 0},
            "lost": lost or [],
        }
        (self.directory / f"{self.service}-{self.pid}.process.json").write_text(json.dumps(note))


class Run:
    """A collection driver, an agent, a model and a resources server writing one run."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.driver = Process(directory, "orchestrator", "", 101)
        self.agent = Process(directory, "agent", "responses_api_agents", 102)
        self.model = Process(directory, "model", "responses_api_models", 103)
        self.resources = Process(directory, "resources", "resources_servers", 104)
        self.job = None

    @property
    def processes(self) -> list[Process]:
        return [self.driver, self.agent, self.model, self.resources]

    def flush(self) -> None:
        for process in self.processes:
            process.flush()

    def start_job(self, job_id: str, expected: int | None, started: float = BASE) -> None:
        self.job_id = job_id
        self.job = self.driver.tracer.start_span(
            "gym.job", context=Context(), start_time=int(started * 1e9), attributes={"nemo.gym.job.id": job_id}
        )
        note = {"job_id": job_id, "expected": expected, "started": started, "pid": self.driver.pid}
        (self.directory / f"job-{job_id}.json").write_text(json.dumps(note))

    def end_job(self, at: float) -> None:
        self.job.end(end_time=int(at * 1e9))

    def rollout(
        self,
        start: float,
        *,
        task: int,
        reward: float,
        model_ms: float = 300,
        tool_ms: float = 100,
        verify_ms: float = 50,
        fail: bool = False,
        masked: bool = False,
        driver: bool = True,
    ) -> str:
        """One rollout's spans, ended (written at the next flush); its trace id."""

        def at(ms: float) -> int:
            return int(start * 1e9 + ms * MS)

        total = model_ms + tool_ms + verify_ms + 20
        outcome = {"nemo.gym.reward": reward, "nemo.gym.task.index": task}
        if masked:
            outcome["nemo.gym.mask_sample"] = True
        if driver:
            root = self.driver.tracer.start_span(
                "POST /run",
                context=Context(),
                kind=SpanKind.CLIENT,
                start_time=at(0),
                links=[Link(self.job.get_span_context())] if self.job else [],
                attributes={
                    "url.full": "http://127.0.0.1:1/run",
                    "nemo.gym.http.destination.route": "/run",
                    **({"nemo.gym.job.id": self.job_id} if self.job else {}),
                    **outcome,
                },
            )
            parent = trace.set_span_in_context(root)
        else:  # nothing upstream traced here: the caller's span is elsewhere
            remote = trace.SpanContext(0xABC0 + task, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
            parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        server = self.agent.tracer.start_span(
            "POST /run", context=parent, kind=SpanKind.SERVER, start_time=at(1), attributes={"http.route": "/run"}
        )
        seam = self.agent.tracer.start_span(
            "gym.rollout", context=trace.set_span_in_context(server), start_time=at(2), attributes=outcome
        )
        inner = trace.set_span_in_context(seam)
        clock = 3.0
        for process, route, ms in (
            (self.model, "/v1/responses", model_ms),
            (self.resources, "/get_weather", tool_ms),
            (self.resources, "/verify", verify_ms),
        ):
            span = process.tracer.start_span(
                f"POST {route}",
                context=inner,
                kind=SpanKind.SERVER,
                start_time=at(clock),
                attributes={"http.route": route},
            )
            if fail and route == "/get_weather":
                span.set_attribute("error.type", "TimeoutError")
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=at(clock + ms))
            clock += ms + 1
        seam.end(end_time=at(total - 2))
        server.end(end_time=at(total - 1))
        if driver:
            root.end(end_time=at(total))
        return format(server.get_span_context().trace_id, "032x")


def _follower(directory: Path, now: float, **options) -> tuple[Follower, Clock]:
    clock = Clock(now)
    return Follower(directory, clock=clock, **options), clock


def _screen(follower: Follower, width: int = 200, height: int = 40) -> str:
    return "\n".join(live.screen_lines(follower, width, height))


# -- counts, rate, ETA, reward, failures ------------------------------------------------------------


def test_counts_rate_eta_reward_and_the_newest_failures_as_rollouts_arrive(tmp_path):
    run = Run(tmp_path / "run")
    run.start_job("a1b2c3d4e5f6", expected=10)
    rewards = {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.25}
    failed = {}
    for n in range(4):  # one a second, each under a second long
        trace_id = run.rollout(BASE + n, task=n, reward=rewards[n], fail=n == 1)
        if n == 1:
            failed[trace_id] = BASE + n
    run.flush()
    follower, clock = _follower(run.directory, BASE + 5)
    assert follower.refresh()
    assert follower.stats.done == 0  # rooted just now: the other processes' spans may still come
    clock.now += 2.5
    follower.refresh()
    stats = follower.stats
    assert (stats.done, stats.failed) == (4, 1)
    assert follower.pending == {} and follower.pending_spans == 0  # a rollout is numbers now, not spans
    # the rate up to what is known, the newest rollout's end (3.47 s after the first started):
    # rollouts ending since may not be counted yet (grace, a batch delay, a refresh: 4.5 s)
    assert follower.lag == 4.5 and follower.rate() == pytest.approx(4 / 3.47)
    clock.now += 5  # nothing new for 9 s: the window ends 4.5 s ago, and the rate falls
    assert follower.rate() == pytest.approx(4 / 8)
    (job,) = follower.jobs.values()
    assert (job.done, job.failed, job.expected) == (4, 1, 10)
    assert follower.eta(job) == pytest.approx(6 / (4 / 8))
    assert stats.mean_reward == pytest.approx(1.75 / 4)
    assert [task for task, _mean, _n in stats.worst_tasks()] == [1, 3, 2]
    assert stats.percentile(0.5) == pytest.approx(470) and stats.percentile(0.95) == pytest.approx(470)
    assert stats.seams == pytest.approx({"model": 1200, "tools": 400, "verify": 200}, abs=0.01)
    screen = _screen(follower)
    assert "4 done, 1 failed, 0.5/s over the last 30 s" in screen
    assert "a1b2c3d4  4 of 10 done (40%), 1 failed, mean reward 0.438, ETA 12s" in screen
    assert "mean 0.438 over 4 (0 masked apart); worst tasks: 1: 0.000 (1), 3: 0.250 (1), 2: 0.500 (1)" in screen
    assert "p50 470 ms, p95 470 ms; per rollout: model 300 ms (64%), tools 100 ms (21%), verify 50 ms (11%)" in screen
    ((trace_id, ended),) = failed.items()
    assert re.search(rf"failures   \d\d:\d\d:\d\d  {trace_id[:12]}  TimeoutError\n", screen + "\n")

    # six more, two of them failures, one masked; then the job ends
    for n in range(4, 10):
        run.rollout(BASE + n, task=n, reward=0.0, fail=n in (6, 8), masked=n == 9)
    run.end_job(BASE + 11)
    run.flush()
    clock.now = BASE + 15
    follower.refresh()
    clock.now += 2.5
    follower.refresh()
    assert (follower.stats.done, follower.stats.failed, follower.stats.masked) == (10, 3, 1)
    assert (job.done, job.ended) == (10, BASE + 11)
    assert follower.eta(job) is None
    screen = _screen(follower)
    assert "a1b2c3d4  10 of 10 done (100%), 3 failed, mean reward 0.194, ended" in screen
    assert "mean 0.194 over 9 (1 masked apart)" in screen
    failure_lines = [line for line in screen.splitlines() if "TimeoutError" in line]
    assert len(failure_lines) == 3  # the newest three, newest first
    assert failure_lines[0].startswith("failures ") and failure_lines[1].startswith(" " * 11)


def test_a_rollout_is_read_once_and_only_from_whole_lines(tmp_path, monkeypatch):
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=0, reward=1.0)
    for process in (run.agent, run.model, run.resources):
        process.flush()
    line = run.driver.line()
    half = len(line) // 2
    with open(run.driver.path(), "ab") as handle:
        handle.write(line[:half])  # the root's line, half written
    follower, clock = _follower(run.directory, BASE + 1, grace=0)
    follower.refresh()
    assert follower.stats.done == 0 and follower.in_flight == 1  # its spans are there, its root is not
    assert follower.offsets[str(run.driver.path())] == 0  # nothing of the half line taken
    with open(run.driver.path(), "ab") as handle:
        handle.write(line[half:])
    read = []
    real = follow_module._plain_lines
    monkeypatch.setattr(follow_module, "_plain_lines", lambda p, o, b: read.append((p.name, o)) or real(p, o, b))
    follower.refresh()
    assert follower.stats.done == 1 and follower.in_flight == 0
    assert follower.offsets[str(run.driver.path())] == len(line)
    # each file read from where the last refresh stopped: the agent's from its end
    assert (run.agent.path().name, run.agent.path().stat().st_size) in read
    assert not follower.refresh()  # nothing new: nothing changed, nothing counted twice
    assert follower.stats.done == 1


def test_a_segment_gzipped_mid_follow_is_read_on_from_its_gzip(tmp_path):
    run = Run(tmp_path / "run")
    follower, clock = _follower(run.directory, BASE, grace=0)
    run.rollout(BASE, task=0, reward=1.0)
    run.flush()
    follower.refresh()
    assert follower.stats.done == 1
    read_before = follower.offsets[str(run.agent.path())]
    # more lines into every open segment, then each is closed (gzipped) before the next refresh
    run.rollout(BASE + 1, task=1, reward=0.5)
    run.flush()
    for process in run.processes:
        process.rotate()
    run.rollout(BASE + 2, task=2, reward=0.0)
    run.flush()  # into the next segments
    assert {p.name for p in run.directory.iterdir()} >= {"agent-102.0001.jsonl.gz", "agent-102.0002.jsonl"}
    follower.refresh()
    assert follower.stats.done == 3 and follower.stats.reward_sum == pytest.approx(1.5)
    assert str(run.agent.path(1)) in follower.read_whole and read_before > 0
    follower.refresh()
    assert follower.stats.done == 3  # the gzip is not read again


def test_a_root_that_comes_first_waits_for_the_other_processes_spans(tmp_path):
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=0, reward=1.0, model_ms=800)
    run.driver.flush()  # the driver's batch leaves first
    follower, clock = _follower(run.directory, BASE + 1)
    follower.refresh()
    assert follower.stats.done == 0
    clock.now += 1
    for process in (run.agent, run.model, run.resources):
        process.flush()
    follower.refresh()
    assert follower.stats.done == 0  # its grace is not over
    clock.now += follow_module.GRACE
    follower.refresh()
    assert follower.stats.done == 1
    assert follower.stats.seams["model"] == pytest.approx(800)  # the model server's span was counted


def test_a_run_server_span_whose_caller_writes_elsewhere_counts_after_its_wait(tmp_path):
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=3, reward=0.75, driver=False)
    run.flush()
    follower, clock = _follower(run.directory, BASE + 1)
    follower.refresh()
    clock.now += follow_module.ORPHAN_WAIT - 1
    follower.refresh()
    assert follower.stats.done == 0 and follower.in_flight == 1
    clock.now += 1
    follower.refresh()
    assert follower.stats.done == 1 and follower.stats.mean_reward == 0.75


def test_unrooted_traces_are_held_within_a_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(follow_module, "PENDING_MAX_SPANS", 20)
    run = Run(tmp_path / "run")
    for n in range(10):
        run.rollout(BASE + n, task=n, reward=1.0)
    for process in (run.agent, run.model, run.resources):  # no roots: six spans a trace held
        process.flush()
    follower, _clock = _follower(run.directory, BASE + 20)
    follower.refresh()
    assert follower.pending_spans <= 20 and follower.evicted >= 6


# -- the end of a run ---------------------------------------------------------------------------------


def test_it_ends_when_every_process_note_says_final_and_says_what_was_lost(tmp_path):
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=0, reward=1.0)
    run.flush()
    for process in run.processes:
        process.note(final=False, alive_pid=os.getpid())
    follower, clock = _follower(run.directory, BASE + 1)
    follower.refresh()
    assert follower.ended() is None
    assert "spans lost none" in _screen(follower) and "processes  4 running, 0 exited" in _screen(follower)
    lost = [{"exporter": "files", "reason": "queue_full", "count": 12, "first": BASE, "last": BASE + 60}]
    for process in run.processes[:-1]:
        process.note(final=True)
    run.resources.note(final=True, lost=lost)
    follower.refresh()
    assert follower.ended() == "every process of the run has exited"
    said = losses.describe(process_notes(run.directory))
    assert "12" in said and "resources" in said and "queue full" in said
    assert f"spans lost {said}" in _screen(follower)
    out = io.StringIO()  # piped: the loop ends at once, with the summary
    assert live.follow(run.directory, out=out, follower=follower) == 0
    text = out.getvalue()
    assert "the run has ended (every process of the run has exited)" in text
    assert "rollouts: 1 done, 0 failed" in text and "processes: 0 running, 4 exited" in text


def test_a_process_gone_without_a_final_note_counts_as_exited(tmp_path):
    run = Run(tmp_path / "run")
    run.agent.note(final=False, alive_pid=_dead_pid())
    follower, _clock = _follower(run.directory, BASE)
    follower.refresh()
    assert follower.ended() == "every process of the run has exited"


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_without_notes_it_ends_30_s_after_the_last_job_ended_and_nothing_came(tmp_path):
    run = Run(tmp_path / "run")
    run.start_job("feed", expected=1)
    run.rollout(BASE, task=0, reward=1.0)
    run.flush()
    follower, clock = _follower(run.directory, BASE + 1, grace=0)
    follower.refresh()
    clock.now += 40
    follower.refresh()
    assert follower.ended() is None  # the job has not ended (its span has not come)
    run.end_job(BASE + 41)
    run.flush()
    follower.refresh()
    clock.now += 29
    follower.refresh()
    assert follower.ended() is None
    clock.now += 1
    follower.refresh()
    assert follower.ended() == "its jobs have ended and nothing new came for 30 s"
    assert "unknown (no process notes" in follower.losses()


# -- on the screen, piped, and as a command --------------------------------------------------------


def test_the_block_fits_the_window_dropping_lesser_lines_first(tmp_path):
    run = Run(tmp_path / "run")
    run.start_job("0123456789ab", expected=100)
    for n in range(5):
        run.rollout(BASE + n, task=n, reward=0.5, fail=True)
    run.flush()
    follower, _clock = _follower(run.directory, BASE + 10, grace=0)
    follower.refresh()
    full = live.screen_lines(follower, 300, 50)
    assert len(full) == 10  # header, rollouts, job, reward, duration, lost, 3 failures, processes
    small = live.screen_lines(follower, 40, 6)
    assert len(small) == 6 and all(len(line) <= 40 for line in small)
    assert small[0].startswith("following ") and small[1].startswith("rollouts   5 done, 5 failed")
    assert small[2].startswith("job        01234567")
    assert not any(line.startswith("processes") for line in small)  # the lightest went first
    assert sum("TimeoutError" in line or line.startswith(" " * 11) for line in small) <= 1


def test_piped_it_prints_a_status_line_when_something_changed_then_the_summary(tmp_path):
    run = Run(tmp_path / "run")
    run.start_job("cafe", expected=2)
    follower, clock = _follower(run.directory, BASE, grace=0)
    out = io.StringIO()
    display = live.display_for(out)
    follower.refresh()
    display.show(follower, 1.5)
    clock.now += 1.5
    follower.refresh()
    display.show(follower, 1.5)  # nothing changed: no line
    run.rollout(BASE + 1, task=0, reward=1.0)
    run.flush()
    clock.now += 1.5
    follower.refresh()
    display.show(follower, 1.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "rollouts 0 done" in lines[0] and "job cafe  0 of 2 done (0%)" in lines[0]
    assert re.match(r"\d\d:\d\d:\d\d rollouts 1 done, 0 failed, ", lines[1])
    assert "job cafe  1 of 2 done (50%)" in lines[1] and "reward 1.000" in lines[1]
    assert "\x1b" not in out.getvalue()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_terminal_without_rich_the_block_is_redrawn_in_place(tmp_path):
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=0, reward=1.0)
    run.flush()
    follower, _clock = _follower(run.directory, BASE + 1, grace=0)
    out = _Terminal()
    display = live.display_for(out, use_rich=False)
    follower.refresh()
    display.show(follower, 1.5)
    display.show(follower, 1.5)
    display.close()
    frames = out.getvalue().split("\x1b[H")
    assert frames[0] == "\x1b[?25l" and frames[1] == "\x1b[2J"  # cleared once, at the start
    first, second = frames[2], frames[3]
    assert first == second and "\x1b[2J" not in first + second  # no blank frame between two
    assert first.endswith("\x1b[J") and "rollouts   1 done, 0 failed" in first
    assert all(line.endswith("\x1b[K") for line in first.removesuffix("\x1b[J").split("\n"))
    assert frames[4] == "\x1b[J\x1b[?25h"  # the block goes, the cursor comes back


def test_in_a_terminal_with_rich_the_block_is_a_live_display(tmp_path):
    pytest.importorskip("rich")
    run = Run(tmp_path / "run")
    run.rollout(BASE, task=0, reward=1.0)
    run.flush()
    follower, _clock = _follower(run.directory, BASE + 1, grace=0)
    out = _Terminal()
    display = live.display_for(out)
    assert type(display).__name__ == "_Rich"
    follower.refresh()
    display.show(follower, 1.5)
    display.close()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "rollouts   1 done, 0 failed" in shown and "\x1b[1mrollouts\x1b[0m" in out.getvalue()
    assert out.getvalue().endswith("\x1b[2K")  # transient: the block is erased at the end


def test_the_command_follows_until_its_timeout_and_prints_the_summary(tmp_path):
    run = Run(tmp_path / "run")
    run.start_job("beef", expected=4)
    for n in range(3):
        run.rollout(BASE + n, task=n, reward=n / 2)
    run.flush()
    done = _cli("view", "--follow", str(run.directory), "--timeout", "1", columns=None)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "rollouts 0 done" in lines[0]  # the first refresh: rooted, within their grace
    summary = lines[lines.index(next(line for line in lines if line.startswith("run "))) :]
    assert summary[0].endswith("stopped after --timeout 1 s")
    assert summary[1].startswith("rollouts: 3 done, 0 failed")
    assert "job beef  3 of 4 done (75%), 0 failed, mean reward 0.500" in summary[2]
    assert summary[3].startswith("reward: mean 0.500 over 3 (0 masked apart); worst tasks: 0: 0.000 (1)")
    assert summary[5] == "spans lost: unknown (no process notes in the run directory)"
    assert summary[6] == "failures: none"


RUN = "a run directory (./gym-autoinstr-runs/<run id>)"
EMPTY = "gym-autoinstr view: no span files (*.jsonl, *.jsonl.gz) nor process notes in {tmp}"


@pytest.mark.parametrize(
    ("paths", "code", "said"),
    [
        (["{tmp}/nowhere"], 2, [f"gym-autoinstr view: --follow takes {RUN}; {{tmp}}/nowhere is not a directory"]),
        (["{tmp}", "{tmp}"], 2, [f"gym-autoinstr view: --follow takes {RUN}; 2 paths given"]),
        (
            ["{tmp}"],
            1,
            [
                f"{EMPTY} yet: is it {RUN}? Waiting (Ctrl-C to stop)",
                f"{EMPTY}, and none came while followed: give --follow {RUN}",
            ],
        ),
    ],
)
def test_a_path_that_is_no_run_directory_is_said(tmp_path, capsys, paths, code, said):
    assert live.main([path.format(tmp=tmp_path) for path in paths], interval=0.01, timeout=0.01) == code
    assert capsys.readouterr().err.splitlines() == [line.format(tmp=tmp_path) for line in said]


def test_a_jobs_note_rewritten_with_its_size_is_read_again(tmp_path):
    """0.6+: the note is there from the job's start without a size, rewritten with it at
    the first dispatch; a job resumed from Gym's cache never has one."""
    run = Run(tmp_path / "run")
    run.start_job("f00d", expected=None)
    follower, clock = _follower(run.directory, BASE + 1, grace=0)
    assert follower.refresh()
    assert "job        f00d  0 of ? done, 0 failed, mean reward -, ETA ?, started " in _screen(follower)
    assert not follower.refresh()  # the same note: not read again
    note = {"job_id": "f00d", "expected": 6, "started": BASE, "pid": 101}
    partial = run.directory / ".job-f00d.json.101"
    partial.write_text(json.dumps(note))
    os.replace(partial, run.directory / "job-f00d.json")  # as the driver writes it: whole
    run.rollout(BASE + 1, task=0, reward=1.0)
    run.flush()
    clock.now = BASE + 10
    assert follower.refresh()
    (job,) = follower.jobs.values()
    assert (job.expected, job.done) == (6, 1)
    assert re.search(r"job        f00d  1 of 6 done \(17%\), 0 failed, mean reward 1\.000, ETA \d+s", _screen(follower))
