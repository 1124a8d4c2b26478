"""Instructions per rollout of a real Gym trio, counted by valgrind: bare against ours.

The full run and the attribution measure CPU time, and on a shared machine the CPU a
rollout costs drifts by more than the difference between a traced rollout and one the
sampler dropped.  Here the three servers of each variant's trio run under ``valgrind
--tool=callgrind`` (Gym starts them as usual; their venv's ``python`` is a wrapper that
runs the real interpreter under valgrind, with counting off until the trio is warm).  Per
window, every server's counter is zeroed, ``N`` rollouts are run one at a time (so each
takes the same steps every time), and every server's instructions are dumped
(``callgrind_control``), thread by thread: the interpreter, the C extensions, garbage
collection, the span export.  Only the threads that ran Python in the window are summed
(the event loop, the span exporter, any worker thread of the app); the rest (Ray's C++
threads and the like) do work per second, the same in every variant, and would only add
noise (their share is reported).  Variants take turns, a few repetitions; before each
load window an idle one of the same trio.

A count does not depend on what else the machine is doing, but it is not CPU time:
cache misses and the like are not in it, so read it beside the CPU ratios, not instead.

Work done per second, not per rollout, is kept out of the windows: under valgrind a
rollout takes tens of times longer, so a timer would fire tens of times more often per
rollout than in a real server.  The count runs every instrumented variant with
``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_BSP_SCHEDULE_DELAY`` and
``GYM_AUTOINSTR_LOOP_LAG_INTERVAL_MS`` at an hour, and spans posted by size,
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE=256`` (about what a server of the full run's trio posts
each second): the per-second work (the metric export, the loop-lag probe) is measured in
CPU time by ``--attribution --idle-seconds``.  The spans a window leaves in a server's
queue (fewer than 256) are encoded inside it but posted after it.  What is left running
when idle (uvicorn's ticks, Ray's threads) is the same in every variant; each load window
is charged the median idle rate (of its Python threads) over all idle windows for its
length.

Garbage collection is counted apart (the inclusive count of CPython's ``gc_collect_main``,
and its calls): a full collection of a server's heap is tens of millions of instructions,
and whether a window holds none, one or two moves its total more than tracing does.  Full
collections are left out of the figures (their number is reported); young collections
are given beside them.

``--by-function N`` runs the servers with ``-X perf``: every Python function then runs
through a trampoline of its own, which callgrind counts like a C function and the
interpreter's perf map names, and the report adds the N functions of gym_autoinstr and
OpenTelemetry whose inclusive instructions per rollout differ most from span groups off
(bare when off is not run).  Inclusive counts take in the garbage collections that
struck inside a function, so a large function of Gym's moves from run to run; ours are
small.  The trampolines add to every count, and most to every call: a trivial Python
call costs about 2,000 instructions through them against about 320 without, so a figure
of this report overstates what taking calls out would save, and such a run's main table
is not comparable with one without them.

    ./run-benchmarks --trio-instructions [--rollouts 100] [--reps 3] [--variants off,default,sampled] [--by-function 20]
"""

from __future__ import annotations

import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import fleet
from benchmarks.callgrind import PERF_MAP, by_function, control, counted_servers, shim_venv, window
from benchmarks.load import run_load
from benchmarks.options import trio_instructions_parser
from benchmarks.report import printed_saved_report
from tests.harness.trio import GymTrio, PolicyModel

# Timers fire per wall second; under valgrind a rollout takes tens of times longer, so
# they are kept out of the count (see the module docstring).
COUNT_ENV = {
    "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
    "OTEL_BSP_SCHEDULE_DELAY": "3600000",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256",
    "GYM_AUTOINSTR_LOOP_LAG_INTERVAL_MS": "3600000",
}


