"""gym-autoinstr overhead benchmarks on a real Gym trio (nemo-gym 0.4.0); see BENCHMARKS.md.

Run with ``./run-benchmarks [--quick]`` from the repository root.  Everything is measured
in this one run, side by side: the variants' trios are all up at once and every
repetition visits every variant (in a rotated order), so each ratio compares numbers
taken a few seconds apart on the same (shared, noisy) machine.  Ratios are computed per
repetition and reported as median [min-max].
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import fleet
from benchmarks.load import run_load
from benchmarks.options import run_parser
from benchmarks.report import TOGETHER_KEYS, across_report, finish, percentile, printed_saved_report, report, saved_runs
from benchmarks.rundir import spans_with_tags
from benchmarks.sink import CountingSink
from benchmarks.variants import IN_FILES, ONLY_WHEN_NAMED, UNINSTRUMENTED, VARIANT_KEYS
from tests.harness.trio import RESOURCES, GymTrio, PolicyModel


def measure(
    variant: fleet.Variant, phase: int, seconds: float, concurrency: int, body: bytes, sink: CountingSink | None = None
) -> dict:
    """Rollouts started for ``seconds`` by ``concurrency`` closed-loop clients.  With a
    ``sink``, CPU is read after the window's spans were exported (``settle``), less the
    variant's idle CPU over that wait."""
    trio = variant.trio
    cpu0 = fleet.server_cpu(trio)
    result = run_load(
        trio.run_url, body, 10**6, concurrency, tag=variant.load_tag(phase), check=fleet.rewarded, duration=seconds
    )
    variant.served += result.n
    waited = fleet.settle(variant, sink, phase) if sink is not None else 0.0
    cpu1 = fleet.server_cpu(trio) - variant.idle_cpu_per_s * waited
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


def measure_idle(variants: list[fleet.Variant], seconds: float = 4.0) -> None:
    """Each trio's server CPU per second with no load (all trios at once)."""
    before = {v.key: fleet.server_cpu(v.trio) for v in variants}
    time.sleep(seconds)
    for v in variants:
        v.idle_cpu_per_s = max(0.0, (fleet.server_cpu(v.trio) - before[v.key]) / seconds)


def bracketed_windows(bare: fleet.Variant, order: list[fleet.Variant], window: Any) -> None:
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


