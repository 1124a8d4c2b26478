"""Where the CPU of a traced rollout goes: bare Gym 0.4.0 against ours, side by side.

Run with ``./run-benchmarks --attribution [--quick] [--json FILE]`` from the repository
root (``--help`` for the options).  Each variant is a real trio (the same servers as
``benchmarks.run``) in front of the instant policy model, loaded with closed-loop
rollouts at concurrency 32 in time boxes, variants interleaved, a few repetitions.

Every trio is started with ``benchmarks/probe`` on ``PYTHONPATH`` (bare and ours alike,
so both pay the same for it): where OpenTelemetry is installed the probe runs its
start-up as ``opentelemetry-instrument`` would (ours exports spans and metrics over
OTLP/HTTP to the real collector, as a user with ``OTEL_EXPORTER_OTLP_ENDPOINT`` gets
them), and in every server process it times garbage collection with ``gc.callbacks`` and
names the Python threads.  Before and after each window the benchmark reads, per server
process:

* CPU of the process and of each thread (``/proc/<pid>/stat``,
  ``/proc/<pid>/task/<tid>/stat``), put in buckets: the main thread (the event loop that
  serves requests), telemetry threads (OpenTelemetry's export and metric-reader threads,
  ours), other Python threads (by name), native threads (no Python name: Ray's core
  worker and the like; also reported by their OS name, ``/proc/<pid>/task/<tid>/comm``),
  threads that ended inside the window (the process's CPU less its
  live threads'); the probe's own thread is left out; and the process's kernel (system)
  time, all threads;
* garbage collections per generation, their pause (CPU of the collecting thread, and
  wall) and objects collected;
* spans per rollout, by server, as counted at the sink (each rollout's trace id carries
  the window's tag).

The window's CPU is read once its spans have all reached the sink (the export of its
tail is counted), less the trio's idle CPU over that wait.  Everything is per rollout,
median over windows; a delta is the median of per-repetition differences to bare.

With ``--together`` every variant is loaded at once in each window (one closed-loop
load generator per trio, on threads of the benchmark, started in an order rotated from
one window to the next), so that all of them run under
the same machine conditions: on a shared host the CPU a rollout costs drifts by a few
ms from one window to the next, and with variants taking turns that drift lands in the
differences; loaded together, it is shared.  The trios then compete for the cores,
which costs each of them some CPU per rollout (switches, caches): compare the ratios,
not the absolute ms, with a run that takes turns.

With ``--py-spy`` (py-spy installed into the runner venv on first use), one more window
per variant is sampled with ``py-spy record --nonblocking`` on every server, and each
sample is charged to the innermost frame that belongs to a third-party package or this
project: OpenTelemetry's span lifecycle, propagation and context, export and encoding,
metrics, other OpenTelemetry code, ours, ``wrapt``, Gym and everything else.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.load import run_load
from benchmarks.options import attribution_parser
from benchmarks.run import (
    GENERIC_STACK,
    GYM_VERSION,
    REPO,
    SERVERS,
    Variant,
    _spread,
    finish,
    load_together,
    log,
    machine,
    make_variants,
    printed_saved_report,
    rewarded,
    rollout_body,
    rotated,
    settle,
    start_trios,
    tear_down,
    use_bench_venvs,
)
from benchmarks.sink import CountingSink
from tests.harness.collector import Collector
from tests.harness.gym_install import gym_venv
from tests.harness.trio import AGENT, MODEL, RESOURCES, PolicyModel

PROBE = REPO / "benchmarks" / "probe"
PHASE_WARMUP, PHASE_WINDOW, PHASE_SPY = 8, 9, 10
TICK = os.sysconf("SC_CLK_TCK")
SHORT = {RESOURCES: "resources", AGENT: "agent", MODEL: "model"}
BUCKETS = ("main", "telemetry", "python_other", "native", "exited")
IDLE_SHORT = {
    "main": "main",
    "telemetry": "telemetry",
    "python_other": "other Python",
    "native": "native",
    "exited": "ended",
}
BUCKET_LABELS = {
    "main": "main thread (event loop: requests)",
    "telemetry": "telemetry threads (OpenTelemetry export, metric reader, ours)",
    "python_other": "other Python threads",
    "native": "native threads (no Python name: Ray core worker, ...)",
    "exited": "threads that ended in the window",
}


# ------------------------------------------------------------------ reading a process


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


# ------------------------------------------------------------------ py-spy (optional)


SPY_CATEGORIES = (
    ("opentelemetry/sdk/trace/export", "OpenTelemetry batching (hand-off to, and the export thread's loop)"),
    ("opentelemetry/sdk/_shared_internal", "OpenTelemetry batching (hand-off to, and the export thread's loop)"),
    ("opentelemetry/exporter", "OpenTelemetry export (encode, HTTP)"),
    ("opentelemetry/proto", "OpenTelemetry export (encode, HTTP)"),
    ("google/protobuf", "OpenTelemetry export (encode, HTTP)"),
    ("opentelemetry/sdk/metrics", "OpenTelemetry metrics"),
    ("opentelemetry/sdk/trace", "OpenTelemetry span lifecycle (SDK)"),
    ("opentelemetry/sdk/resources", "OpenTelemetry span lifecycle (SDK)"),
    ("opentelemetry/sdk/util", "OpenTelemetry span lifecycle (SDK)"),
    ("opentelemetry/attributes", "OpenTelemetry span lifecycle (SDK)"),
    ("opentelemetry/propagat", "OpenTelemetry propagation and context"),
    ("opentelemetry/trace/propagation", "OpenTelemetry propagation and context"),
    ("opentelemetry/context", "OpenTelemetry propagation and context"),
    ("opentelemetry/baggage", "OpenTelemetry propagation and context"),
    ("opentelemetry/", "OpenTelemetry, other (API, instrumentation, util)"),
    ("gym_autoinstr/", "ours (gym_autoinstr)"),
    ("wrapt/", "wrapt"),
)
OTHER = "Gym and its libraries (FastAPI, uvicorn, aiohttp, pydantic, ...)"
TELEMETRY_OTHER = "telemetry threads: HTTP post and the rest"


def _spy_category(stack: str) -> str:
    """py-spy's raw lines (``--threads --full-filenames``) read ``thread (tid): name;
    outermost (file:line);...;innermost``.  The innermost frame outside the standard
    library decides (standard-library frames are charged to their caller); in a
    telemetry thread what no category claims (``requests``, ``urllib3``) is the export's."""
    frames = stack.split(";")
    thread = ""
    if frames and frames[0].startswith("thread ("):
        thread = frames[0].split(": ", 1)[-1]
        frames = frames[1:]
    telemetry = thread.startswith(("Otel", "gym-autoinstr"))
    for frame in reversed(frames):
        start = frame.rfind(" (")
        path = frame[start + 2 :] if start >= 0 else frame
        if "/site-packages/" in path:
            path = path.rsplit("/site-packages/", 1)[1]
        elif "/gym_autoinstr/" in path:  # an editable install of this project
            path = path[path.rindex("/gym_autoinstr/") + 1 :]
        elif path.startswith("<") or "/lib/python3" in path:
            continue  # the standard library: charged to its caller
        for prefix, category in SPY_CATEGORIES:
            if path.startswith(prefix):
                return category
        return TELEMETRY_OTHER if telemetry else OTHER
    return TELEMETRY_OTHER if telemetry else "standard library only (no other frame on the stack)"