def main(argv: list[str] | None = None) -> int:
    ap = trio_instructions_parser()
    a = ap.parse_args(argv)
    if printed_saved_report(a, report):
        return 0
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(
                f"run-benchmarks --trio-instructions: {tool} is not installed (Debian: apt-get install valgrind)",
                file=sys.stderr,
            )
            return 1
    keys = [k.strip() for k in a.variants.split(",") if k.strip()]
    if "generic" in keys:
        ap.error("--variants: generic is not counted here (its spans go through other code paths)")

    venvs = fleet.bench_venvs(keys)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-trio-ir-"))
    sink, collector, otlp = fleet.start_collector(scratch)
    variants = fleet.make_variants(keys, venvs, otlp, extra_env=COUNT_ENV)
    policy = PolicyModel().start()
    results: dict = {
        "gym": fleet.GYM_VERSION,
        "rollouts": a.rollouts,
        "concurrency": a.concurrency,
        "reps": a.reps,
        "idle_seconds": a.idle_seconds,
        "count_env": COUNT_ENV,
        "variants": {},
    }
    pids: dict = {}
    dumps: dict = {}
    try:
        for v in variants:
            dumps[v.key] = scratch / f"dumps-{v.key}"
            dumps[v.key].mkdir()
            shim = shim_venv(
                v.venv, scratch / f"shim-{v.key}", dumps[v.key], perf=a.by_function > 0, cache_sim=a.cache_sim
            )
            fleet.log(f"{v.label}: starting its trio under valgrind (counting off)")
            v.trio = GymTrio(
                v.venv,
                fleet.GYM_VERSION,
                scratch / v.key,
                policy_url=policy.url,
                instrument=v.instrument,
                env=v.env,
                server_venvs={name: shim for name in fleet.SERVERS},
            )
            v.trio.start(timeout=900)
            pids[v.key] = counted_servers(v.trio)
            if sorted(pids[v.key]) != sorted(fleet.SERVERS):
                raise RuntimeError(f"{v.label}: servers under valgrind: {pids[v.key]}; expected {fleet.SERVERS}")
            fleet.log(f"{v.label}: up in {v.trio.startup_seconds:.0f}s; warm-up")
        body = fleet.rollout_body(variants[0].trio)
        for v in variants:
            warm = run_load(
                v.trio.run_url,
                body,
                max(16, a.concurrency * 4),
                a.concurrency,
                tag=v.load_tag(fleet.PHASE_WARMUP),
                check=fleet.rewarded,
            )
            if warm.errors:
                raise RuntimeError(f"{v.label}: warm-up rollouts failed: {warm.first_error}")
            control(list(pids[v.key].values()), "-i", "on")
            results["variants"][v.key] = {"label": v.label, "idle": [], "load": []}
        for rep in range(a.reps):
            for v in fleet.rotated(variants, rep):
                row = results["variants"][v.key]
                row["idle"].append(window(pids[v.key], dumps[v.key], lambda: time.sleep(a.idle_seconds)))

                def load(v=v):
                    done = run_load(
                        v.trio.run_url,
                        body,
                        a.rollouts,
                        a.concurrency,
                        tag=v.load_tag(fleet.PHASE_C1),
                        check=fleet.rewarded,
                    )
                    if done.errors:
                        raise RuntimeError(f"{v.label}: {done.errors}/{done.n} rollouts failed: {done.first_error}")
                    return {"n": done.n}

                row["load"].append(window(pids[v.key], dumps[v.key], load))
                last = row["load"][-1]
                fleet.log(
                    f"repetition {rep + 1}/{a.reps}, {v.label}: {last['ir'] / last['n'] / 1e6:.2f}M instructions "
                    f"per rollout ({last['gc'] / last['n'] / 1e6:.2f}M in GC, {last['full']} full collections), "
                    f"{last['seconds']:.0f}s, idle trio before it "
                    f"{row['idle'][-1]['ir'] / row['idle'][-1]['seconds'] / 1e6:.2f}M/s"
                )
        if a.by_function:
            results["by_function"] = {
                "top": a.by_function,
                "variants": {key: by_function(pids[key], results["variants"][key]["load"]) for key in pids},
            }
    finally:
        for pid in (p for key in pids for p in pids[key].values()):
            pathlib.Path(PERF_MAP.format(pid=pid)).unlink(missing_ok=True)
        fleet.tear_down(variants, policy, collector, sink, scratch)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0


_OURS = ("gym_autoinstr/", "opentelemetry/")


def by_function_report(found: dict, labels: dict) -> list[str]:
    top = found["top"]
    counts = found["variants"]
    reference = "off" if "off" in counts else "bare"
    lines = []
    for key, mine in counts.items():
        if key in (reference, "bare"):
            continue
        theirs = counts[reference]
        rows = sorted(
            (
                (mine.get(f, 0.0) - theirs.get(f, 0.0), f)
                for f in set(mine) | set(theirs)
                if any(marker in f for marker in _OURS)
            ),
            key=lambda r: -abs(r[0]),
        )[:top]
        lines += [
            "",
            f"By Python function, {labels[key]} against {labels[reference]}: inclusive instructions per "
            "rollout (callees included, and any garbage collection that struck inside; a function's figure "
            "is not the sum of the rows below it)",
            "",
            f"| function | {labels[key]}, k | over {labels[reference]}, k |",
            "|---|---|---|",
        ]
        lines += [f"| `{f}` | {mine.get(f, 0.0) / 1e3:.1f} | {d / 1e3:+.1f} |" for d, f in rows]
    return lines


