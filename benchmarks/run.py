"""gym-autoinstr overhead benchmarks on a real Gym trio (nemo-gym 0.4.0); see BENCHMARKS.md.

Run with ``./run-benchmarks [--quick]`` from the repository root.  Everything is measured
in this one run, side by side: the variants' trios are all up at once and every
repetition visits every variant (in a rotated order), so each ratio compares numbers
taken a few seconds apart on the same (shared, noisy) machine.  Ratios are computed per
repetition and reported as median [min-max].
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from benchmarks.load import run_load
from benchmarks.options import run_parser
from benchmarks.rundir import directory_bytes, disk_report, record_trio, spans_with_tags
from benchmarks.sink import CountingSink
from benchmarks.variants import (
    IN_FILES,
    INERT,
    ONLY_WHEN_NAMED,
    RUN_ID,
    SAMPLED_OUT,
    SPAN_GROUPS,
    STOCK,
    UNINSTRUMENTED,
    VARIANT_HELP,
    VARIANT_KEYS,
)
from tests.harness.collector import Collector
from tests.harness.gym_install import find_python, gym_venv, python_minor_for
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio, GymTrioError, PolicyModel

REPO = pathlib.Path(__file__).resolve().parents[1]
GYM_VERSION = "0.4.0"
GENERIC_STACK = [
    "opentelemetry-distro",
    "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-instrumentation-fastapi",
    "opentelemetry-instrumentation-aiohttp-client",
]
SERVERS = (RESOURCES, AGENT, MODEL)
PHASE_WARMUP, PHASE_C1, PHASE_CN, PHASE_BURST, PHASE_TOGETHER = 0, 1, 2, 3, 4


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def use_bench_venvs() -> None:
    """Build and find the benchmark's Gym venvs in our own cache (``.cache/bench-gymenvs``,
    or ``GYM_AUTOINSTR_BENCH_CACHE``): the test suite's venvs get rebuilt when someone
    runs the tests after a pyproject change, which would pull a venv from under a running
    trio."""
    os.environ.setdefault(
        "GYM_AUTOINSTR_TEST_CACHE", os.environ.get("GYM_AUTOINSTR_BENCH_CACHE", str(REPO / ".cache" / "bench-gymenvs"))
    )
    log("building / checking venvs (cached under .cache/bench-gymenvs)")


def printed_saved_report(a: argparse.Namespace, render: Any) -> bool:
    """With ``--report-from FILE``: print ``render`` of that file's results; whether it did."""
    if not a.report_from:
        return False
    print(render(json.loads(a.report_from.read_text())))
    return True


@dataclass
class Variant:
    key: str
    label: str
    venv: pathlib.Path
    instrument: bool
    env: dict
    index: int = 0
    trio: GymTrio | None = None
    startup: dict = field(default_factory=dict)  # server -> seconds from process start to port open
    trio_ready: float = 0.0
    samples: dict = field(default_factory=lambda: {"c1": [], "cn": []})
    # False: the load generator sends no traceparent, so the variant's own sampler
    # decides at the rollout's root (the agent's POST /run); its spans carry no tag.
    traceparent: bool = True
    # The exporter's schedule delay (s): after a window, CPU is read once the variant's
    # spans of that window have reached the sink, so the export of its tail is counted.
    flush_s: float = 0.0
    idle_cpu_per_s: float = 0.0  # server CPU (s) per second with no load, subtracted over the settle wait
    # Nothing configured for export (``files``): each trio writes into a run directory of its
    # own (``run_dir``, set when it starts); ``served`` counts the rollouts it completed, and
    # ``disk`` gets a record of the directory each time the trio stops (``rundir.record_trio``).
    files: bool = False
    run_dir: pathlib.Path | None = None
    served: int = 0
    disk: list = field(default_factory=list)

    def tag(self, phase: int) -> bytes:
        return bytes([0xB3, 0x4C, self.index, phase])

    def load_tag(self, phase: int) -> bytes | None:
        return self.tag(phase) if self.traceparent else None

    @property
    def run_id(self) -> str:
        return f"bench-{self.key}"


def make_variants(
    keys, venvs: dict, otlp: dict, extra_env: dict | None = None, instrument: bool = True
) -> list[Variant]:
    """The variants named by ``keys`` (bare first, always).  Every instrumented one
    exports spans and metrics over OTLP/HTTP to ``otlp``'s endpoint, as a user with
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` set gets them (metrics follow the spans' endpoint;
    ``OTEL_METRICS_EXPORTER`` is left unset).  ``extra_env`` goes to every variant, bare
    included; ``instrument=False`` starts the trios without ``opentelemetry-instrument``
    (the probe on ``PYTHONPATH`` runs OpenTelemetry's start-up instead)."""
    extra = dict(extra_env or {})

    def ours(key: str, label: str, env: dict, **kw) -> Variant:
        return Variant(
            key, label, venvs["ours"], instrument, {**otlp, RUN_ID: f"bench-{key}", **env, **extra}, flush_s=1.0, **kw
        )

    table = {
        "bare": lambda: Variant("bare", "bare", venvs["bare"], False, dict(extra)),
        # A second bare trio (an A/A): what two trios of the same code differ by over a
        # run, from whatever stays fixed in a trio for its life (its heap's layout, the
        # cores its servers settle on); each variant is one trio, started once per run.
        "bare2": lambda: Variant("bare2", "bare, a second trio (A/A)", venvs["bare"], False, dict(extra)),
        "generic": lambda: Variant("generic", "generic", venvs["generic"], instrument, {**otlp, **extra}, flush_s=5.0),
        # Everything of ours loaded and patched (OpenTelemetry's start-up, our modules, the
        # gated wrappers, the frozen start-up heap), but no SDK: no spans, no metrics.  What
        # the process's footprint costs before any per-request work, the floor under `off`.
        "inert": lambda: ours("inert", "ours, inert (no SDK)", INERT),
        "off": lambda: ours("off", "ours, off", {SPAN_GROUPS: "none"}),
        "default": lambda: ours("default", "ours, default", {SPAN_GROUPS: "default"}),
        # The README's first command: nothing set at all (no endpoint, no exporter, no run
        # id, no preset); start_trio names the run directory, so it is known.
        "files": lambda: Variant(
            "files",
            "ours, default, files (nothing configured)",
            venvs["ours"],
            instrument,
            dict(extra),
            flush_s=1.0,
            files=True,
        ),
        "stock": lambda: ours("stock", "ours, default, stock SDK path", STOCK),
        "sampled": lambda: ours(
            "sampled", "ours, default, sampled out", {SPAN_GROUPS: "default", **SAMPLED_OUT}, traceparent=False
        ),
        "per_rollout": lambda: ours("per_rollout", "ours, per_rollout", {SPAN_GROUPS: "per_rollout"}),
        "all": lambda: ours("all", "ours, all", {SPAN_GROUPS: "all"}),
    }
    unknown = [k for k in keys if k not in table]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANT_KEYS)}")
    picked = ["bare"] + [k for k in VARIANT_KEYS if k in keys and k != "bare"]
    variants = [table[k]() for k in picked]
    for i, v in enumerate(variants):
        v.index = i
    return variants


