"""Gym as it runs without us: one uninstrumented fleet per Gym version, shared by the session.

Three kinds of test need an uninstrumented Gym: the harness's own check that a trio
starts, serves and stops clean (tests/harness/tests/), the reference result
an instrumented rollout must equal (tests/test_realgym_trace.py), and the reference
shutdown a faulty telemetry pipeline must not slow down (tests/test_realgym_faults.py).
They only read what one run produced, so one run per version serves them all
(tests/conftest.py: the ``bare_gym`` fixture): Gym starts its own Ray (as users run it),
one rollout then eight at four at once, and a SIGINT timed as in ``stop_timed``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import signal
import threading
import time

import psutil

from tests.harness.trio import GymTrio

# Gym's line when it had to SIGKILL a server after its grace period.
GYM_KILLED = "didn't shutdown within"


@dataclasses.dataclass
class Shutdown:
    """What one SIGINT to ``gym env start`` did, timed from the signal."""

    servers: tuple[str, ...]
    server_exit: dict[str, float]  # server -> seconds until its process exited
    uvicorn_done: dict[str, float]  # server -> seconds until uvicorn's "Finished server process"
    gym_exit: float
    returncode: int | None
    log: str

    @property
    def killed(self) -> set[str]:
        """Servers Gym had to SIGKILL after its grace period."""
        for line in self.log.splitlines():
            if GYM_KILLED in line:
                return {name for name in self.servers if name in line}
        return set()


def stop_timed(trio: GymTrio) -> Shutdown:
    """SIGINT ``gym env start`` as a user would; time every server's exit and the log."""
    servers = trio.server_processes()
    log_lines: list[tuple[float, str]] = []
    exits: dict[str, float] = {}
    done = threading.Event()
    t0 = time.monotonic()

    def tail() -> None:
        with open(trio.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            pending = b""
            while not done.is_set():
                chunk = fh.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    now = time.monotonic() - t0
                    log_lines.extend((now, line.decode(errors="replace")) for line in lines)
                else:
                    time.sleep(0.005)

    def watch(name: str, process: psutil.Process) -> None:
        while True:
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.005)
        exits[name] = time.monotonic() - t0

    threads = [threading.Thread(target=tail, daemon=True)]
    threads += [threading.Thread(target=watch, args=(n, p), daemon=True) for n, p in servers.items()]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    os.kill(trio.proc.pid, signal.SIGINT)
    try:
        returncode = trio.proc.wait(timeout=60)
    except Exception:
        returncode = None
    gym_exit = time.monotonic() - t0
    for thread in threads[1:]:
        thread.join(timeout=15)
    time.sleep(0.2)
    done.set()
    threads[0].join(timeout=5)
    trio.stop()  # reaps anything left (nothing, normally)
    # uvicorn names the pid; Gym's "(<server>) " prefixes can interleave with other lines
    by_pid = {str(p.pid): name for name, p in servers.items()}
    uvicorn_done: dict[str, float] = {}
    for at, line in log_lines:
        for pid in re.findall(r"Finished server process \[(\d+)\]", line):
            if pid in by_pid:
                uvicorn_done.setdefault(by_pid[pid], at)
    return Shutdown(tuple(trio.server_names), exits, uvicorn_done, gym_exit, returncode, trio.log_text())


@dataclasses.dataclass
class BareRun:
    """One uninstrumented fleet's run, kept for the tests that read it."""

    version: str
    server_names: tuple[str, ...]
    servers: dict[str, list[str]]  # server -> its main process's command line, while running
    results: list[dict]  # one rollout, then eight at four at once
    processes: list[psutil.Process]  # every process of the fleet seen while it ran
    shutdown: Shutdown
    ray_tmpdir_left: str | None  # the trio's private Ray temp dir after stop (None: removed)


def bare_run(version: str, workdir: pathlib.Path, policy_url: str) -> BareRun:
    trio = GymTrio.for_version(version, workdir, policy_url=policy_url, with_project=False, own_ray=True)
    trio.start()
    try:
        servers = {name: process.cmdline() for name, process in trio.server_processes().items()}
        processes = trio.processes()
        results = [trio.rollout()] + trio.rollouts(8, concurrency=4)
    except BaseException:
        trio.stop()
        raise
    shutdown = stop_timed(trio)
    return BareRun(version, tuple(trio.server_names), servers, results, processes, shutdown, trio.ray_tmpdir)
