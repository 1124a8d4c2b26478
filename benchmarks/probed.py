"""Reading a probed trio (``benchmarks/probe`` in its servers), for ``--attribution``.

Per server process: its CPU and each thread's from ``/proc``, and the probe's answers (GC
per generation, the Python threads' names, the heap on request); ``delta`` puts the CPU
of an interval in buckets by thread (main, telemetry, other Python, native, ended).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import time

from benchmarks.fleet import SERVERS, Variant

TICK = os.sysconf("SC_CLK_TCK")
BUCKETS = ("main", "telemetry", "python_other", "native", "exited")


def _stat_times(path: str) -> tuple[float, float] | None:
    """(utime, stime) in seconds from a ``/proc/.../stat`` file."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[11]) / TICK, int(rest[12]) / TICK


def _stat_cpu(path: str) -> float | None:
    """utime + stime in seconds from a ``/proc/.../stat`` file."""
    times = _stat_times(path)
    return None if times is None else times[0] + times[1]


def read_threads(pid: int) -> tuple[float | None, dict[int, float], float | None, dict[int, str]]:
    """The process's CPU, its threads' CPU by thread id, the process's system (kernel)
    time, in seconds, and the threads' OS names (``comm``: what a native library named
    its thread; a Python thread's is the interpreter's, not its Python name)."""
    times = _stat_times(f"/proc/{pid}/stat")
    total = None if times is None else times[0] + times[1]
    threads: dict[int, float] = {}
    comms: dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        cpu = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        if cpu is not None:
            threads[int(tid)] = cpu
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comms[int(tid)] = f.read().strip()
            except OSError:
                pass
    return total, threads, None if times is None else times[1], comms


def classify(pid: int, tid: int, names: dict) -> str:
    if tid == pid:
        return "main"
    name = names.get(str(tid))
    if name is None:
        return "native"
    if name == "bench-probe":
        return "probe"
    if name.startswith(("Otel", "gym-autoinstr")):
        return "telemetry"
    return "python_other"


class Probed:
    """A variant's trio with the probe in its servers: snapshots on request."""

    def __init__(self, variant: Variant, directory: pathlib.Path) -> None:
        self.variant = variant
        self.dir = directory
        self.seq = 0
        self.pids = {name: proc.pid for name, proc in variant.trio.server_processes().items()}
        missing = [s for s in SERVERS if s not in self.pids]
        if missing:
            raise RuntimeError(f"{variant.label}: no server process for {missing}")

    def _probe(self, heavy: bool = False, timeout: float = 10.0) -> dict:
        self.seq += 1
        seq = -self.seq if heavy else self.seq
        tmp = self.dir / "request.tmp"
        tmp.write_text(str(seq))
        os.replace(tmp, self.dir / "request")
        deadline = time.monotonic() + timeout
        out: dict = {}
        while True:
            for name, pid in self.pids.items():
                if name in out:
                    continue
                try:
                    data = json.loads((self.dir / f"{name}-{pid}.json").read_text())
                except (OSError, ValueError):
                    continue
                if data.get("seq") == seq:
                    out[name] = data
            if len(out) == len(self.pids):
                return out
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.variant.label}: no probe answer from "
                    f"{sorted(set(self.pids) - set(out))} in {self.dir} (is the probe loaded?)"
                )
            time.sleep(0.01)

    def snapshot(self, heavy: bool = False) -> dict:
        probe = self._probe(heavy)
        snap = {"t": time.monotonic(), "servers": {}}
        for name, pid in self.pids.items():
            total, threads, system, comms = read_threads(pid)
            snap["servers"][name] = {
                "pid": pid,
                "cpu": total,
                "threads": threads,
                "system": system,
                "comms": comms,
                "probe": probe[name],
            }
        return snap


def delta(before: dict, after: dict) -> dict:
    """Per server: CPU seconds by bucket, GC per generation, over the interval."""
    out = {}
    for name, a in after["servers"].items():
        b = before["servers"][name]
        pid = a["pid"]
        names = {**b["probe"].get("threads", {}), **a["probe"].get("threads", {})}
        buckets = dict.fromkeys(BUCKETS + ("probe",), 0.0)
        other_names: collections.Counter[str] = collections.Counter()
        native_names: collections.Counter[str] = collections.Counter()
        live = 0.0
        for tid, cpu in a["threads"].items():
            d = cpu - b["threads"].get(tid, 0.0)
            live += d
            bucket = classify(pid, tid, names)
            buckets[bucket] += d
            if bucket == "python_other" and d > 0:
                other_names[names[str(tid)]] += d
            elif bucket == "native" and d > 0:  # by OS name (absent in older --json files)
                native_names[(a.get("comms") or {}).get(tid) or "?"] += d
        process = a["cpu"] - b["cpu"]
        buckets["exited"] = max(0.0, process - live)
        gc = {}
        for gen in ("0", "1", "2"):
            ga, gb = a["probe"]["gc"][gen], b["probe"]["gc"][gen]
            gc[gen] = {
                "collections": ga[0] - gb[0],
                "pause_wall_s": ga[1] - gb[1],
                "pause_cpu_s": ga[2] - gb[2],
                "collected": ga[3] - gb[3],
            }
        after_sys, before_sys = a.get("system"), b.get("system")  # (absent in older --json files)
        system = after_sys - before_sys if after_sys is not None and before_sys is not None else 0.0
        out[name] = {
            "process": process - buckets["probe"],
            "buckets": buckets,
            "gc": gc,
            "system": system,
            "other_threads": dict(other_names),
            "native_threads": dict(native_names),
        }
    return out


def subtract_idle(d: dict, idle: dict, seconds: float) -> dict:
    """``d`` less ``idle`` (a per-second delta) times ``seconds``, CPU fields only."""
    for name, row in d.items():
        irow = idle[name]
        row["process"] -= irow["process"] * seconds
        row["system"] = row.get("system", 0.0) - irow.get("system", 0.0) * seconds
        for bucket in row["buckets"]:
            row["buckets"][bucket] -= irow["buckets"][bucket] * seconds
    return d


def scaled(d: dict, factor: float) -> dict:
    return {
        name: {
            "process": row["process"] * factor,
            "system": row.get("system", 0.0) * factor,
            "buckets": {k: v * factor for k, v in row["buckets"].items()},
        }
        for name, row in d.items()
    }