def _by_thread(results: dict) -> bool:
    """The windows were counted thread by thread (runs before that counted every thread)."""
    return all("ir_all_threads" in w for row in results["variants"].values() for w in row["load"])


def idle_rate(results: dict) -> float:
    """Instructions per second of a trio doing nothing: the median over every idle window
    of every variant.  With our timers kept out, what runs when idle (uvicorn's ticks,
    Ray's threads) is the same in every variant, and a 15 s window now and then catches a
    burst of Ray's periodic work that the median leaves out."""
    rates = [w["ir"] / w["seconds"] for row in results["variants"].values() for w in row["idle"]]
    return statistics.median(rates) if rates else 0.0


def per_rollout(row: dict, i: int, rate: float) -> dict:
    """Window ``i`` of a variant, per rollout: ``work``, the instructions outside garbage
    collection less ``rate`` over the window's length; ``gc``, those inside it; ``full``,
    its full collections."""
    load = row["load"][i]
    return {
        "work": (load["ir"] - load["gc"] - rate * load["seconds"]) / load["n"],
        "gc": load["gc"] / load["n"],
        "full": load.get("full", 0),
        "collections": load.get("collections", 0) / load["n"],
    }


def summary(row: dict, rate: float) -> dict:
    """A variant over its windows: the mean of ``work``, its spread, young collections'
    instructions per rollout (from the windows without a full collection), collections
    per rollout and full collections in all."""
    windows = [per_rollout(row, i, rate) for i in range(len(row["load"]))]
    young = [w["gc"] for w in windows if w["full"] == 0]
    return {
        "work": statistics.mean(w["work"] for w in windows),
        "windows": [w["work"] for w in windows],
        "all": statistics.mean(w["work"] + w["gc"] for w in windows),
        "young_gc": statistics.mean(young) if young else float("nan"),
        "collections": statistics.mean(w["collections"] for w in windows),
        "full": sum(w["full"] for w in windows),
    }


# A rough cycle model for callgrind's simulated misses (the weights callgrind's own
# tools suggest): an instruction one cycle, a first-level miss ten, a last-level one 100.
L1_MISSES = ("I1mr", "D1mr", "D1mw")
LL_MISSES = ("ILmr", "DLmr", "DLmw")
L1_CYCLES, LL_CYCLES = 10, 100


def cache_per_rollout(row: dict, rates: dict) -> dict:
    """A variant's simulated cache misses outside garbage collection, per rollout (mean over
    its windows, each less the idle trio's rate of that event over its length): ``l1``,
    ``ll`` and ``ir``, and ``cycles`` by the model above."""

    def outside(window: dict, event: str) -> float:
        return (
            window["events"].get(event, 0)
            - window["gc_events"].get(event, 0)
            - rates.get(event, 0.0) * window["seconds"]
        ) / window["n"]

    windows = row["load"]
    mean = {event: statistics.mean(outside(w, event) for w in windows) for event in ("Ir", *L1_MISSES, *LL_MISSES)}
    l1, ll = sum(mean[e] for e in L1_MISSES), sum(mean[e] for e in LL_MISSES)
    return {"ir": mean["Ir"], "l1": l1, "ll": ll, "cycles": mean["Ir"] + L1_CYCLES * l1 + LL_CYCLES * ll}