def _median(values):
    return statistics.median(values) if values else float("nan")


def _pct(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _spread(values, fmt="{:.3f}"):
    if not values:
        return "n/a"
    return f"{fmt.format(_median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


# ------------------------------------------------------------------ trios


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.1):
            return True
    except OSError:
        return False


def start_trio(variant: Variant, workdir: pathlib.Path, policy_url: str, attempts: int = 3) -> None:
    """Start the variant's trio; again on new ports when a port it was given was taken
    before its server bound it (other trios and other users start servers too)."""
    env = variant.env
    if variant.files:
        variant.run_dir = workdir / variant.key / "gym-autoinstr-run"
        env = {**env, "GYM_AUTOINSTR_OUTPUT_DIR": str(variant.run_dir)}
    variant.served = 0
    for attempt in range(1, attempts + 1):
        trio = GymTrio(
            variant.venv,
            GYM_VERSION,
            workdir / variant.key,
            policy_url=policy_url,
            instrument=variant.instrument,
            env=env,
        )
        ready_at: dict[str, float] = {}
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set() and len(ready_at) < len(SERVERS):
                for name in SERVERS:
                    if name not in ready_at and _port_open(trio.ports[name]):
                        ready_at[name] = time.time()
                stop.wait(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            trio.start(timeout=240)
            break
        except GymTrioError as error:
            if "address already in use" not in str(error) or attempt == attempts:
                raise
            log(f"{variant.label}: a port was taken before its server bound it; starting again on new ports")
        finally:
            stop.set()
            poller.join()
    variant.trio = trio
    variant.trio_ready = trio.startup_seconds
    procs = trio.server_processes()
    for name in SERVERS:
        if name in ready_at and name in procs:
            variant.startup[name] = ready_at[name] - procs[name].create_time()
    log(
        f"{variant.label}: trio ready in {trio.startup_seconds:.1f}s; servers to port-open "
        + ", ".join(f"{n.split('_')[-1]}={s:.2f}s" for n, s in variant.startup.items())
    )


def start_trios(variants: list[Variant], workdir: pathlib.Path, policy_url: str, parallel: int) -> None:
    """Every variant's trio, ``parallel`` starting at once."""
    log(f"starting {len(variants)} trios, {parallel} at a time")
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        for future in [pool.submit(start_trio, v, workdir, policy_url) for v in variants]:
            future.result()


def stop_trios(variants: list[Variant]) -> None:
    """Stop each trio; a trio that wrote a run directory gets it recorded once its
    processes have exited (its disk, the rollouts it completed, the spans it holds)."""
    for v in variants:
        if v.trio is not None:
            v.trio.stop()
            v.trio = None
            if v.run_dir is not None:
                v.disk.append(record_trio(v.run_dir, v.served, f"trio {len(v.disk) + 1}"))
                log(f"{v.label}: run directory {v.disk[-1]['bytes']:,} bytes for {v.served:,} rollouts")


def server_cpu(trio: GymTrio) -> float:
    total = 0.0
    for proc in trio.server_processes().values():
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def rollout_body(trio: GymTrio) -> bytes:
    return json.dumps(trio.default_row()).encode()


def rewarded(payload: bytes) -> bool:
    return b'"reward":1.0' in payload


def settle(variant: Variant, sink: CountingSink, phase: int, limit: float = 30.0) -> float:
    """After a window: wait until the variant's spans of that window have all reached the
    sink (none new for its exporter's schedule delay plus the collector's batching), so
    that the export of the window's tail is done before its CPU is read.  Returns the
    seconds waited.  Variants whose rollouts send no spans do not wait."""
    if not variant.flush_s or not variant.traceparent:
        return 0.0
    t0 = time.monotonic()
    quiet = variant.flush_s + 0.7
    tag = variant.tag(phase)
    if variant.run_dir is not None:  # nothing reaches the sink: until its run directory stops growing

        def progress() -> int:
            return directory_bytes(variant.run_dir)[0]
    else:

        def progress() -> int:
            return sink.count(tag)

    last, since = progress(), time.monotonic()
    while time.monotonic() - t0 < limit:
        time.sleep(0.1)
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return time.monotonic() - t0


def measure(
    variant: Variant, phase: int, seconds: float, concurrency: int, body: bytes, sink: CountingSink | None = None
) -> dict:
    """Rollouts started for ``seconds`` by ``concurrency`` closed-loop clients.  With a
    ``sink``, CPU is read after the window's spans were exported (``settle``), less the
    variant's idle CPU over that wait."""
    trio = variant.trio
    cpu0 = server_cpu(trio)
    result = run_load(
        trio.run_url, body, 10**6, concurrency, tag=variant.load_tag(phase), check=rewarded, duration=seconds
    )
    variant.served += result.n
    waited = settle(variant, sink, phase) if sink is not None else 0.0
    cpu1 = server_cpu(trio) - variant.idle_cpu_per_s * waited
    n = result.n
    if result.errors:
        raise RuntimeError(
            f"{variant.label}: {result.errors}/{n} rollouts failed: {result.first_error}\n" + trio.log_tail(30)
        )
    return {
        "n": n,
        "seconds": result.seconds,
        "rps": result.per_second,
        "cpu_ms": (cpu1 - cpu0) / n * 1e3,
        "latencies": result.latencies,
        "settle_s": waited,
    }


def measure_idle(variants: list[Variant], seconds: float = 4.0) -> None:
    """Each trio's server CPU per second with no load (all trios at once)."""
    before = {v.key: server_cpu(v.trio) for v in variants}
    time.sleep(seconds)
    for v in variants:
        v.idle_cpu_per_s = max(0.0, (server_cpu(v.trio) - before[v.key]) / seconds)


def rotated(items: list, turn: int) -> list:
    """``items`` starting at ``turn`` (modulo), wrapping round: the order of the ``turn``-th
    repetition or window, so that no variant always goes first."""
    turn %= len(items) or 1
    return items[turn:] + items[:turn]


def bracketed_windows(bare: Variant, order: list[Variant], window: Any) -> None:
    """One repetition's concurrency-n windows: bare before the first variant, between any
    two and after the last (``window(v)`` measures one).  Each variant's window is compared
    with the two bare windows around it, pooled (their CPU over their rollouts; their
    rollouts over their seconds): a reference taken within a window's length of the
    variant's own, on either side, so that the machine's drift between windows
    (several ms per rollout on a shared host) mostly cancels.  The variant's sample gets
    them as ``bare_cpu_ms`` and ``bare_rps``; bare's samples are every bare window."""
    before = window(bare)
    bare.samples["cn"].append(before)
    for v in order:
        sample = window(v)
        after = window(bare)
        bare.samples["cn"].append(after)
        n = before["n"] + after["n"]
        sample["bare_cpu_ms"] = (before["cpu_ms"] * before["n"] + after["cpu_ms"] * after["n"]) / n
        sample["bare_rps"] = n / (before["seconds"] + after["seconds"])
        v.samples["cn"].append(sample)
        before = after


def load_together(
    variants: list[Variant], sink: CountingSink, body: bytes, seconds: float, concurrency: int, phase: int
) -> tuple[dict, float]:
    """Every variant loaded at the same time for ``seconds`` (one closed-loop load
    generator per trio, on threads), then every trio's spans of the window settled at the
    sink.  Returns the loads by variant key and the seconds waited after them; raises if
    a rollout failed.  The load threads start, and the trios settle, in the order given:
    callers rotate it from one window to the next (``rotated``)."""
    with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
        futures = {
            v.key: pool.submit(
                run_load,
                v.trio.run_url,
                body,
                10**6,
                concurrency,
                tag=v.load_tag(phase),
                check=rewarded,
                duration=seconds,
            )
            for v in variants
        }
        loads = {k: f.result() for k, f in futures.items()}
    ended = time.monotonic()
    for v in variants:
        v.served += loads[v.key].n
    for v in variants:
        settle(v, sink, phase)
    waited = time.monotonic() - ended
    for v in variants:
        result = loads[v.key]
        if result.errors:
            raise RuntimeError(
                f"{v.label}: {result.errors}/{result.n} rollouts failed: {result.first_error}\n" + v.trio.log_tail(30)
            )
    return loads, waited


TOGETHER_KEYS = ("bare", "default", "sampled")


def sampled_together(
    variants: list[Variant],
    sink: CountingSink,
    body: bytes,
    windows: list[int],
    seconds: float,
    concurrency: int,
    trio_set: int = 0,
) -> dict:
    """The sampled-out target's own windows: bare, ours default and ours sampled out loaded
    at the same time, so that the machine's drift (several ms per rollout between the
    taking-turns windows, against a difference of about one) is the same for the three.
    ``windows`` are the windows' numbers in the run (they rotate the order the loads start
    in).  Per window and variant: rollouts and server CPU, read once the default's spans of
    the window reached the sink, less each trio's idle CPU over that wait, and the trio set."""
    picked = [v for v in variants if v.key in TOGETHER_KEYS]
    if len(picked) < len(TOGETHER_KEYS):
        return {}
    out: dict = {v.key: [] for v in picked}
    for i in windows:
        before = {v.key: server_cpu(v.trio) for v in picked}
        loads, waited = load_together(rotated(picked, i), sink, body, seconds, concurrency, PHASE_TOGETHER)
        for v in picked:
            result = loads[v.key]
            cpu = server_cpu(v.trio) - before[v.key] - v.idle_cpu_per_s * waited
            out[v.key].append(
                {"n": result.n, "cpu_ms": cpu / result.n * 1e3 if result.n else float("nan"), "set": trio_set}
            )
        log(f"together window {i + 1}: ms/rollout " + ", ".join(f"{k}={w[-1]['cpu_ms']:.2f}" for k, w in out.items()))
    return out


def together_overheads(together: dict) -> tuple[list[float], list[float]]:
    """Per together window, the CPU per rollout over bare's of ours default and of ours
    sampled out."""
    bare, default, sampled = ([w["cpu_ms"] for w in together[k]] for k in TOGETHER_KEYS)
    return [d - b for b, d in zip(bare, default)], [s - b for b, s in zip(bare, sampled)]


def together_ratios(together: dict) -> tuple[list[float], float | None]:
    """A sampled-out rollout's overhead over a traced one's: per window, and pooled (all
    CPU over all rollouts of the windows)."""
    if not together:
        return [], None
    traced, dropped = together_overheads(together)
    per_window = [s / d for d, s in zip(traced, dropped) if d > 0]
    bare, default, sampled = (together[k] for k in TOGETHER_KEYS)

    def pooled(rows):
        n = sum(r["n"] for r in rows)
        return sum(r["cpu_ms"] * r["n"] for r in rows) / n if n else float("nan")

    b, d, s = pooled(bare), pooled(default), pooled(sampled)
    return per_window, ((s - b) / (d - b) if d > b else None)


# ------------------------------------------------------------------ phases


def micro_benchmarks(ours_venv: pathlib.Path, quick: bool) -> dict:
    args = ["5", "10000"] if quick else ["9", "20000"]
    out = subprocess.run(
        [str(ours_venv / "bin" / "python"), "-m", "benchmarks.micro", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def import_startup(variants: list[Variant], reps: int) -> dict:
    """Wall time from exec to ``import app`` done, in a Gym server's exact environment
    (copied from the running resources server of each variant's trio): interpreter
    start, OpenTelemetry start-up (sitecustomize: distro, configurator, instrumentors)
    and the server module's imports with our post-import patches."""
    plans = []
    for variant in variants:
        proc = variant.trio.server_processes()[RESOURCES]
        env = proc.environ()
        env.pop("GYM_AUTOINSTR_TRIO_ID", None)  # not a member of the trio: never killed by its stop()
        plans.append((variant, str(variant.venv / "bin" / "python"), proc.cwd(), env))
    wall: dict[str, list[float]] = {v.key: [] for v in variants}
    cpu: dict[str, list[float]] = {v.key: [] for v in variants}
    code = "import time; import app; print(time.time())"
    for rep in range(reps):
        for variant, exe, cwd, env in plans[rep % len(plans) :] + plans[: rep % len(plans)]:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            out = subprocess.run([exe, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if out.returncode != 0:
                raise RuntimeError(f"import app failed for {variant.label}:\n{out.stderr[-2000:]}")
            wall[variant.key].append(float(out.stdout.strip().splitlines()[-1]) - t0)
            # the whole child (all threads, its exit included): what start-up costs the machine
            cpu[variant.key].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return wall, cpu


def wait_settled(sink: CountingSink, quiet: float = 3.0, limit: float = 30.0) -> None:
    """Until no span has arrived for ``quiet`` seconds (exporters batch for 1 s, 5 s for the
    generic stack, the collector 200 ms)."""
    deadline = time.monotonic() + limit
    last, since = sink.snapshot(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sink.snapshot()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def read_probe(directory: pathlib.Path, server: str) -> dict:
    total: dict = {}
    for path in directory.glob(f"{server}-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key in ("ended", "exported", "export_failed", "dropped", "queued"):
            total[key] = total.get(key, 0) + data.get(key, 0)
    return total


def burst(trio: GymTrio, n: int, concurrency: int, tag: bytes) -> dict:
    proc = trio.server_processes()[RESOURCES]
    url = f"http://127.0.0.1:{trio.ports[RESOURCES]}/seed_session"
    rss0 = proc.memory_info().rss
    result = run_load(url, b"{}", n, concurrency, tag=tag)
    time.sleep(2.0)
    rss1 = proc.memory_info().rss
    return {
        "n": n,
        "rps": result.per_second,
        "errors": result.errors,
        "first_error": result.first_error,
        "rss_before_mb": rss0 / 2**20,
        "rss_after_mb": rss1 / 2**20,
        "p99_ms": _pct(result.latencies, 99) * 1e3,
    }


# ------------------------------------------------------------------ report


def machine() -> dict:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    py = find_python(python_minor_for(GYM_VERSION))
    gym_python = subprocess.run(
        [py, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": model or platform.processor(),
        "python_gym": gym_python,
        "python_runner": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }


def bare_reference(row: dict, bare: dict) -> list[float]:
    """Bare's CPU per rollout to compare a variant's windows with: the bare windows around
    each (``bare_cpu_ms``), or, in results saved before those existed, the repetition's
    one bare window."""
    return list(row.get("bare_cpu_ms") or bare["cpu_ms"])


def capacity_ratios(row: dict, bare: dict) -> list[float]:
    """Bare's CPU per rollout over the variant's, per window."""
    return [b / c for b, c in zip(bare_reference(row, bare), row["cpu_ms"]) if c > 0]


def _verdict(values, target: float, at_least: bool) -> tuple[str, str]:
    if not values:
        return "not measured", "-"
    value = _median(values)
    ok = value >= target if at_least else value <= target
    return _spread(values), "**pass**" if ok else "**fail**"


def ratio_interval(
    num: list[float], den: list[float], level: float = 0.90, draws: int = 2000, groups: list | None = None
) -> tuple[float, float, float] | None:
    """``sum(num) / sum(den)`` over paired samples (repetitions or windows), and a
    bootstrap interval for it: the pairs resampled with replacement ``draws`` times, the
    ratio's central ``level`` of them.  With ``groups`` (a label per pair: the trio set it
    was measured in) naming two or more, the resampling has two levels: the sets are drawn
    with replacement, then the pairs within each drawn set, so that what stays fixed in a
    set of trios for its life counts in the interval.  A fixed seed, so a saved run reports
    the same interval.  None for fewer than three pairs or a denominator that is not
    positive."""
    pairs = list(zip(num, den))
    if len(pairs) < 3 or sum(d for _, d in pairs) <= 0:
        return None
    clusters: dict = {}
    for label, pair in zip(groups if groups and len(groups) == len(pairs) else [0] * len(pairs), pairs):
        clusters.setdefault(label, []).append(pair)
    sets = list(clusters.values()) if len(clusters) > 1 else [pairs]
    rng = random.Random(13)
    ratios = []
    for _ in range(draws):
        drawn = [sets[rng.randrange(len(sets))] for _ in sets] if len(sets) > 1 else sets
        picked = [c[rng.randrange(len(c))] for c in drawn for _ in c]
        total = sum(d for _, d in picked)
        ratios.append(sum(n for n, _ in picked) / total if total > 0 else float("inf"))
    ratios.sort()
    tail = (1 - level) / 2
    return (
        sum(n for n, _ in pairs) / sum(d for _, d in pairs),
        ratios[int(tail * draws)],
        ratios[min(draws - 1, int((1 - tail) * draws))],
    )


def per_set(num: list[float], den: list[float], groups: list | None) -> list[float]:
    """``sum(num) / sum(den)`` within each trio set, in the sets' order; [] for one set."""
    if not groups or len(set(groups)) < 2 or len(groups) != len(num):
        return []
    out = []
    for label in sorted(set(groups)):
        n = sum(x for x, g in zip(num, groups) if g == label)
        d = sum(x for x, g in zip(den, groups) if g == label)
        if d > 0:
            out.append(n / d)
    return out


def budget_table(results: dict) -> list[str]:
    """Issue 13's targets, each with its measured value (median [min-max] of repetitions)
    and the ratio of the means with its bootstrap interval."""
    rows = {r["key"]: r for r in results["variants"]}
    bare = results["variants"][0]

    def capacity(key):
        return capacity_ratios(rows[key], bare) if key in rows else []

    def capacity_pairs(key):
        r = rows.get(key)
        return ([], [], []) if r is None else (bare_reference(r, bare), r["cpu_ms"], r.get("set"))

    def overhead_pairs(key, over):
        a, b = rows.get(key), rows.get(over)
        return ([], [], []) if a is None or b is None else (a["cpu_overhead_ms"], b["cpu_overhead_ms"], a.get("set"))

    generic = (results.get("cpu_overhead_vs_generic") or {}).get("default", [])
    together_data = results.get("sampled_together") or {}
    together = together_ratios(together_data)[0]
    if together:
        traced, dropped = together_overheads(together_data)
        sampled_pairs = (dropped, traced, [w.get("set", 0) for w in together_data["bare"]])
    else:
        sampled_pairs = overhead_pairs("sampled", "default")
    checks = [
        (
            "default preset: CPU capacity ratio to bare",
            ">= 0.90",
            capacity("default"),
            0.90,
            True,
            capacity_pairs("default"),
        ),
        (
            "default preset: CPU overhead per rollout relative to the generic stack's",
            "<= 0.25",
            generic,
            0.25,
            False,
            overhead_pairs("default", "generic"),
        ),
        ("all groups off: CPU capacity ratio to bare", ">= 0.99", capacity("off"), 0.99, True, capacity_pairs("off")),
        (
            "a sampled-out rollout's CPU overhead relative to a traced one's"
            + (" (loaded together, per window)" if together else ""),
            "<= 0.20",
            together or results.get("sampled_over_traced", []),
            0.20,
            False,
            sampled_pairs,
        ),
    ]
    n_sets = results.get("trio_sets", 1)
    out = [
        "Budget (issue 13; median [min-max] over repetitions, the verdict's figure; beside it the ratio of "
        "the means over the repetitions or windows, with a 90% bootstrap interval: where the interval holds "
        "the goal, this run cannot tell which side of it the cost is on; "
        + (
            f"every trio was started afresh for each of the run's {n_sets} sets, and the interval resamples "
            "the sets and the windows within them, so it holds what stays fixed in a trio for its life; "
            "the last column is the ratio of means within each set):"
            if n_sets > 1
            else "the interval is this run's noise alone, not the drift between runs):"
        ),
        "",
        "| target | goal | measured | verdict | ratio of means [90% interval] |"
        + (" per trio set |" if n_sets > 1 else ""),
        "|---|---|---|---|---|" + ("---|" if n_sets > 1 else ""),
    ]
    for name, goal, values, target, at_least, (num, den, groups) in checks:
        measured, verdict = _verdict(values, target, at_least)
        pooled = ratio_interval(num, den, groups=groups)
        beside = "-" if pooled is None else f"{pooled[0]:.3f} [{pooled[1]:.3f}-{pooled[2]:.3f}]"
        sets = (" " + (", ".join(f"{x:.3f}" for x in per_set(num, den, groups)) or "-") + " |") if n_sets > 1 else ""
        out.append(f"| {name} | {goal} | {measured} | {verdict} | {beside} |{sets}")
    d = rows.get("default")
    if d:
        c = results["concurrency"]
        out.append(
            f"| default preset: rollouts/s ratio to bare, c=1 / c={c} (beside the CPU ratio) | - | "
            f"{_spread(d['ratio_c1'])} / {_spread(d['ratio_cn'])} | - | - |" + (" - |" if n_sets > 1 else "")
        )
        points = d.get("metric_points")
        out.append(
            f"| default preset: metrics on, exported over OTLP to the collector | yes | "
            f"{'yes' if points else 'no'} ({points} data points) | "
            f"{'**pass**' if points else '**fail**'} | - |" + (" - |" if n_sets > 1 else "")
        )
    out.append("")
    return out


def tear_down(variants: list, policy: Any, collector: Any, sink: Any, scratch: pathlib.Path) -> None:
    """Stop every trio, the policy model, the collector and the sink; remove the scratch dir."""
    stop_trios(variants)
    policy.stop()
    collector.stop()
    sink.close()
    shutil.rmtree(scratch, ignore_errors=True)


def finish(results: dict, t_start: float, render: Any, json_path: pathlib.Path | None) -> None:
    """Print the report and the run time; keep the raw results when asked."""
    results["elapsed_s"] = time.monotonic() - t_start
    print(render(results))
    print(f"(total {results['elapsed_s'] / 60:.1f} min)")
    if json_path:
        json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def report(results: dict) -> str:
    variants = results["variants"]
    bare = variants[0]
    lines = []
    m = results["machine"]
    lines.append(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gb']} GB; Gym on Python {m['python_gym']}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in m['load_avg_at_start'])}"
    )
    lines.append(
        f"mode: {results['mode']}; {results['reps']} repetitions, each: {results['t1']:g} s of rollouts at "
        f"concurrency 1 and {results['tn']:g} s at concurrency {results['concurrency']} per variant, "
        f"variants interleaved ({results['rollouts']} rollouts in all); ratios per repetition, "
        "median [min-max]"
        + (
            "; each variant's concurrency-n window between two of bare's, its reference"
            if any(v.get("bare_cpu_ms") for v in variants[1:])
            else ""
        )
        + (
            f"; every trio stopped and started afresh between the run's {results['trio_sets']} sets of repetitions"
            if results.get("trio_sets", 1) > 1
            else ""
        )
    )
    lines.append("")
    lines.append(
        f"| variant | rollouts/s c=1 | ratio to bare c=1 | rollouts/s c={results['concurrency']} | "
        f"ratio to bare c={results['concurrency']} | server CPU ms/rollout | CPU overhead ms/rollout | "
        "CPU capacity ratio | p50 / p99 ms (c=1) | spans/rollout |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for v in variants:
        capacity = capacity_ratios(v, bare)
        lines.append(
            f"| {v['label']} | {_median(v['rps_c1']):.1f} | {_spread(v['ratio_c1'])} | {_median(v['rps_cn']):.1f} | "
            f"{_spread(v['ratio_cn'])} | {_median(v['cpu_ms']):.2f} | "
            f"{'-' if v is bare else _spread(v['cpu_overhead_ms'], '{:.2f}')} | "
            f"{'-' if v is bare else _spread(capacity)} | "
            f"{v['p50_ms']:.1f} / {v['p99_ms']:.1f} | {v['spans_per_rollout']:.1f} |"
        )
    lines.append("")
    lines.append(
        "CPU capacity ratio: bare's server CPU per rollout over the variant's, per repetition (bare's "
        "from the bare windows just before and after the variant's, where taken; the rollouts/s ratio a "
        "CPU-bound machine converges to; steadier than rollouts/s on a shared host)."
    )
    lines.append("")
    twin = next((v for v in variants if v["key"] == "bare2"), None)
    if twin is not None:
        interval = ratio_interval(bare_reference(twin, bare), twin["cpu_ms"], groups=twin.get("set"))
        lines.append(
            "A/A, a second bare trio against bare: CPU capacity ratio "
            f"{_spread(capacity_ratios(twin, bare))}"
            + (f", ratio of means {interval[0]:.3f} [{interval[1]:.3f}-{interval[2]:.3f}]" if interval else "")
            + ". The same code in two trios: how far apart two trios read over a run; "
            + (
                "the trios were started afresh for each of the run's "
                f"{results.get('trio_sets')} sets, and the interval resamples the sets, so it holds this."
                if results.get("trio_sets", 1) > 1
                else "the 90% intervals of the budget below hold the noise of the repetitions, not this."
            )
        )
        lines.append("")
    inert = next((v for v in variants if v["key"] == "inert"), None)
    if inert is not None:
        beyond = {
            v["key"]: [a - b for a, b in zip(v["cpu_overhead_ms"], inert["cpu_overhead_ms"])]
            for v in variants
            if v["key"] not in (*UNINSTRUMENTED, "generic")
        }
        lines.append(
            f"Inert ({VARIANT_HELP['inert']}, before any per-request work): CPU "
            f"overhead {_spread(inert['cpu_overhead_ms'], '{:.2f}')} ms per rollout; each variant's overhead "
            "beyond it, per repetition: " + ", ".join(f"{k} {_spread(d, '{:.2f}')} ms" for k, d in beyond.items())
        )
        lines.append("")
    g = results.get("cpu_overhead_vs_generic")
    if g:
        lines.append(
            "CPU overhead per rollout relative to the generic stack's (same repetition): "
            + ", ".join(f"{k} {_spread(vals)}" for k, vals in g.items())
        )
        lines.append("")
    if results.get("sampled_over_traced"):
        lines.append(
            "A sampled-out rollout's CPU overhead relative to a traced one's (ours default, "
            "`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, ratio 0, over ours default, same repetition): "
            + _spread(results["sampled_over_traced"])
        )
        lines.append("")
    together = results.get("sampled_together")
    if together:
        per_window, pooled = together_ratios(together)
        w = results.get("together_window", {})
        lines.append(
            f"The same, with bare, ours default and ours sampled out loaded at the same time "
            f"({len(together['bare'])} windows of {w.get('seconds', 0):g} s, concurrency "
            f"{w.get('concurrency', 0)} each; the budget's figure): overhead ms per rollout, median "
            f"[min-max] of windows, default "
            + _spread(together_overheads(together)[0], "{:.2f}")
            + ", sampled out "
            + _spread(together_overheads(together)[1], "{:.2f}")
            + f"; sampled out over traced {_spread(per_window)} per window"
            + (f", {pooled:.3f} pooled" if pooled is not None else "")
        )
        lines.append("")
    metric_rows = [v for v in variants if v.get("metric_points") is not None]
    if metric_rows:
        lines.append(
            "Metrics exported over OTLP to the collector during the run (data points received, distinct "
            "metric names), by the trio's run id: "
            + ", ".join(f"{v['key']} {v['metric_points']} ({v['metric_names']})" for v in metric_rows)
        )
        lines.append("")
    lines.extend(disk_report(variants))
    lines.extend(budget_table(results))
    micro = results.get("micro")
    if micro:
        lines.append(
            f"Micro-benchmarks (ns per call, CPU time, best of {micro['reps']}; in brackets the median "
            "per-repetition difference to unwrapped):"
        )
        lines.append("")
        lines.append("| site | unwrapped | group off | group on | group off, metrics on | group on, metrics on |")
        lines.append("|---|---|---|---|---|---|")
        names = {
            "request": "egress: wrapped `request`",
            "handler": "route seam: wrapped handler",
            "ingress": "ingress: ASGI middleware",
            "semaphore": "Gym semaphore: free acquire + release",
            "job_rollout": "run_examples job: one rollout awaitable",
        }
        for site, row in micro["sites"].items():
            cells = [f"{row['unwrapped']['ns_min']:.0f}"]
            for variant in ("off", "on", "off+metrics", "on+metrics"):
                r = row.get(variant)
                if r is None:
                    cells.append("–")
                    continue
                cells.append(f"{r['ns_min']:.0f} (+{r['delta_ns_best']:.0f}) [+{r['delta_ns_median']:.0f}]")
            lines.append(f"| {names.get(site, site)} | " + " | ".join(cells) + " |")
        lines.append("")
    st = results.get("startup")
    if st:
        lines.append("Start-up (seconds; median [min-max]):")
        lines.append("")
        lines.append(
            "| variant | `import app` in a server's environment: wall | same: CPU | "
            "server process start to port open (wall) | `gym env start` to all ready (wall) |"
        )
        lines.append("|---|---|---|---|---|")
        for v in variants:
            imp = st["import"].get(v["key"])
            imp_cpu = st.get("import_cpu", {}).get(v["key"])
            lines.append(
                f"| {v['label']} | {_spread(imp, '{:.2f}') if imp else '-'} | "
                f"{_spread(imp_cpu, '{:.2f}') if imp_cpu else '-'} | "
                f"{_spread(v['startup'], '{:.2f}')} | {v['trio_ready']:.1f} |"
            )
        if "import_overhead_ms" in st:
            lines.append("")
            lines.append(
                "Start-up overhead per server process (`import app`, ours default minus bare, paired per "
                f"repetition): CPU {_spread(st['import_cpu_overhead_ms'], '{:.0f}')} ms, "
                f"wall {_spread(st['import_overhead_ms'], '{:.0f}')} ms"
            )
        lines.append("")
    b = results.get("burst")
    if b:
        lines.append(
            f"Burst: {b['n']} POST /seed_session at concurrency {b['concurrency']} against the resources "
            "server, twice per variant (interleaved):"
        )
        lines.append("")
        lines.append(
            "| variant | burst | req/s | errors | RSS before MB | RSS after MB | spans ended (SDK) | "
            "exported (SDK) | dropped (SDK) | received by collector |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for row in b["rows"]:
            probe = row.get("probe") or {}
            lines.append(
                f"| {row['label']} | {row['round']} | {row['rps']:.0f} | {row['errors']} | "
                f"{row['rss_before_mb']:.1f} | {row['rss_after_mb']:.1f} | {probe.get('ended', '-')} | "
                f"{probe.get('exported', '-')} | {probe.get('dropped', '-')} | {row.get('received', '-')} |"
            )
        lines.append("")
    return "\n".join(lines)


def _pooled(num: list[float], den: list[float], runs: list[str]) -> str:
    got = ratio_interval(num, den, groups=runs)
    return "n/a" if got is None else f"{got[0]:.3f} [{got[1]:.3f}-{got[2]:.3f}]"


def _run_rows(results: Any) -> tuple[dict, str]:
    """A saved run's variants by key, or ({}, why it cannot be read as a long run)."""
    variants = results.get("variants") if isinstance(results, dict) else None
    rows = (
        {r["key"]: r for r in variants if isinstance(r, dict) and "key" in r and "cpu_ms" in r}
        if isinstance(variants, list)
        else {}
    )
    if not rows:
        return {}, "not the --json of a run of ./run-benchmarks"
    missing = [k for k in ("bare", "off", "default", "sampled") if k not in rows]
    return ({}, f"no {', '.join(missing)}") if missing else (rows, "")


def across_report(runs: list[tuple[str, dict]]) -> str:
    """Several saved long runs (``--json``) read as one: per run and pooled, each variant's
    CPU over bare per rollout (mean of repetitions) and the parts of a dropped rollout's
    overhead as fractions of a traced one's: what span groups off (the same metrics, no
    dropped path) costs, what the dropped path costs beyond it, and the two together (the
    issue 13 target); then every variant's capacity against bare.  Pooled: the ratio of
    sums over every repetition (or together window) of every run, with a bootstrap interval
    that draws runs first, then repetitions within them."""
    lines = [
        "CPU over bare per rollout, mean of repetitions, ms; and as fractions of the traced "
        "(default) rollout's overhead",
        "",
        "| run | repetitions | off | default | sampled out | off / default | (sampled - off) / default "
        "| sampled / default |",
        "|---|---|---|---|---|---|---|---|",
    ]
    read: list[tuple[str, dict, dict]] = []  # (run, its variants by key, its results)
    pairs = []  # (run, off, default, sampled): overheads over bare, one per repetition
    for name, results in runs:
        rows, why = _run_rows(results)
        if not rows:
            lines.append(f"| {name} | - | ({why}: left out) | | | | | |")
            continue
        read.append((name, rows, results))
        over = [
            [c - b for c, b in zip(rows[k]["cpu_ms"], bare_reference(rows[k], rows["bare"]))]
            for k in ("off", "default", "sampled")
        ]
        pairs += [(name, o, d, s) for o, d, s in zip(*over)]
        o, d, s = (statistics.fmean(v) for v in over)
        frac = (lambda x: f"{x / d:.3f}") if d > 0 else (lambda x: "n/a")
        lines.append(
            f"| {name} | {len(over[1])} | {o:+.2f} | {d:+.2f} | {s:+.2f} | {frac(o)} | {frac(s - o)} | {frac(s)} |"
        )
    if not read:
        return "\n".join(lines)
    runs_of, den = [p[0] for p in pairs], [p[2] for p in pairs]
    lines += [
        "",
        f"Pooled over {len(read)} run(s) ({len(pairs)} repetitions): ratio of sums [90% interval, runs drawn first]",
        "",
        "- span groups off over traced: " + _pooled([p[1] for p in pairs], den, runs_of),
        "- the dropped path (sampled out - off) over traced: " + _pooled([p[3] - p[1] for p in pairs], den, runs_of),
        "- a sampled-out rollout over a traced one (target <= 0.20): " + _pooled([p[3] for p in pairs], den, runs_of),
    ]
    # the target's own measure: the windows with bare, default and sampled out loaded together
    windows = []  # (run, dropped, traced) per window
    for name, _, results in read:
        together = results.get("sampled_together") or {}
        if isinstance(together, dict) and together.get("bare"):
            traced, dropped = together_overheads(together)
            windows += [(name, s, t) for s, t in zip(dropped, traced)]
    if windows:
        lines.append(
            f"- the same, loaded together ({len(windows)} windows of {len({w[0] for w in windows})} run(s)): "
            + _pooled([w[1] for w in windows], [w[2] for w in windows], [w[0] for w in windows])
        )
    # every variant's capacity (bare's CPU per rollout over the variant's), pooled the same way
    capacity: dict = {}  # key -> (run, bare reference, cpu) per repetition
    for name, rows, _ in read:
        for key, row in rows.items():
            if key != "bare":
                capacity.setdefault(key, []).extend(
                    (name, b, c) for b, c in zip(bare_reference(row, rows["bare"]), row["cpu_ms"])
                )
    lines += [
        "",
        "Capacity vs bare (bare's CPU per rollout over the variant's), ratio of sums [90% interval, runs drawn first]:",
        "",
    ]
    lines += [
        f"- {key} ({len({r[0] for r in got})} run(s), {len(got)} repetitions): "
        + _pooled([r[1] for r in got], [r[2] for r in got], [r[0] for r in got])
        for key, got in capacity.items()
    ]
    return "\n".join(lines)


def _saved_runs(paths: list[pathlib.Path]) -> list[tuple[str, dict]]:
    """``--across``'s files, each named by its stem (by its path when two stems are alike);
    a file that cannot be read stops the command with its name and why."""
    stems = [p.stem for p in paths]
    out = []
    for path, stem in zip(paths, stems):
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(
                f"--across: cannot read {path} ({error}); give files that ./run-benchmarks --json wrote"
            ) from None
        out.append((stem if stems.count(stem) == 1 else str(path), results))
    return out


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    a = run_parser().parse_args(argv)
    if a.across:
        print(across_report(_saved_runs(a.across)))
        return 0
    if printed_saved_report(a, report):
        return 0
    quick = a.quick
    reps = a.reps or (3 if quick else 6)
    t1, tn = (2.0, 4.0) if quick else (3.0, 5.0)
    conc = a.concurrency
    t_start = time.monotonic()

    use_bench_venvs()
    bare_venv = gym_venv(GYM_VERSION, with_project=False)
    generic_venv = gym_venv(GYM_VERSION, with_project=False, extra=GENERIC_STACK)
    ours_venv = gym_venv(GYM_VERSION)
    results: dict = {
        "mode": "quick" if quick else "full",
        "reps": reps,
        "t1": t1,
        "tn": tn,
        "concurrency": conc,
        "machine": machine(),
        "gym": GYM_VERSION,
    }

    if "micro" not in a.skip:
        log("micro-benchmarks")
        results["micro"] = micro_benchmarks(ours_venv, quick)

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-bench-"))
    sink = CountingSink()
    collector = Collector(log_dir=scratch / "collector", sink=sink, batch_timeout="200ms")
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    keys = (
        [k.strip() for k in a.variants.split(",")]
        if a.variants
        else [k for k in VARIANT_KEYS if k not in ONLY_WHEN_NAMED]
    )
    variants = make_variants(keys, {"bare": bare_venv, "generic": generic_venv, "ours": ours_venv}, otlp)
    results["variant_env"] = {
        v.key: {k: val for k, val in v.env.items() if not k.startswith("OTEL_EXPORTER")} for v in variants
    }
    policy = PolicyModel().start()
    try:
        n_sets = max(1, min(a.trio_sets, reps))
        results["trio_sets"] = n_sets
        n_windows, seconds = (4, 5.0) if quick else (8, 8.0)
        n_windows = 0 if "together" in a.skip else (a.together_windows or n_windows)
        if n_windows:
            results["together_window"] = {"seconds": seconds, "concurrency": max(1, conc // 2)}
            together: dict = {}
        bare, others = variants[0], variants[1:]
        by_run_before: dict = {}
        body = b""
        for trio_set in range(n_sets):
            if trio_set:
                log(f"trio set {trio_set + 1}/{n_sets}: stopping every trio and starting it afresh")
                stop_trios(variants)
            start_trios(variants, scratch / f"set{trio_set}", policy.url, a.parallel_starts)
            body = body or rollout_body(variants[0].trio)
            # Warm-up at the windows' own concurrency: a trio's first load at 64 grows its
            # connection pools, tasks and heap, which would otherwise fall on each variant's
            # first window (bare's too, but bare has one window per variant, so it is spread
            # over them): in a run of six trio sets of four repetitions, each set's first
            # repetition read 0.07-0.8 ms per rollout dearer than its others, every variant.
            log("warm-up")
            for v in variants:
                v.served += run_load(
                    v.trio.run_url, body, 10**6, conc, tag=v.load_tag(PHASE_WARMUP), check=rewarded, duration=2.0
                ).n
            wait_settled(sink, quiet=max(v.flush_s for v in variants) + 1.0)  # idle read without export
            for v in variants:
                if v.files:  # its spans never reach the sink: until its run directory stops growing
                    settle(v, sink, PHASE_WARMUP)
            measure_idle(variants)
            log("idle server CPU ms/s: " + ", ".join(f"{v.key}={v.idle_cpu_per_s * 1e3:.1f}" for v in variants))
            if not trio_set:
                by_run_before = {v.key: sink.run_counts(v.run_id) for v in variants}
            for rep in [r for r in range(reps) if r * n_sets // reps == trio_set]:
                order = rotated(variants, rep)
                for v in order:
                    v.samples["c1"].append({**measure(v, PHASE_C1, t1, 1, body), "set": trio_set})
                bracketed_windows(
                    bare,
                    list(reversed(rotated(others, rep))),
                    lambda v: {**measure(v, PHASE_CN, tn, conc, body, sink), "set": trio_set},
                )
                log(
                    f"repetition {rep + 1}/{reps}: c={conc} rollouts/s "
                    + ", ".join(f"{v.key}={v.samples['cn'][-1]['rps']:.0f}" for v in variants)
                )
            windows = [i for i in range(n_windows) if i * n_sets // n_windows == trio_set]
            if windows:
                log(
                    f"sampled out, loaded together with bare and the default: {len(windows)} of {n_windows} "
                    f"windows of {seconds:g} s"
                )
                for key, rows in sampled_together(
                    variants, sink, body, windows, seconds, max(1, conc // 2), trio_set
                ).items():
                    together.setdefault(key, []).extend(rows)
        wait_settled(sink)
        stop_trios([v for v in variants if v.files])  # its run directory is read once its processes exited

        rows = []
        for v in variants:
            rollouts = sum(s["n"] for s in v.samples["c1"] + v.samples["cn"])
            by_run = sink.run_counts(v.run_id)
            at_sink = v.key not in (*UNINSTRUMENTED, *IN_FILES, "generic")
            if v.files:  # counted in its run directories, by the same tags
                spans = spans_with_tags(v.disk, [v.tag(PHASE_C1), v.tag(PHASE_CN)])
            elif v.traceparent:
                spans = sink.count(v.tag(PHASE_C1)) + sink.count(v.tag(PHASE_CN))
            else:  # untagged: every span of its run id since the warm-up
                spans = by_run["spans"] - by_run_before[v.key]["spans"]
            lat = [x for s in v.samples["c1"] for x in s["latencies"]]
            rows.append(
                {
                    "key": v.key,
                    "label": v.label,
                    "rps_c1": [s["rps"] for s in v.samples["c1"]],
                    "rps_cn": [s["rps"] for s in v.samples["cn"]],
                    "ratio_c1": [s["rps"] / b["rps"] for s, b in zip(v.samples["c1"], bare.samples["c1"])],
                    "ratio_cn": [s["rps"] / s.get("bare_rps", s["rps"]) for s in v.samples["cn"]],
                    "cpu_ms": [s["cpu_ms"] for s in v.samples["cn"]],
                    "set": [s.get("set", 0) for s in v.samples["cn"]],
                    "bare_cpu_ms": [s.get("bare_cpu_ms", s["cpu_ms"]) for s in v.samples["cn"]],
                    "cpu_overhead_ms": [s["cpu_ms"] - s.get("bare_cpu_ms", s["cpu_ms"]) for s in v.samples["cn"]],
                    "p50_ms": _pct(lat, 50) * 1e3,
                    "p99_ms": _pct(lat, 99) * 1e3,
                    "p50_cn_ms": _pct([x for s in v.samples["cn"] for x in s["latencies"]], 50) * 1e3,
                    "spans_per_rollout": spans / rollouts if rollouts else 0.0,
                    "startup": list(v.startup.values()),
                    "trio_ready": v.trio_ready,
                    "idle_cpu_ms_per_s": v.idle_cpu_per_s * 1e3,
                    "settle_s": [s.get("settle_s", 0.0) for s in v.samples["cn"]],
                    "metric_points": by_run["metric_points"] if at_sink else None,
                    "metric_names": len(by_run["metric_names"]) if at_sink else None,
                    "disk": v.disk,
                }
            )
        results["variants"] = rows
        results["rollouts"] = sum(s["n"] for v in variants for s in v.samples["c1"] + v.samples["cn"])
        generic = next((r for r in rows if r["key"] == "generic"), None)
        if generic is not None:
            results["cpu_overhead_vs_generic"] = {
                r["key"]: [o / g for o, g in zip(r["cpu_overhead_ms"], generic["cpu_overhead_ms"]) if g > 0]
                for r in rows
                if r["key"] in ("off", "default", "files", "stock", "sampled", "per_rollout", "all")
            }
        default = next((r for r in rows if r["key"] == "default"), None)
        sampled = next((r for r in rows if r["key"] == "sampled"), None)
        if default is not None and sampled is not None:
            # what a dropped rollout costs over bare, relative to a traced one (same repetition)
            results["sampled_over_traced"] = [
                o / t for o, t in zip(sampled["cpu_overhead_ms"], default["cpu_overhead_ms"]) if t > 0
            ]

        if n_windows:
            results["sampled_together"] = together

        if "startup" not in a.skip and any(v.key == "default" for v in variants):
            log("start-up: import app in each variant's server environment")
            picked = [v for v in variants if v.key in ("bare", "generic", "default")]
            try:
                imp, imp_cpu = import_startup(picked, 4 if quick else 8)
                results["startup"] = {
                    "import": imp,
                    "import_cpu": imp_cpu,
                    "import_overhead_ms": [(o - b) * 1e3 for o, b in zip(imp["default"], imp["bare"])],
                    "import_cpu_overhead_ms": [(o - b) * 1e3 for o, b in zip(imp_cpu["default"], imp_cpu["bare"])],
                }
            except Exception as error:
                log(f"start-up measurement failed: {error}")
                results["startup"] = {"import": {}, "error": str(error)}

        if "burst" not in a.skip:
            try:
                run_bursts(a, results, variants, scratch, otlp, ours_venv, policy, sink)
            except Exception as error:
                log(f"burst failed: {error}")
                results["burst_error"] = str(error)
    finally:
        tear_down(variants, policy, collector, sink, scratch)
    finish(results, t_start, report, a.json)
    return 0


def run_bursts(a, results, variants, scratch, otlp, ours_venv, policy, sink) -> None:
    """Two bursts each against the resources server of the bare trio and of a trio with our
    defaults plus the SDK counters of benchmarks/probe (the other trios are stopped first)."""
    bare = variants[0]
    for v in variants[1:]:
        if v.trio is not None:
            log(f"stopping trio: {v.label}")
            stop_trios([v])
    probe_dir = scratch / "probe"
    probe_dir.mkdir()
    probe_env = {
        **otlp,
        "PYTHONPATH": str(REPO / "benchmarks" / "probe"),
        "GYM_AUTOINSTR_BENCH_PROBE_DIR": str(probe_dir),
    }
    probe = Variant("probe", "ours, default (SDK counters)", ours_venv, False, probe_env, index=len(variants))
    log("starting trio: ours default with SDK counters (burst)")
    start_trio(probe, scratch, policy.url)
    variants.append(probe)  # stopped with the others if anything fails
    burst_rows = []
    for round_ in (1, 2):
        for v in (bare, probe):
            tag = bytes([0xB3, 0x4C, v.index, 16 + round_])
            before = read_probe(probe_dir, RESOURCES) if v is probe else None
            log(f"burst {round_}: {v.label}")
            row = burst(v.trio, a.burst, 256, tag)
            row.update(label=v.label, round=round_)
            if v is probe:
                wait_settled(sink, quiet=2.5)
                after = read_probe(probe_dir, RESOURCES)
                row["probe"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                row["received"] = sink.count(tag)
            burst_rows.append(row)
    results["burst"] = {"n": a.burst, "concurrency": 256, "rows": burst_rows}
    probe.trio.stop()
    probe.trio = None


if __name__ == "__main__":
    sys.exit(main())
