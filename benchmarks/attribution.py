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
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import fleet
from benchmarks.attribution_report import SHORT, report
from benchmarks.load import run_load
from benchmarks.options import attribution_parser
from benchmarks.probed import BUCKETS, Probed, delta, scaled, subtract_idle
from benchmarks.report import finish, printed_saved_report
from benchmarks.sink import CountingSink
from tests.harness.trio import PolicyModel

PROBE = fleet.REPO / "benchmarks" / "probe"
PHASE_WARMUP, PHASE_WINDOW, PHASE_SPY = 8, 9, 10


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
    fleet.log("installing py-spy into the runner venv")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], capture_output=True, text=True)
    if done.returncode != 0:
        fleet.log(f"py-spy not installed: {done.stderr.strip()[-300:]}")
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
        v.trio.run_url, body, 10**6, concurrency, tag=v.load_tag(PHASE_SPY), check=fleet.rewarded, duration=seconds
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


# ------------------------------------------------------------------ windows


def load_window(
    variants: list,
    probed: dict,
    idle: dict,
    sink: CountingSink,
    body: bytes,
    seconds: float,
    concurrency: int,
    windows: dict,
) -> None:
    """One window of ``variants`` loaded at the same time (all of them with ``--together``, one
    otherwise), each one's CPU read once its spans of the window reached the sink."""
    before = {v.key: probed[v.key].snapshot() for v in variants}
    # every trio's spans of this window at the sink before any CPU is read
    loads, waited = fleet.load_together(variants, sink, body, seconds, concurrency, PHASE_WINDOW)
    after = {v.key: probed[v.key].snapshot() for v in variants}
    for v in variants:
        result = loads[v.key]
        d = subtract_idle(delta(before[v.key], after[v.key]), idle[v.key], waited)
        windows[v.key].append({"n": result.n, "seconds": result.seconds, "settle_s": waited, "delta": d})


def heap(probed: dict) -> dict:
    """Per variant and server: the objects the GC tracks and the modules loaded (of them
    ``opentelemetry.*``), from a heavy probe."""
    return {
        k: {
            n: {f: s["probe"].get(f) for f in ("tracked_objects", "modules", "otel_modules")}
            for n, s in p.snapshot(heavy=True)["servers"].items()
        }
        for k, p in probed.items()
    }


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    a = attribution_parser().parse_args(argv)
    if printed_saved_report(a, report):
        return 0
    reps = a.reps or (2 if a.quick else 4)
    seconds = a.seconds or (5.0 if a.quick else 10.0)
    keys = [k.strip() for k in a.variants.split(",") if k.strip()]
    t_start = time.monotonic()

    venvs = fleet.bench_venvs(keys)
    spy = find_py_spy(install=True) if a.py_spy else None

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-attr-"))
    sink, collector, otlp = fleet.start_collector(scratch)
    probe_env = {"PYTHONPATH": str(PROBE), "GYM_AUTOINSTR_BENCH_GC": "1", "GYM_AUTOINSTR_BENCH_SDK_COUNTERS": "0"}
    variants = fleet.make_variants(keys, venvs, otlp, extra_env=probe_env, instrument=False)
    for i, spec in enumerate(a.lever):
        label, _, assignments = spec.partition(":")
        label, _, base_key = label.partition("@")
        base_key = base_key or "default"
        if base_key not in ("default", "sampled", "off"):
            raise SystemExit(f"--lever {spec!r}: the base after '@' is 'default', 'sampled' or 'off', not {base_key!r}")
        base = fleet.make_variants([base_key], venvs, otlp, extra_env=probe_env, instrument=False)[1]
        env = dict(base.env)
        for assignment in filter(None, (x.strip() for x in assignments.split(","))):
            name, eq, value = assignment.partition("=")
            if not eq or not name:
                raise SystemExit(f"--lever {spec!r}: expected LABEL:KEY=VALUE[,KEY=VALUE...]")
            env[name] = value
        key = f"lever{i + 1}"
        env["NEMO_GYM_OTEL_RUN_ID"] = f"bench-{key}"
        variants.append(
            fleet.Variant(
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
        "gym": fleet.GYM_VERSION,
        "machine": fleet.machine(),
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
        fleet.start_trios(variants, scratch, policy.url, 2)
        probed = {v.key: Probed(v, scratch / "probe" / v.key) for v in variants}
        body = fleet.rollout_body(variants[0].trio)
        fleet.log("warm-up")
        for v in variants:
            run_load(v.trio.run_url, body, 10**6, 8, tag=v.load_tag(PHASE_WARMUP), check=fleet.rewarded, duration=2.0)
        time.sleep(2.0)
        results["heap_start"] = heap(probed)
        idle_s = a.idle_seconds or (4.0 if a.quick else 8.0)
        fleet.log(f"idle baseline ({idle_s:g} s)")
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
            order = fleet.rotated(variants, rep)
            for group in [order] if a.together else [[v] for v in order]:
                load_window(group, probed, idle, sink, body, seconds, a.concurrency, windows)
            fleet.log(
                f"window {rep + 1}/{reps}{' (together)' if a.together else ''}: ms/rollout "
                + ", ".join(
                    f"{k}={sum(r['process'] for r in w[-1]['delta'].values()) * 1e3 / w[-1]['n']:.2f}"
                    for k, w in windows.items()
                )
            )
        results["windows"] = windows
        time.sleep(2.0)
        results["heap"] = heap(probed)

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
                    fleet.log(f"py-spy window: {v.label}")
                    results["py_spy"][v.key] = spy_window(
                        spy, probed[v.key], seconds, a.concurrency, body, a.spy_rate, spy_dir
                    )
    finally:
        fleet.tear_down(variants, policy, collector, sink, scratch)
    finish(results, t_start, report, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