def find_py_spy(install: bool) -> str | None:
    here = pathlib.Path(sys.executable).parent / "py-spy"
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if found or not install:
        return found
    log("installing py-spy into the runner venv")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], capture_output=True, text=True)
    if done.returncode != 0:
        log(f"py-spy not installed: {done.stderr.strip()[-300:]}")
        return None
    return str(here) if here.exists() else shutil.which("py-spy")


def spy_window(
    spy: str, probed: Probed, seconds: float, concurrency: int, body: bytes, rate: int, workdir: pathlib.Path
) -> dict:
    v = probed.variant
    procs, files = [], {}
    for name, pid in probed.pids.items():
        out = workdir / f"{v.key}-{SHORT[name]}.txt"
        files[name] = out
        procs.append(
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(rate),
                    "--duration",
                    str(int(seconds + 1)),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--threads",
                    "--gil",
                    "--full-filenames",
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    time.sleep(0.5)
    s0 = probed.snapshot()
    result = run_load(
        v.trio.run_url, body, 10**6, concurrency, tag=v.load_tag(PHASE_SPY), check=rewarded, duration=seconds
    )
    s1 = probed.snapshot()
    cpu = {name: row["process"] for name, row in delta(s0, s1).items()}
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append(err.decode(errors="replace").strip()[-300:])
    by_server: dict = {}
    for name, path in files.items():
        cats: collections.Counter[str] = collections.Counter()
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            # --threads puts "thread (0x...)" first; samples off the main thread are marked
            cats[_spy_category(stack)] += int(count)
        by_server[name] = dict(cats)
    return {
        "rollouts": result.n,
        "rate": rate,
        "seconds": seconds,
        "samples": by_server,
        "errors": errors,
        "cpu_s": cpu,
    }


# ------------------------------------------------------------------ report


def together_window(
    variants: list,
    probed: dict,
    idle: dict,
    sink: CountingSink,
    body: bytes,
    seconds: float,
    concurrency: int,
    windows: dict,
) -> None:
    """One window with every variant loaded at the same time (``--together``)."""
    before = {v.key: probed[v.key].snapshot() for v in variants}
    # every trio's spans of this window at the sink before any CPU is read
    loads, waited = load_together(variants, sink, body, seconds, concurrency, PHASE_WINDOW)
    after = {v.key: probed[v.key].snapshot() for v in variants}
    for v in variants:
        result = loads[v.key]
        d = subtract_idle(delta(before[v.key], after[v.key]), idle[v.key], waited)
        windows[v.key].append({"n": result.n, "seconds": result.seconds, "settle_s": waited, "delta": d})


def _med(values):
    return statistics.median(values) if values else float("nan")


def _gc_adjusted(keys: list, labels: dict, windows: dict, total) -> list:
    """The per-window overheads with full collections spread evenly.  A full collection
    costs a server 130-170 ms of CPU and comes once per 100-200 rollouts, so a window holds
    zero to two per server, wherever they happened to fall: several ms of a window's
    total.  Each window's full-collection CPU is replaced by the variant's own rate over
    the whole run (per rollout); every variant keeps its GC cost, only where it fell is
    taken out."""

    def full(delta):
        return sum(row["gc"]["2"]["pause_cpu_s"] for row in delta.values())

    adjusted = {}
    for k in keys:
        rollouts = sum(w["n"] for w in windows[k])
        rate = sum(full(w["delta"]) for w in windows[k]) / rollouts if rollouts else 0.0
        adjusted[k] = [(total(w["delta"]) - full(w["delta"])) * 1e3 / w["n"] + rate * 1e3 for w in windows[k] if w["n"]]
    raw = {k: per_rollout(windows[k], total) for k in keys}
    cells = []
    for k in keys:
        if k == "bare":
            continue
        deltas = [a - b for a, b in zip(adjusted[k], adjusted["bare"])]
        raw_deltas = [a - b for a, b in zip(raw[k], raw["bare"])]
        spread = (
            f"; per-window sd {statistics.stdev(raw_deltas):.2f} -> {statistics.stdev(deltas):.2f} ms"
            if len(deltas) > 1
            else ""
        )
        cells.append(f"{labels[k]} {_sign(_med(deltas), '{:.2f}')} ms{spread}")
    return [
        "Overhead per rollout with full collections spread evenly over the run (median of per-window "
        "deltas; the spread before -> after): " + ", ".join(cells)
    ]


def per_rollout(windows: list, path) -> list:
    """Per window: a value (ms per rollout) picked out of the window's delta by ``path``."""
    return [path(w["delta"]) * 1e3 / w["n"] for w in windows if w["n"]]


def _gc_value(field):
    return lambda gen: lambda d: sum(row["gc"][gen][field] for row in d.values())


def report(results: dict) -> str:
    keys = [v["key"] for v in results["variants"]]
    labels = {v["key"]: v["label"] for v in results["variants"]}
    windows = results["windows"]
    lines = []
    m = results["machine"]
    lines.append(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gb']} GB; Gym {results['gym']} on Python "
        f"{m['python_gym']}; load average at start {', '.join(f'{x:.1f}' for x in m['load_avg_at_start'])}"
    )
    how = (
        "all variants loaded at once in each window (--together)" if results.get("together") else "variants interleaved"
    )
    lines.append(
        f"attribution: {results['reps']} windows of {results['seconds']:g} s per variant at concurrency "
        f"{results['concurrency']}, instant policy model, {how}; ms per rollout, median over "
        "windows; delta: median of per-window differences to bare"
    )
    lines.append("")

    def row(label, path, fmt="{:.2f}", delta=True):
        cells = []
        base = per_rollout(windows["bare"], path)
        for k in keys:
            vals = per_rollout(windows[k], path)
            cell = fmt.format(_med(vals))
            if k != "bare" and delta:
                diffs = [x - y for x, y in zip(vals, base)]
                cell += f" ({_sign(_med(diffs), fmt)})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    head = " | ".join(labels[k] + ("" if k == "bare" else " (delta)") for k in keys)
    lines.append(f"| server CPU, ms per rollout | {head} |")
    lines.append("|---|" + "---|" * len(keys))
    row("**all three servers, process CPU** (probe thread left out)", lambda d: sum(r["process"] for r in d.values()))
    for bucket in BUCKETS:
        row(f"  {BUCKET_LABELS[bucket]}", lambda d, b=bucket: sum(r["buckets"][b] for r in d.values()))
    row(
        "  of which: GC pauses (CPU of the collecting thread)",
        lambda d: sum(g["pause_cpu_s"] for r in d.values() for g in r["gc"].values()),
    )
    row(
        "  of which: in the kernel (system time, every thread)", lambda d: sum(r.get("system", 0.0) for r in d.values())
    )
    for name in SERVERS:
        row(f"{SHORT[name]} server: process CPU", lambda d, n=name: d[n]["process"])
        row(f"  {SHORT[name]}: main thread", lambda d, n=name: d[n]["buckets"]["main"])
        row(f"  {SHORT[name]}: telemetry threads", lambda d, n=name: d[n]["buckets"]["telemetry"])
        row(
            f"  {SHORT[name]}: other threads (Python, native, ended)",
            lambda d, n=name: sum(d[n]["buckets"][b] for b in ("python_other", "native", "exited")),
        )
    lines.append("")
    total = lambda d: sum(r["process"] for r in d.values())  # noqa: E731
    base = per_rollout(windows["bare"], total)
    per_variant = {k: per_rollout(windows[k], total) for k in keys}
    lines.append(
        "CPU capacity ratio to bare (bare's CPU per rollout over the variant's, per window): "
        + ", ".join(
            f"{labels[k]} {_spread([b / x for b, x in zip(base, per_variant[k]) if x > 0])}"
            for k in keys
            if k != "bare"
        )
    )
    if "default" in per_variant and "sampled" in per_variant:
        ratios = [(s - b) / (t - b) for s, t, b in zip(per_variant["sampled"], per_variant["default"], base) if t > b]
        lines.append(
            f"A sampled-out rollout's overhead over a traced one's (target <= 0.20), per window: {_spread(ratios)}"
        )
    # Pooled: every window's CPU over every window's rollouts, per variant (a window's
    # drift weighs by its rollouts instead of deciding a median).
    pooled = {
        k: sum(total(w["delta"]) for w in windows[k]) * 1e3 / max(1, sum(w["n"] for w in windows[k])) for k in keys
    }
    over = {k: pooled[k] - pooled["bare"] for k in keys}
    text = ", ".join(
        f"{labels[k]} {pooled['bare'] / pooled[k]:.3f} ({_sign(over[k], '{:.2f}')} ms)"
        for k in keys
        if k != "bare" and pooled[k] > 0
    )
    lines.append(
        f"Pooled over all windows (all CPU over all rollouts; capacity ratio to bare, overhead per rollout): {text}"
    )
    if "default" in pooled and "sampled" in pooled and over["default"] > 0:
        lines.append(
            f"Pooled, a sampled-out rollout's overhead over a traced one's: {over['sampled'] / over['default']:.3f}"
        )
    lines.extend(_gc_adjusted(keys, labels, windows, total))
    lines.append("")

    lines.append("Garbage collection per rollout, all three servers (collections; pause ms of CPU; pause ms wall):")
    lines.append("")
    lines.append(f"| generation | {' | '.join(labels[k] for k in keys)} |")
    lines.append("|---|" + "---|" * len(keys))
    for gen in ("0", "1", "2"):
        cells = []
        for k in keys:
            n = [w["n"] for w in windows[k]]
            coll = [sum(r["gc"][gen]["collections"] for r in w["delta"].values()) / w["n"] for w in windows[k]]
            cpu = per_rollout(windows[k], lambda d, g=gen: sum(r["gc"][g]["pause_cpu_s"] for r in d.values()))
            wall = per_rollout(windows[k], lambda d, g=gen: sum(r["gc"][g]["pause_wall_s"] for r in d.values()))
            cells.append(f"{_med(coll):.3f}; {_med(cpu):.3f} ms; {_med(wall):.3f} ms" if n else "-")
        lines.append(f"| {gen} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Per server and generation: collections per rollout, ms of CPU per collection:")
    lines.append("")
    lines.append(f"| server, generation | {' | '.join(labels[k] for k in keys)} |")
    lines.append("|---|" + "---|" * len(keys))
    for name in SERVERS:
        for gen in ("0", "1", "2"):
            cells = []
            for k in keys:
                tot_n = sum(w["n"] for w in windows[k])
                coll = sum(w["delta"][name]["gc"][gen]["collections"] for w in windows[k])
                cpu = sum(w["delta"][name]["gc"][gen]["pause_cpu_s"] for w in windows[k])
                cells.append(
                    f"{coll / tot_n:.4f}; {cpu / coll * 1e3:.2f} ms" if coll else f"{coll / max(tot_n, 1):.4f}; -"
                )
            lines.append(f"| {SHORT[name]}, gen {gen} | " + " | ".join(cells) + " |")
    lines.append("")

    heap = results.get("heap") or {}
    heap_start = results.get("heap_start") or {}
    if heap:
        lines.append(
            "Heap per server: objects tracked by the GC after the warm-up -> at the end; modules loaded "
            "(of them `opentelemetry.*`):"
        )
        lines.append("")
        lines.append(f"| server | {' | '.join(labels[k] for k in keys)} |")
        lines.append("|---|" + "---|" * len(keys))
        for name in SERVERS:
            cells = []
            for k in keys:
                h = heap.get(k, {}).get(name) or {}
                h0 = heap_start.get(k, {}).get(name) or {}
                cells.append(
                    f"{h0.get('tracked_objects', '-')} -> {h.get('tracked_objects', '-')}; "
                    f"{h.get('modules', '-')} ({h.get('otel_modules', '-')})"
                )
            lines.append(f"| {SHORT[name]} | " + " | ".join(cells) + " |")
        lines.append("")

    lines.append(
        "Spans per rollout at the sink, by service: "
        + "; ".join(
            f"{labels[k]}: {results['spans'][k]['per_rollout']:.1f}"
            + (
                " ("
                + ", ".join(
                    f"{s.rsplit('/', 1)[-1] or s} {n:.1f}" for s, n in sorted(results["spans"][k]["by_service"].items())
                )
                + ")"
                if results["spans"][k]["by_service"]
                else ""
            )
            for k in keys
        )
    )
    metrics = {k: v for k, v in results.get("metrics", {}).items() if v is not None}
    if metrics:
        lines.append(
            "Metrics exported over OTLP to the collector during the run (data points; distinct names): "
            + ", ".join(f"{labels[k]} {v['metric_points']}; {len(v['metric_names'])}" for k, v in metrics.items())
        )
    others = collections.Counter()
    for k in keys:
        for w in windows[k]:
            for r in w["delta"].values():
                for tname, cpu in r["other_threads"].items():
                    others[(k, tname)] += cpu * 1e3 / w["n"] / len(windows[k])
    if others:
        lines.append(
            "Other Python threads (ms per rollout): "
            + ", ".join(f"{labels[k]} `{t}` {v:.2f}" for (k, t), v in others.most_common(8) if v >= 0.005)
        )
    native = collections.Counter()
    for k in keys:
        for w in windows[k]:
            for r in w["delta"].values():
                for tname, cpu in r.get("native_threads", {}).items():
                    native[(k, tname)] += cpu * 1e3 / w["n"] / len(windows[k])
    if native:  # (the thread's OS name; threads of one name added up over the three servers)
        lines.append(
            "Native threads by OS name, all three servers (ms per rollout): "
            + "; ".join(
                f"{labels[k]}: "
                + ", ".join(
                    f"`{t}` {v:.3f}"
                    for (kk, t), v in sorted(native.items(), key=lambda item: -item[1])
                    if kk == k and v >= 0.002
                )
                for k in keys
            )
        )
    idle = results.get("idle_ms_per_s")
    if idle:
        lines.append(
            "Idle server CPU (ms per second, subtracted over each window's settle wait of "
            + ", ".join(f"{labels[k]} {_spread([w['settle_s'] for w in windows[k]], '{:.1f}')} s" for k in keys)
            + "): "
            + ", ".join(f"{labels[k]} {v:.1f}" for k, v in idle.items())
        )
    idle_buckets = results.get("idle_buckets_ms_per_s")
    if idle_buckets:
        # what the servers do with no load (the metric export, the loop-lag probe, Ray's
        # threads), by thread; 10 ms clock ticks: resolution about 10 / idle seconds ms/s
        lines.append(
            f"Idle server CPU by thread, all three servers (ms per second over {results['idle_seconds']:g} s): "
            + "; ".join(
                f"{labels[k]}: " + ", ".join(f"{IDLE_SHORT[b]} {v:.2f}" for b, v in row.items())
                for k, row in idle_buckets.items()
            )
        )
    lines.append("")

    spy = results.get("py_spy")
    if spy:
        lines.append(
            "py-spy (one more window per variant, `--nonblocking --gil`: only the thread holding the GIL "
            "is sampled; a sample is charged to "
            "the innermost frame outside the standard library; per server, each category's share of the "
            "samples times the server's CPU per rollout in that window (from /proc), summed over the "
            "three servers; ms per rollout):"
        )
        lines.append("")
        cats = sorted({c for k in spy for s in spy[k]["samples"].values() for c in s})
        lines.append(f"| where | {' | '.join(labels[k] for k in spy)} |")
        lines.append("|---|" + "---|" * len(spy))
        for c in cats:
            cells = []
            for r in spy.values():
                ms = 0.0
                for name, s in r["samples"].items():
                    total = sum(s.values())
                    if total:
                        ms += s.get(c, 0) / total * r["cpu_s"].get(name, 0.0) * 1e3 / max(r["rollouts"], 1)
                cells.append(f"{ms:.2f}")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append(
            "| **all (the servers' CPU per rollout in that window)** | "
            + " | ".join(f"{sum(r['cpu_s'].values()) * 1e3 / max(r['rollouts'], 1):.2f}" for r in spy.values())
            + " |"
        )
        errors = [e for r in spy.values() for e in r.get("errors", [])]
        if errors:
            lines.append("")
            lines.append("py-spy errors: " + " / ".join(errors[:3]))
        lines.append("")
    elif results.get("py_spy_note"):
        lines.append(results["py_spy_note"])
        lines.append("")
    return "\n".join(lines)


def _sign(value: float, fmt: str) -> str:
    text = fmt.format(value)
    return text if text.startswith("-") else "+" + text


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    a = attribution_parser().parse_args(argv)
    if printed_saved_report(a, report):
        return 0
    reps = a.reps or (2 if a.quick else 4)
    seconds = a.seconds or (5.0 if a.quick else 10.0)
    keys = [k.strip() for k in a.variants.split(",") if k.strip()]
    t_start = time.monotonic()

    use_bench_venvs()
    venvs = {"bare": gym_venv(GYM_VERSION, with_project=False), "ours": gym_venv(GYM_VERSION)}
    if "generic" in keys:
        venvs["generic"] = gym_venv(GYM_VERSION, with_project=False, extra=GENERIC_STACK)
    spy = find_py_spy(install=True) if a.py_spy else None

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-attr-"))
    sink = CountingSink()
    collector = Collector(log_dir=scratch / "collector", sink=sink, batch_timeout="200ms")
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    probe_env = {"PYTHONPATH": str(PROBE), "GYM_AUTOINSTR_BENCH_GC": "1", "GYM_AUTOINSTR_BENCH_SDK_COUNTERS": "0"}
    variants = make_variants(keys, venvs, otlp, extra_env=probe_env, instrument=False)
    for i, spec in enumerate(a.lever):
        label, _, assignments = spec.partition(":")
        label, _, base_key = label.partition("@")
        base_key = base_key or "default"
        if base_key not in ("default", "sampled", "off"):
            raise SystemExit(f"--lever {spec!r}: the base after '@' is 'default', 'sampled' or 'off', not {base_key!r}")
        base = make_variants([base_key], venvs, otlp, extra_env=probe_env, instrument=False)[1]
        env = dict(base.env)
        for assignment in filter(None, (x.strip() for x in assignments.split(","))):
            name, eq, value = assignment.partition("=")
            if not eq or not name:
                raise SystemExit(f"--lever {spec!r}: expected LABEL:KEY=VALUE[,KEY=VALUE...]")
            env[name] = value
        key = f"lever{i + 1}"
        env["NEMO_GYM_OTEL_RUN_ID"] = f"bench-{key}"
        variants.append(
            Variant(
                key,
                f"ours, {base_key} + {label or key}",
                venvs["ours"],
                False,
                env,
                index=len(variants),
                flush_s=float(env.get("OTEL_BSP_SCHEDULE_DELAY", 1000)) / 1e3,
                traceparent=base.traceparent,
            )
        )
    for v in variants:
        (scratch / "probe" / v.key).mkdir(parents=True)
        v.env["GYM_AUTOINSTR_BENCH_PROBE_DIR"] = str(scratch / "probe" / v.key)
    results: dict = {
        "mode": "quick" if a.quick else "full",
        "reps": reps,
        "seconds": seconds,
        "concurrency": a.concurrency,
        "gym": GYM_VERSION,
        "machine": machine(),
        "variants": [{"key": v.key, "label": v.label} for v in variants],
        "variant_env": {
            v.key: {
                k: val
                for k, val in v.env.items()
                if not k.startswith(("OTEL_EXPORTER", "GYM_AUTOINSTR_BENCH", "PYTHONPATH"))
            }
            for v in variants
        },
    }
    policy = PolicyModel().start()
    try:
        start_trios(variants, scratch, policy.url, 2)
        probed = {v.key: Probed(v, scratch / "probe" / v.key) for v in variants}
        body = rollout_body(variants[0].trio)
        log("warm-up")
        for v in variants:
            run_load(v.trio.run_url, body, 10**6, 8, tag=v.load_tag(PHASE_WARMUP), check=rewarded, duration=2.0)
        time.sleep(2.0)
        results["heap_start"] = {
            k: {
                n: {f: s["probe"].get(f) for f in ("tracked_objects", "modules", "otel_modules")}
                for n, s in p.snapshot(heavy=True)["servers"].items()
            }
            for k, p in probed.items()
        }
        idle_s = a.idle_seconds or (4.0 if a.quick else 8.0)
        log(f"idle baseline ({idle_s:g} s)")
        before = {k: p.snapshot() for k, p in probed.items()}
        time.sleep(idle_s)
        idle = {}
        for k, p in probed.items():
            after = p.snapshot()
            idle[k] = scaled(delta(before[k], after), 1.0 / (after["t"] - before[k]["t"]))
        results["idle_ms_per_s"] = {k: sum(r["process"] for r in d.values()) * 1e3 for k, d in idle.items()}
        results["idle_seconds"] = idle_s
        results["idle_buckets_ms_per_s"] = {
            k: {b: sum(r["buckets"][b] for r in d.values()) * 1e3 for b in BUCKETS} for k, d in idle.items()
        }
        runs_before = {v.key: sink.run_counts(v.run_id) for v in variants}

        windows: dict = {v.key: [] for v in variants}
        results["together"] = a.together
        for rep in range(reps):
            if a.together:
                together_window(rotated(variants, rep), probed, idle, sink, body, seconds, a.concurrency, windows)
                log(
                    f"window {rep + 1}/{reps} (together): ms/rollout "
                    + ", ".join(
                        f"{k}={sum(r['process'] for r in w[-1]['delta'].values()) * 1e3 / w[-1]['n']:.2f}"
                        for k, w in windows.items()
                    )
                )
                continue
            order = rotated(variants, rep)
            for v in order:
                p = probed[v.key]
                s0 = p.snapshot()
                result = run_load(
                    v.trio.run_url,
                    body,
                    10**6,
                    a.concurrency,
                    tag=v.load_tag(PHASE_WINDOW),
                    check=rewarded,
                    duration=seconds,
                )
                waited = settle(v, sink, PHASE_WINDOW)
                s1 = p.snapshot()
                if result.errors:
                    raise RuntimeError(
                        f"{v.label}: {result.errors}/{result.n} rollouts failed: "
                        f"{result.first_error}\n" + v.trio.log_tail(30)
                    )
                d = subtract_idle(delta(s0, s1), idle[v.key], waited)
                windows[v.key].append({"n": result.n, "seconds": result.seconds, "settle_s": waited, "delta": d})
            log(
                f"window {rep + 1}/{reps}: ms/rollout "
                + ", ".join(
                    f"{k}={sum(r['process'] for r in w[-1]['delta'].values()) * 1e3 / w[-1]['n']:.2f}"
                    for k, w in windows.items()
                )
            )
        results["windows"] = windows
        time.sleep(2.0)
        results["heap"] = {
            k: {
                n: {f: s["probe"].get(f) for f in ("tracked_objects", "modules", "otel_modules")}
                for n, s in p.snapshot(heavy=True)["servers"].items()
            }
            for k, p in probed.items()
        }

        results["spans"] = {}
        results["metrics"] = {}
        for v in variants:
            n = sum(w["n"] for w in windows[v.key])
            runs = sink.run_counts(v.run_id)
            if v.traceparent:
                total = sink.count(v.tag(PHASE_WINDOW))
                by_service = {s: c / n for s, c in sink.count_by_service(v.tag(PHASE_WINDOW)).items()}
            else:
                total = runs["spans"] - runs_before[v.key]["spans"]
                by_service = {}
            results["spans"][v.key] = {"per_rollout": total / n if n else 0.0, "by_service": by_service}
            results["metrics"][v.key] = (
                None
                if v.key in ("bare", "generic")
                else {
                    "metric_points": runs["metric_points"] - runs_before[v.key]["metric_points"],
                    "metric_names": runs["metric_names"],
                }
            )

        if a.py_spy:
            if spy is None:
                results["py_spy_note"] = "py-spy: not available (not installed and pip could not install it)"
            else:
                spy_dir = a.spy_dir or scratch / "py-spy"
                spy_dir.mkdir(parents=True, exist_ok=True)
                results["py_spy"] = {}
                for v in variants:
                    log(f"py-spy window: {v.label}")
                    results["py_spy"][v.key] = spy_window(
                        spy, probed[v.key], seconds, a.concurrency, body, a.spy_rate, spy_dir
                    )
    finally:
        tear_down(variants, policy, collector, sink, scratch)
    finish(results, t_start, report, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
