"""``gym-autoinstr view --follow`` in a real terminal (tmux) on a real collection job.

The session's shared fleet of Gym 0.4.0 (``job_fleets``, tests/harness/jobs.py: a traced
trio whose graded resources server returns each task's own reward, every process also
writing the run directory ``fleet.files``) runs Gym's own collection driver on 100 tasks
x 3 repeats while ``gym-autoinstr view --follow <fleet.files>`` runs in a tmux pane of its
own server (``tmux -L``: nobody else's tmux is touched).  The pane is captured
(``capture-pane -p``) about once a second while the job runs: the job's line shows its
size from the job's note before its span exists, its done count rises, and an ETA is
shown.  After the job, the pane shows it done and ended; the fleet keeps running, so the
run does not end and the follower is stopped with Ctrl-C (``send-keys C-c``), after which
its final summary is checked against Gym's own output file: rollouts done, failures and
the mean reward of this job.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.jobs import output_rows
from tests.harness.traces import job_spans

pytestmark = pytest.mark.realgym

TASKS, REPEATS = 100, 3
WIDTH, HEIGHT = 150, 30


def _reward(task: int) -> float:
    return (task % 7) / 6  # 0, 1/6, ... 1, 0, ...: a mean that is not a round number


class Pane:
    """One tmux server of the test's own (its socket name), one window, one command."""

    def __init__(self, command: list[str], workdir: Path) -> None:
        self.socket = f"gym-follow-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        self.env.pop("TMUX", None)
        self.env.pop("COLUMNS", None)
        self.env.pop("LINES", None)
        shell = f"cd {shlex.quote(str(workdir))} && exec {shlex.join(command)}"
        self._tmux("new-session", "-d", "-s", "follow", "-x", str(WIDTH), "-y", str(HEIGHT), shell)
        self._tmux("set-option", "-t", "follow", "remain-on-exit", "on")  # the summary stays readable

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-u", "-L", self.socket, *args], capture_output=True, text=True, timeout=30, env=self.env
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def capture(self, *, history: bool = False) -> str:
        """The pane's screen (``history``: with the lines scrolled off it)."""
        return self._tmux("capture-pane", "-p", "-J", *(("-S", "-") if history else ()), "-t", "follow")

    def interrupt(self) -> None:
        self._tmux("send-keys", "-t", "follow", "C-c")

    def dead(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "follow", "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, env=self.env)


def _command() -> list[str]:
    script = Path(sys.executable).parent / "gym-autoinstr"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gym_autoinstr.commands.cli"]


def _job_line(screen: str, job_prefix: str) -> re.Match | None:
    return re.search(rf"job +{job_prefix}  (\d+) of (\d+|\?) done(.*)", screen)


def _wait_for(predicate, timeout: float, pane: Pane, what: str, kept: list | None = None) -> str:
    """The pane's screen once ``predicate`` holds for it (each capture also added to ``kept``)."""
    deadline = time.monotonic() + timeout
    screen = pane.capture()
    while not predicate(screen):
        assert time.monotonic() < deadline, f"{what}; the pane shows:\n{screen}"
        if kept is not None:
            kept.append((time.monotonic(), screen))
        time.sleep(0.5)
        screen = pane.capture()
    return screen


def test_follow_in_a_terminal_shows_a_real_job_live_and_sums_it_up_as_gym_wrote_it(job_fleets, tmp_path):
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (./run-tests installs it as root: apt-get install tmux)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    fleet = job_fleets("0.4.0")
    row = fleet.trio.default_row()
    tasks = [{**row, "verifier_metadata": {"reward": _reward(task), "row": task}} for task in range(TASKS)]
    known_notes = set(fleet.files.glob("job-*.json"))
    pane = Pane(_command() + ["view", "--follow", str(fleet.files)], tmp_path)
    screens: list[tuple[float, str]] = []
    try:
        _wait_for(lambda s: "rollouts " in s, 60, pane, "the follower never drew its block")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # (one at a time: on an idle machine a rollout takes ~40 ms, so the job lasts ~12 s, several
            # refreshes of the view; two at once it was over within two)
            job = pool.submit(fleet.collect, rows=tasks, repeats=REPEATS, parallel=1)
            while not job.done():
                screens.append((time.monotonic(), pane.capture()))
                time.sleep(0.5)
            start_ns, output = job.result()
        ran_for = screens[-1][0] - screens[0][0]
        rows = output_rows(output)
        assert len(rows) == TASKS * REPEATS
        (note,) = set(fleet.files.glob("job-*.json")) - known_notes
        job_id = json.loads(note.read_text())["job_id"]
        (job_span,) = job_spans(fleet.wait_for_rollouts(start_ns, len(rows)))
        assert job_span["attributes"]["nemo.gym.job.id"] == job_id
        assert job_span["attributes"]["nemo.gym.job.rollouts.expected"] == TASKS * REPEATS

        # after the job: every rollout done, the job's span arrived (ended), nothing failed (the
        # screens until then count as progress too: the view is a few seconds behind the files)
        after = _wait_for(
            lambda s: (m := _job_line(s, job_id[:8])) is not None and "ended" in m.group(3) and m.group(1) == "300",
            60,
            pane,
            "the job never showed as done and ended",
            kept=screens,
        )
        assert re.search(rf"job +{job_id[:8]}  300 of 300 done \(100%\), 0 failed, ", after)
        assert not pane.dead()  # the fleet still runs: the run has not ended

        # on the way: its size from the note (before its span existed), its done count rising, an ETA
        progress = []
        for _when, screen in screens:
            line = _job_line(screen, job_id[:8])
            if line is not None:
                progress.append((int(line.group(1)), line.group(2), line.group(3), screen))
        assert progress, "the job never showed while it ran:\n" + screens[-1][1]
        # (the note says the size from before the first dispatch: no rollout is counted without it)
        assert all(size == str(TASKS * REPEATS) for done, size, _rest, _screen in progress if done)
        counts = [done for done, *_rest in progress]
        print(f"done counts seen, a capture every 0.5 s (the job ran {ran_for:.1f} s): {counts}")
        assert counts == sorted(counts), counts  # never backwards
        under_way = sorted({done for done in counts if 0 < done < TASKS * REPEATS})
        assert len(under_way) >= 3, (counts, f"the job ran {ran_for:.1f} s")  # seen rising, not only at its ends
        with_eta = [rest for _done, _size, rest, _screen in progress if re.search(r"ETA \d+(m \d\d)?s", rest)]
        assert with_eta, [rest for *_x, rest, _s in progress]
        during = min(  # the screen nearest half way, to show
            ((done, screen) for done, _size, rest, screen in progress if 0 < done < 300 and re.search(r"ETA \d", rest)),
            key=lambda seen: abs(seen[0] - 150),
        )[1]

        pane.interrupt()
        _wait_for(lambda s: "processes: " in s, 60, pane, "no final summary after Ctrl-C")
        final = pane.capture(history=True)  # (the summary's first line may have scrolled off)
    finally:
        for title, screen in (("while the job ran", locals().get("during")), ("after the job", locals().get("after"))):
            print(f"--- the pane {title} ---\n{screen}")
        print(f"--- the pane after Ctrl-C ---\n{locals().get('final')}")
        pane.close()
    lines = final.splitlines()
    summary = lines[max(i for i, line in enumerate(lines) if line.startswith("run ")) :]
    assert summary[0].endswith("stopped (Ctrl-C)")
    total = re.match(r"rollouts: ([\d,]+) done, ([\d,]+) failed", summary[1])
    assert total and int(total.group(1).replace(",", "")) >= len(rows)  # the run's, this job's among them
    # this job's line against Gym's output file (and its failures sidecar, where it writes one)
    failures_file = Path(output).with_name(Path(output).stem + "_failures.jsonl")
    failed = len(output_rows(str(failures_file))) if failures_file.exists() else 0
    mean = sum(r["reward"] for r in rows) / len(rows)
    assert sorted(r["reward"] for r in rows) == sorted(_reward(t) for t in range(TASKS) for _ in range(REPEATS))
    (job_line,) = [line for line in summary if line.startswith(f"job {job_id[:8]}")]
    expected = f"job {job_id[:8]}  {len(rows) + failed} of {TASKS * REPEATS} done (100%), {failed} failed, "
    assert job_line.startswith(expected + f"mean reward {mean:.3f}, ended "), job_line
    assert any(line.startswith("spans lost: ") for line in summary)
    assert next(line for line in summary if line.startswith("processes: ")).endswith(" exited")
