"""The overhead run's report: its results (``./run-benchmarks --json``) as markdown tables.

Per-repetition ratios as median [min-max], the issue 13 budget with bootstrap intervals
(``ratio_interval``), and several saved runs read as one (``--across``); also the
helpers every mode's report and output share (``spread``, ``finish``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import time
from typing import Any

from benchmarks.rundir import disk_report
from benchmarks.variants import UNINSTRUMENTED, VARIANT_HELP


def printed_saved_report(a: argparse.Namespace, render: Any) -> bool:
    """With ``--report-from FILE``: print ``render`` of that file's results; whether it did."""
    if not a.report_from:
        return False
    print(render(json.loads(a.report_from.read_text())))
    return True


def median(values):
    return statistics.median(values) if values else float("nan")


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def spread(values, fmt="{:.3f}"):
    if not values:
        return "n/a"
    return f"{fmt.format(median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


TOGETHER_KEYS = ("bare", "default", "sampled")


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
    value = median(values)
    ok = value >= target if at_least else value <= target
    return spread(values), "**pass**" if ok else "**fail**"


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
            f"{spread(d['ratio_c1'])} / {spread(d['ratio_cn'])} | - | - |" + (" - |" if n_sets > 1 else "")
        )
        points = d.get("metric_points")
        out.append(
            f"| default preset: metrics on, exported over OTLP to the collector | yes | "
            f"{'yes' if points else 'no'} ({points} data points) | "
            f"{'**pass**' if points else '**fail**'} | - |" + (" - |" if n_sets > 1 else "")
        )
    out.append("")
    return out


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
            f"| {v['label']} | {median(v['rps_c1']):.1f} | {spread(v['ratio_c1'])} | {median(v['rps_cn']):.1f} | "
            f"{spread(v['ratio_cn'])} | {median(v['cpu_ms']):.2f} | "
            f"{'-' if v is bare else spread(v['cpu_overhead_ms'], '{:.2f}')} | "
            f"{'-' if v is bare else spread(capacity)} | "
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
            f"{spread(capacity_ratios(twin, bare))}"
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
            f"overhead {spread(inert['cpu_overhead_ms'], '{:.2f}')} ms per rollout; each variant's overhead "
            "beyond it, per repetition: " + ", ".join(f"{k} {spread(d, '{:.2f}')} ms" for k, d in beyond.items())
        )
        lines.append("")
    g = results.get("cpu_overhead_vs_generic")
    if g:
        lines.append(
            "CPU overhead per rollout relative to the generic stack's (same repetition): "
            + ", ".join(f"{k} {spread(vals)}" for k, vals in g.items())
        )
        lines.append("")
    if results.get("sampled_over_traced"):
        lines.append(
            "A sampled-out rollout's CPU overhead relative to a traced one's (ours default, "
            "`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, ratio 0, over ours default, same repetition): "
            + spread(results["sampled_over_traced"])
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
            + spread(together_overheads(together)[0], "{:.2f}")
            + ", sampled out "
            + spread(together_overheads(together)[1], "{:.2f}")
            + f"; sampled out over traced {spread(per_window)} per window"
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
                f"| {v['label']} | {spread(imp, '{:.2f}') if imp else '-'} | "
                f"{spread(imp_cpu, '{:.2f}') if imp_cpu else '-'} | "
                f"{spread(v['startup'], '{:.2f}')} | {v['trio_ready']:.1f} |"
            )
        if "import_overhead_ms" in st:
            lines.append("")
            lines.append(
                "Start-up overhead per server process (`import app`, ours default minus bare, paired per "
                f"repetition): CPU {spread(st['import_cpu_overhead_ms'], '{:.0f}')} ms, "
                f"wall {spread(st['import_overhead_ms'], '{:.0f}')} ms"
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


def saved_runs(paths: list[pathlib.Path]) -> list[tuple[str, dict]]:
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