def sampled_together(
    variants: list[fleet.Variant],
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
        before = {v.key: fleet.server_cpu(v.trio) for v in picked}
        loads, waited = fleet.load_together(
            fleet.rotated(picked, i), sink, body, seconds, concurrency, fleet.PHASE_TOGETHER
        )
        for v in picked:
            result = loads[v.key]
            cpu = fleet.server_cpu(v.trio) - before[v.key] - v.idle_cpu_per_s * waited
            out[v.key].append(
                {"n": result.n, "cpu_ms": cpu / result.n * 1e3 if result.n else float("nan"), "set": trio_set}
            )
        fleet.log(
            f"together window {i + 1}: ms/rollout " + ", ".join(f"{k}={w[-1]['cpu_ms']:.2f}" for k, w in out.items())
        )
    return out


def micro_benchmarks(ours_venv: pathlib.Path, quick: bool) -> dict:
    args = ["5", "10000"] if quick else ["9", "20000"]
    out = subprocess.run(
        [str(ours_venv / "bin" / "python"), "-m", "benchmarks.micro", *args],
        cwd=fleet.REPO,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def import_startup(variants: list[fleet.Variant], reps: int) -> dict:
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
        "p99_ms": percentile(result.latencies, 99) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    a = run_parser().parse_args(argv)
    if a.across:
        print(across_report(saved_runs(a.across)))
        return 0
    if printed_saved_report(a, report):
        return 0
    quick = a.quick
    reps = a.reps or (3 if quick else 6)
    t1, tn = (2.0, 4.0) if quick else (3.0, 5.0)
    conc = a.concurrency
    t_start = time.monotonic()

    keys = (
        [k.strip() for k in a.variants.split(",")]
        if a.variants
        else [k for k in VARIANT_KEYS if k not in ONLY_WHEN_NAMED]
    )
    venvs = fleet.bench_venvs(keys)
    results: dict = {
        "mode": "quick" if quick else "full",
        "reps": reps,
        "t1": t1,
        "tn": tn,
        "concurrency": conc,
        "machine": fleet.machine(),
        "gym": fleet.GYM_VERSION,
    }

    if "micro" not in a.skip:
        fleet.log("micro-benchmarks")
        results["micro"] = micro_benchmarks(venvs["ours"], quick)

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-bench-"))
    sink, collector, otlp = fleet.start_collector(scratch)
    variants = fleet.make_variants(keys, venvs, otlp)
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
                fleet.log(f"trio set {trio_set + 1}/{n_sets}: stopping every trio and starting it afresh")
                fleet.stop_trios(variants)
            fleet.start_trios(variants, scratch / f"set{trio_set}", policy.url, a.parallel_starts)
            body = body or fleet.rollout_body(variants[0].trio)
            # Warm-up at the windows' own concurrency: a trio's first load at 64 grows its
            # connection pools, tasks and heap, which would otherwise fall on each variant's
            # first window (bare's too, but bare has one window per variant, so it is spread
            # over them): in a run of six trio sets of four repetitions, each set's first
            # repetition read 0.07-0.8 ms per rollout dearer than its others, every variant.
            fleet.log("warm-up")
            for v in variants:
                v.served += run_load(
                    v.trio.run_url,
                    body,
                    10**6,
                    conc,
                    tag=v.load_tag(fleet.PHASE_WARMUP),
                    check=fleet.rewarded,
                    duration=2.0,
                ).n
            fleet.wait_settled(sink, quiet=max(v.flush_s for v in variants) + 1.0)  # idle read without export
            for v in variants:
                if v.files:  # its spans never reach the sink: until its run directory stops growing
                    fleet.settle(v, sink, fleet.PHASE_WARMUP)
            measure_idle(variants)
            fleet.log("idle server CPU ms/s: " + ", ".join(f"{v.key}={v.idle_cpu_per_s * 1e3:.1f}" for v in variants))
            if not trio_set:
                by_run_before = {v.key: sink.run_counts(v.run_id) for v in variants}
            for rep in [r for r in range(reps) if r * n_sets // reps == trio_set]:
                order = fleet.rotated(variants, rep)
                for v in order:
                    v.samples["c1"].append({**measure(v, fleet.PHASE_C1, t1, 1, body), "set": trio_set})
                bracketed_windows(
                    bare,
                    list(reversed(fleet.rotated(others, rep))),
                    lambda v: {**measure(v, fleet.PHASE_CN, tn, conc, body, sink), "set": trio_set},
                )
                fleet.log(
                    f"repetition {rep + 1}/{reps}: c={conc} rollouts/s "
                    + ", ".join(f"{v.key}={v.samples['cn'][-1]['rps']:.0f}" for v in variants)
                )
            windows = [i for i in range(n_windows) if i * n_sets // n_windows == trio_set]
            if windows:
                fleet.log(
                    f"sampled out, loaded together with bare and the default: {len(windows)} of {n_windows} "
                    f"windows of {seconds:g} s"
                )
                for key, rows in sampled_together(
                    variants, sink, body, windows, seconds, max(1, conc // 2), trio_set
                ).items():
                    together.setdefault(key, []).extend(rows)
        fleet.wait_settled(sink)
        fleet.stop_trios([v for v in variants if v.files])  # its run directory is read once its processes exited

        rows = []
        for v in variants:
            rollouts = sum(s["n"] for s in v.samples["c1"] + v.samples["cn"])
            by_run = sink.run_counts(v.run_id)
            at_sink = v.key not in (*UNINSTRUMENTED, *IN_FILES, "generic")
            if v.files:  # counted in its run directories, by the same tags
                spans = spans_with_tags(v.disk, [v.tag(fleet.PHASE_C1), v.tag(fleet.PHASE_CN)])
            elif v.traceparent:
                spans = sink.count(v.tag(fleet.PHASE_C1)) + sink.count(v.tag(fleet.PHASE_CN))
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
                    "p50_ms": percentile(lat, 50) * 1e3,
                    "p99_ms": percentile(lat, 99) * 1e3,
                    "p50_cn_ms": percentile([x for s in v.samples["cn"] for x in s["latencies"]], 50) * 1e3,
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
            fleet.log("start-up: import app in each variant's server environment")
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
                fleet.log(f"start-up measurement failed: {error}")
                results["startup"] = {"import": {}, "error": str(error)}

        if "burst" not in a.skip:
            try:
                run_bursts(a, results, variants, scratch, otlp, venvs["ours"], policy, sink)
            except Exception as error:
                fleet.log(f"burst failed: {error}")
                results["burst_error"] = str(error)
    finally:
        fleet.tear_down(variants, policy, collector, sink, scratch)
    finish(results, t_start, report, a.json)
    return 0


def run_bursts(a, results, variants, scratch, otlp, ours_venv, policy, sink) -> None:
    """Two bursts each against the resources server of the bare trio and of a trio with our
    defaults plus the SDK counters of benchmarks/probe (the other trios are stopped first)."""
    bare = variants[0]
    for v in variants[1:]:
        if v.trio is not None:
            fleet.log(f"stopping trio: {v.label}")
            fleet.stop_trios([v])
    probe_dir = scratch / "probe"
    probe_dir.mkdir()
    probe_env = {
        **otlp,
        "PYTHONPATH": str(fleet.REPO / "benchmarks" / "probe"),
        "GYM_AUTOINSTR_BENCH_PROBE_DIR": str(probe_dir),
    }
    probe = fleet.Variant("probe", "ours, default (SDK counters)", ours_venv, False, probe_env, index=len(variants))
    fleet.log("starting trio: ours default with SDK counters (burst)")
    fleet.start_trio(probe, scratch, policy.url)
    variants.append(probe)  # stopped with the others if anything fails
    burst_rows = []
    for round_ in (1, 2):
        for v in (bare, probe):
            tag = bytes([0xB3, 0x4C, v.index, 16 + round_])
            before = read_probe(probe_dir, RESOURCES) if v is probe else None
            fleet.log(f"burst {round_}: {v.label}")
            row = burst(v.trio, a.burst, 256, tag)
            row.update(label=v.label, round=round_)
            if v is probe:
                fleet.wait_settled(sink, quiet=2.5)
                after = read_probe(probe_dir, RESOURCES)
                row["probe"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                row["received"] = sink.count(tag)
            burst_rows.append(row)
    results["burst"] = {"n": a.burst, "concurrency": 256, "rows": burst_rows}
    probe.trio.stop()
    probe.trio = None


if __name__ == "__main__":
    sys.exit(main())