def cache_report(results: dict) -> list[str]:
    """With ``--cache-sim``: misses per rollout by variant, and what they add to a
    sampled-out rollout's share of a traced one's cost by the cycle model."""
    rows = results["variants"]
    windows = [w for row in rows.values() for w in row["load"] + row["idle"]]
    if not windows or not all("events" in w for w in windows):
        return []
    idle = [w for row in rows.values() for w in row["idle"]]
    rates = (
        {
            event: statistics.median(w["events"].get(event, 0) / w["seconds"] for w in idle)
            for event in ("Ir", *L1_MISSES, *LL_MISSES)
        }
        if idle
        else {}
    )
    found = {key: cache_per_rollout(row, rates) for key, row in rows.items()}
    base = found["bare"]
    lines = [
        "",
        "Simulated caches (callgrind `--cache-sim=yes`: each server's threads share one simulated "
        "first-level cache and, as the last level, a 2 MB one (a core's L2 on these hosts), with nothing "
        "else on the machine; outside garbage collection, "
        "less the idle trio's rate), per rollout; estimated cycles = instructions + "
        f"{L1_CYCLES} x first-level misses + {LL_CYCLES} x last-level misses:",
        "",
        "| variant | first-level misses, k | last-level misses, k | over bare: instructions, M | "
        "first-level, k | last-level, k | estimated cycles, M | bare over variant, estimated cycles |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, row in rows.items():
        mine = found[key]
        lines.append(
            f"| {row['label']} | {mine['l1'] / 1e3:.1f} | {mine['ll'] / 1e3:.1f} | "
            + (
                "- | - | - | - | - |"
                if key == "bare"
                else f"{(mine['ir'] - base['ir']) / 1e6:+.3f} | {(mine['l1'] - base['l1']) / 1e3:+.1f} | "
                f"{(mine['ll'] - base['ll']) / 1e3:+.1f} | {(mine['cycles'] - base['cycles']) / 1e6:+.3f} | "
                f"{base['cycles'] / mine['cycles']:.3f} |"
            )
        )
    if "default" in found and "sampled" in found and found["default"]["cycles"] > base["cycles"]:

        def share(field: str) -> float:
            return (found["sampled"][field] - base[field]) / (found["default"][field] - base[field])

        lines += [
            "",
            "A sampled-out rollout over bare, relative to a traced one, by these counts: "
            f"instructions {share('ir'):.3f}, estimated cycles {share('cycles'):.3f}",
        ]
    return lines


def report(results: dict) -> str:
    rows = results["variants"]
    bare = rows.get("bare")
    if not bare or not bare["load"]:
        return "no windows"
    rate = idle_rate(results)
    lines = [
        f"Instructions per rollout, real Gym {results['gym']} trio under valgrind callgrind "
        f"({results['rollouts']} rollouts per window at concurrency {results['concurrency']}, "
        f"{len(bare['load'])} windows per variant taking turns; per-second timers kept out; "
        + ("the threads that ran Python only; " if _by_thread(results) else "")
        + f"each window less the idle trio's {rate / 1e6:.2f}M instructions per second, the median of the idle "
        "windows, over its length)",
        "",
        "| variant | outside GC, M per rollout: mean (windows) | young collections, M | collections per rollout "
        "(full ones, all windows) | over bare, M | with young collections, over bare, M | bare over variant |",
        "|---|---|---|---|---|---|---|",
    ]
    base = summary(bare, rate)
    over: dict = {}
    for key, row in rows.items():
        mine = summary(row, rate)
        total, base_total = mine["work"] + mine["young_gc"], base["work"] + base["young_gc"]
        known = total == total and base_total == base_total  # (NaN: every window had a full collection)
        if not known:  # outside GC only
            total, base_total = mine["work"], base["work"]
        over[key] = (mine["work"] - base["work"], total - base_total)
        cells = ", ".join(f"{x / 1e6:.2f}" for x in mine["windows"])
        young = "n/a" if mine["young_gc"] != mine["young_gc"] else f"{mine['young_gc'] / 1e6:.2f}"
        with_young = f"{over[key][1] / 1e6:+.3f}" if known else "n/a"
        lines.append(
            f"| {row['label']} | {mine['work'] / 1e6:.2f} ({cells}) | {young} | "
            f"{mine['collections']:.3f} ({mine['full']}) | "
            + (
                "- | - | - |"
                if key == "bare"
                else f"{over[key][0] / 1e6:+.3f} | {with_young} | {base_total / total:.3f} |"
            )
        )
    lines += [
        "",
        "Full collections are left out of the table (their number is in it): one is tens of millions "
        "of instructions and a window holds none, one or two.  Everything counted, full collections too, "
        "over bare, M per rollout: "
        + ", ".join(
            f"{row['label']} {(summary(row, rate)['all'] - base['all']) / 1e6:+.3f}"
            for key, row in rows.items()
            if key != "bare"
        ),
    ]
    if _by_thread(results):
        loads = [w for row in rows.values() for w in row["load"]]
        left = sum(w["ir_all_threads"] - w["ir"] for w in loads) / sum(w["ir_all_threads"] for w in loads)
        lines += [
            "",
            f"Threads that ran no Python in a window (Ray's C++ threads and the like) are left out: {left:.1%} of "
            "all the load windows' instructions.",
        ]
    if "default" in over and "sampled" in over and over["default"][0] > 0:
        lines += [
            "",
            "A sampled-out rollout's instructions over bare, relative to a traced one's (ours default): "
            f"{over['sampled'][0] / over['default'][0]:.3f} outside GC"
            + (
                f", {over['sampled'][1] / over['default'][1]:.3f} with young collections"
                if over["default"][1] != over["default"][0]
                else ""
            ),
        ]
    lines += cache_report(results)
    if results.get("by_function"):
        lines += by_function_report(results["by_function"], {k: r["label"] for k, r in rows.items()})
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
