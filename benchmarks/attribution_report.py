"""``./run-benchmarks --attribution``'s report: where a rollout's CPU goes, as markdown.

Per variant, ms per rollout by server and thread bucket, with its delta to bare; garbage
collection per generation, the heap, spans and metrics at the sink, idle CPU, and the
py-spy categories when sampled.
"""

from __future__ import annotations

import collections
import statistics

from benchmarks.fleet import SERVERS
from benchmarks.probed import BUCKETS
from benchmarks.report import median, spread
from tests.harness.trio import AGENT, MODEL, RESOURCES

SHORT = {RESOURCES: "resources", AGENT: "agent", MODEL: "model"}
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
        cells.append(f"{labels[k]} {_sign(median(deltas), '{:.2f}')} ms{spread}")
    return [
        "Overhead per rollout with full collections spread evenly over the run (median of per-window "
        "deltas; the spread before -> after): " + ", ".join(cells)
    ]


def per_rollout(windows: list, path) -> list:
    """Per window: a value (ms per rollout) picked out of the window's delta by ``path``."""
    return [path(w["delta"]) * 1e3 / w["n"] for w in windows if w["n"]]


def by_thread_name(keys: list, windows: dict, field: str) -> collections.Counter:
    """(variant, thread name) -> ms per rollout, mean over the variant's windows, of the
    threads that ``delta`` lists by name under ``field`` (absent in older --json files)."""
    found: collections.Counter = collections.Counter()
    for k in keys:
        for w in windows[k]:
            for r in w["delta"].values():
                for name, cpu in r.get(field, {}).items():
                    found[(k, name)] += cpu * 1e3 / w["n"] / len(windows[k])
    return found


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
            cell = fmt.format(median(vals))
            if k != "bare" and delta:
                diffs = [x - y for x, y in zip(vals, base)]
                cell += f" ({_sign(median(diffs), fmt)})"
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
            f"{labels[k]} {spread([b / x for b, x in zip(base, per_variant[k]) if x > 0])}" for k in keys if k != "bare"
        )
    )
    if "default" in per_variant and "sampled" in per_variant:
        ratios = [(s - b) / (t - b) for s, t, b in zip(per_variant["sampled"], per_variant["default"], base) if t > b]
        lines.append(
            f"A sampled-out rollout's overhead over a traced one's (target <= 0.20), per window: {spread(ratios)}"
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
            cells.append(f"{median(coll):.3f}; {median(cpu):.3f} ms; {median(wall):.3f} ms" if n else "-")
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
    others, native = by_thread_name(keys, windows, "other_threads"), by_thread_name(keys, windows, "native_threads")
    if others:
        lines.append(
            "Other Python threads (ms per rollout): "
            + ", ".join(f"{labels[k]} `{t}` {v:.2f}" for (k, t), v in others.most_common(8) if v >= 0.005)
        )
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
            + ", ".join(f"{labels[k]} {spread([w['settle_s'] for w in windows[k]], '{:.1f}')} s" for k in keys)
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
