"""The benchmarks' fleet: the Gym venvs, the variants' trios and the collector they export to.

What every mode that loads real trios shares: building the venvs (``bench_venvs``), the
variants (``make_variants``), starting and stopping their trios on free ports, the
collector and its counting sink, reading a trio's server CPU, and waiting for a window's
spans to reach the sink before that CPU is read (``settle``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from benchmarks.load import run_load
from benchmarks.rundir import directory_bytes, record_trio
from benchmarks.sink import CountingSink
from benchmarks.variants import INERT, RUN_ID, SAMPLED_OUT, SPAN_GROUPS, STOCK, VARIANT_KEYS
from tests.harness.collector import Collector
from tests.harness.gym_install import find_python, gym_venv, python_minor_for
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio, GymTrioError

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


def bench_venvs(keys) -> dict[str, pathlib.Path]:
    """The Gym venvs ``make_variants`` takes, in the benchmark's cache (``use_bench_venvs``):
    bare and ours, and the generic stack's when ``keys`` name it."""
    use_bench_venvs()
    venvs = {"bare": gym_venv(GYM_VERSION, with_project=False), "ours": gym_venv(GYM_VERSION)}
    if "generic" in keys:
        venvs["generic"] = gym_venv(GYM_VERSION, with_project=False, extra=GENERIC_STACK)
    return venvs


def start_collector(scratch: pathlib.Path) -> tuple[CountingSink, Collector, dict]:
    """A counting sink, the real collector forwarding to it (its logs under ``scratch``), and
    the environment that points a trio's OTLP/HTTP exporters at the collector."""
    sink = CountingSink()
    collector = Collector(log_dir=scratch / "collector", sink=sink, batch_timeout="200ms")
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    return sink, collector, otlp


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
    tag, run_dir = variant.tag(phase), variant.run_dir
    # a run directory's spans never reach the sink: until the directory stops growing
    progress = (lambda: directory_bytes(run_dir)[0]) if run_dir is not None else (lambda: sink.count(tag))
    return until_quiet(progress, variant.flush_s + 0.7, limit, step=0.1)


def until_quiet(progress: Any, quiet: float, limit: float, step: float) -> float:
    """Poll ``progress()`` every ``step`` seconds until it has not changed for ``quiet``
    seconds, or for ``limit`` seconds at most; returns the seconds waited."""
    t0 = time.monotonic()
    last, since = progress(), time.monotonic()
    while time.monotonic() - t0 < limit:
        time.sleep(step)
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return time.monotonic() - t0


def rotated(items: list, turn: int) -> list:
    """``items`` starting at ``turn`` (modulo), wrapping round: the order of the ``turn``-th
    repetition or window, so that no variant always goes first."""
    turn %= len(items) or 1
    return items[turn:] + items[:turn]


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


def wait_settled(sink: CountingSink, quiet: float = 3.0, limit: float = 30.0) -> None:
    """Until no span has arrived for ``quiet`` seconds (exporters batch for 1 s, 5 s for the
    generic stack, the collector 200 ms)."""
    until_quiet(sink.snapshot, quiet, limit, step=0.5)


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


def tear_down(variants: list, policy: Any, collector: Any, sink: Any, scratch: pathlib.Path) -> None:
    """Stop every trio, the policy model, the collector and the sink; remove the scratch dir."""
    stop_trios(variants)
    policy.stop()
    collector.stop()
    sink.close()
    shutil.rmtree(scratch, ignore_errors=True)
