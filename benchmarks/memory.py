"""Memory over time: every trio's processes' resident memory under one long load, side by side.

Run with ``./run-benchmarks --memory-over-time [--quick] [--seconds S] [--interval I]``.
Bare Gym's trio and ours (by default: ``default``, exporting OTLP to the benchmark's
collector, and ``files``, nothing configured, the embedded default's run directory) are
started at once, warmed up, then loaded together, each by its own closed-loop clients,
for ``--seconds``.  Every ``--interval`` seconds the RSS (``VmRSS`` of
``/proc/<pid>/status``) of each process of each trio is read: Gym's orchestrator
(``gym env start``), each server's Python processes, and whatever else the trio's
process tree holds; the policy model behind the trios (``examples/policy_model.py``,
shared by all of them, not Gym's) is read too and shown apart.  The report gives, per
variant and process, the RSS when the load started, after its first quarter, at its end,
its peak, and the growth from the first quarter to the end, also per 10,000 rollouts
served over that stretch: what a long run's memory does once start-up and the first
load's pools and caches are behind it.  For ``files``, the run directory's disk per
rollout once its trio stopped.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import sys
import tempfile
import threading
import time

from benchmarks import fleet
from benchmarks.load import LoadResult, run_load
from benchmarks.options import memory_parser
from benchmarks.report import finish, printed_saved_report
from benchmarks.rundir import disk_report, spans_with_tags
from tests.harness.trio import AGENT, MODEL, RESOURCES, PolicyModel

PHASE_MEMORY = 5  # the trace-id tag's phase byte of this mode's rollouts
ORCHESTRATOR = "orchestrator (gym env start)"
ROLES = {RESOURCES: "resources server", AGENT: "agent server", MODEL: "model server (Gym's openai_model)"}
OTHER = "other processes of the trio"
FLEET = "fleet: every process of the trio"
MB = 1024  # kB in a MB (2**20 bytes)


def rss_kb(pid: int) -> int | None:
    """The process's resident set (``VmRSS``), in kB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return 0  # a process with no user memory (a zombie)


def trio_roles(trio) -> dict[str, list[int]]:
    """The trio's processes by what they are: Gym's orchestrator (the process the harness
    started), each server's Python processes, and any other process of its tree."""
    roles: dict[str, list[int]] = {ORCHESTRATOR: [trio.proc.pid]}
    for name, procs in sorted(trio.all_server_processes().items()):
        roles[ROLES.get(name, name)] = [p.pid for p in procs]
    seen = {pid for pids in roles.values() for pid in pids}
    others = sorted(p.pid for p in trio.processes() if p.pid not in seen)
    if others:
        roles[OTHER] = others
    return roles


def take_sample(t: float, plan: dict, policy_pid: int | None, loads: dict) -> dict:
    """One reading: per variant and role, the RSS summed over its processes (kB) and how
    many of them were alive; the rollouts each variant completed so far."""
    rss: dict = {}
    alive: dict = {}
    for key, roles in plan.items():
        rss[key], alive[key] = {}, {}
        for role, pids in roles.items():
            values = [x for x in (rss_kb(pid) for pid in pids) if x is not None]
            rss[key][role], alive[key][role] = sum(values), len(values)
    return {
        "t": round(t, 3),
        "rss_kb": rss,
        "alive": alive,
        "rollouts": {key: load.n for key, load in loads.items()},
        "policy_kb": rss_kb(policy_pid) if policy_pid else None,
    }


def quarter_index(times: list[float]) -> int:
    """The first sample taken at or after a quarter of the load (from the first sample's
    time to the last's)."""
    target = times[0] + (times[-1] - times[0]) / 4
    return next(i for i, t in enumerate(times) if t >= target)


def _row(label: str, role: str, processes: int, series: list[float], rollouts: list[int], q: int) -> dict:
    served = rollouts[-1] - rollouts[q]
    growth = (series[-1] - series[q]) / MB
    return {
        "label": label,
        "process": role,
        "processes": processes,
        "rollouts": rollouts[-1],
        "start_mb": series[0] / MB,
        "quarter_mb": series[q] / MB,
        "end_mb": series[-1] / MB,
        "peak_mb": max(series) / MB,
        "growth_mb": growth,
        "growth_per_10k_mb": growth / served * 1e4 if served > 0 else None,
    }


def memory_rows(results: dict) -> list[dict]:
    """Per variant, a row per role and one for the whole fleet (every process of the trio);
    then the shared policy model's row, when it was read."""
    samples = results["samples"]
    q = quarter_index([s["t"] for s in samples])
    rows = []
    for v in results["variants"]:
        key, roles = v["key"], v["roles"]
        rollouts = [s["rollouts"].get(key, 0) for s in samples]
        for role, pids in roles.items():
            rows.append(_row(v["label"], role, len(pids), [s["rss_kb"][key][role] for s in samples], rollouts, q))
        fleet = [sum(s["rss_kb"][key].values()) for s in samples]
        rows.append({**_row(v["label"], FLEET, sum(len(p) for p in roles.values()), fleet, rollouts, q), "fleet": True})
    if all(s.get("policy_kb") is not None for s in samples):
        total = [sum(s["rollouts"].values()) for s in samples]
        rows.append(
            _row("(shared by every trio)", "policy model, not Gym's", 1, [s["policy_kb"] for s in samples], total, q)
        )
    return rows


def _mb(x: float, sign: bool = False) -> str:
    return f"{x:+.1f}" if sign else f"{x:.1f}"


def memory_report(results: dict) -> str:
    samples = results["samples"]
    q = quarter_index([s["t"] for s in samples])
    m = results["machine"]
    lines = [
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gb']} GB; Gym {results['gym']} on Python "
        f"{m['python_gym']}; load average at start {', '.join(f'{x:.1f}' for x in m['load_avg_at_start'])}",
        f"Memory over time: {', '.join(v['label'] for v in results['variants'])} loaded together, "
        f"{results['concurrency']} closed-loop clients each, for {samples[-1]['t']:.0f} s after "
        f"{results['warmup']:g} s of warm-up; RSS (VmRSS) of every process of each trio every "
        f"{results['interval']:g} s ({len(samples)} samples); the first quarter ends at the sample of "
        f"{samples[q]['t']:.0f} s; MB = 2^20 bytes.",
        "",
        "| variant | process | processes | rollouts | RSS at start MB | after the first quarter MB | at the end MB "
        "| peak MB | growth after the first quarter MB | per 10k rollouts MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = memory_rows(results)
    for r in rows:
        bold = "**" if r.get("fleet") else ""
        per = r["growth_per_10k_mb"]
        lines.append(
            f"| {r['label']} | {bold}{r['process']}{bold} | {r['processes']} | {r['rollouts']:,} | "
            f"{_mb(r['start_mb'])} | {_mb(r['quarter_mb'])} | {_mb(r['end_mb'])} | {_mb(r['peak_mb'])} | "
            f"{bold}{_mb(r['growth_mb'], True)}{bold} | {'-' if per is None else _mb(per, True)} |"
        )
    fleets = [r for r in rows if r.get("fleet")]
    lines += [
        "",
        "Fleet growth after the first quarter: "
        + ", ".join(f"{r['label']} {_mb(r['growth_mb'], True)} MB" for r in fleets)
        + " (rollouts served: "
        + ", ".join(f"{r['label']} {r['rollouts']:,}" for r in fleets)
        + ").",
    ]
    errors = {v["label"]: v["errors"] for v in results["variants"] if v.get("errors")}
    if errors:
        lines.append("Rollouts that failed: " + ", ".join(f"{k} {n}" for k, n in errors.items()))
    spans = {v["label"]: v["spans_per_rollout"] for v in results["variants"] if v.get("spans_per_rollout")}
    if spans:
        lines.append(
            "Spans per rollout (at the sink, or in the run directory for nothing configured): "
            + ", ".join(f"{k} {n:.1f}" for k, n in spans.items())
        )
    step = max(1, (len(samples) - 1) // 10)
    picked = sorted({*range(0, len(samples), step), len(samples) - 1})
    lines += [
        "",
        "Fleet RSS over time, MB (" + (f"one sample in {step}" if step > 1 else "every sample") + ", and the last):",
        "",
        "| t (s) | " + " | ".join(v["label"] for v in results["variants"]) + " |",
        "|---|" + "---|" * len(results["variants"]),
    ]
    for i in picked:
        lines.append(
            f"| {samples[i]['t']:.0f} | "
            + " | ".join(_mb(sum(samples[i]["rss_kb"][v["key"]].values()) / MB) for v in results["variants"])
            + " |"
        )
    lines.append("")
    lines += disk_report(results["variants"])
    return "\n".join(lines)


def load_and_sample(variants: list, body: bytes, seconds: float, interval: float, concurrency: int, policy) -> dict:
    """Every variant loaded at once for ``seconds``; RSS sampled when the load starts, every
    ``interval`` seconds, and when it ends.  Returns the samples, the process plan and the
    loads."""
    plan = {v.key: trio_roles(v.trio) for v in variants}
    for v in variants:
        fleet.log(f"{v.label}: " + "; ".join(f"{role} pids {pids}" for role, pids in plan[v.key].items()))
    loads = {v.key: LoadResult(n=0, seconds=0.0) for v in variants}
    policy_pid = policy.proc.pid if policy.proc is not None else None
    samples: list[dict] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def sampler() -> None:
        while not stop.wait(interval - (time.monotonic() - t0) % interval):
            samples.append(take_sample(time.monotonic() - t0, plan, policy_pid, loads))
            last = samples[-1]
            if len(samples) % max(1, int(60 / interval)) == 0:
                fleet.log(
                    f"t={last['t']:.0f}s fleet RSS MB "
                    + ", ".join(f"{k}={sum(r.values()) / MB:.1f}" for k, r in last["rss_kb"].items())
                    + "; rollouts "
                    + ", ".join(f"{k}={n}" for k, n in last["rollouts"].items())
                )

    samples.append(take_sample(0.0, plan, policy_pid, loads))
    thread = threading.Thread(target=sampler, daemon=True, name="rss-sampler")
    thread.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
            futures = [
                pool.submit(
                    run_load,
                    v.trio.run_url,
                    body,
                    10**9,
                    concurrency,
                    tag=v.tag(PHASE_MEMORY),
                    check=fleet.rewarded,
                    duration=seconds,
                    result=loads[v.key],
                )
                for v in variants
            ]
            for future in futures:
                future.result()
    finally:
        stop.set()
        thread.join()
    samples.append(take_sample(time.monotonic() - t0, plan, policy_pid, loads))
    for v in variants:
        v.served += loads[v.key].n
    return {"samples": samples, "plan": plan, "loads": loads}


def main(argv: list[str] | None = None) -> int:
    a = memory_parser().parse_args(argv)
    if printed_saved_report(a, memory_report):
        return 0
    seconds = a.seconds or (60.0 if a.quick else 600.0)
    interval = a.interval or (2.0 if a.quick else 5.0)
    keys = [k.strip() for k in a.variants.split(",") if k.strip()]
    t_start = time.monotonic()

    venvs = fleet.bench_venvs(keys)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gym-memory-"))
    sink, collector, otlp = fleet.start_collector(scratch)
    variants = fleet.make_variants(keys, venvs, otlp)
    results: dict = {
        "mode": "memory",
        "gym": fleet.GYM_VERSION,
        "seconds": seconds,
        "interval": interval,
        "concurrency": a.concurrency,
        "warmup": a.warmup,
        "machine": fleet.machine(),
    }
    policy = PolicyModel().start()
    try:
        fleet.start_trios(variants, scratch, policy.url, a.parallel_starts)
        body = fleet.rollout_body(variants[0].trio)
        fleet.log(f"warm-up: {a.warmup:g} s per trio at concurrency {a.concurrency}")
        for v in variants:
            v.served += run_load(v.trio.run_url, body, 10**9, a.concurrency, check=fleet.rewarded, duration=a.warmup).n
        fleet.log(f"load: every trio at once for {seconds:g} s; RSS every {interval:g} s")
        got = load_and_sample(variants, body, seconds, interval, a.concurrency, policy)
        time.sleep(max(v.flush_s for v in variants) + 2.0)  # the tail's spans to the sink
        fleet.stop_trios(variants)  # a run directory is read once its trio's processes exited
        rows = []
        for v in variants:
            load = got["loads"][v.key]
            if load.errors:
                fleet.log(f"{v.label}: {load.errors}/{load.n} rollouts failed: {load.first_error}")
            tag = v.tag(PHASE_MEMORY)
            spans = spans_with_tags(v.disk, [tag]) if v.files else sink.count(tag)
            rows.append(
                {
                    "key": v.key,
                    "label": v.label,
                    "roles": got["plan"][v.key],
                    "rollouts": load.n,
                    "errors": load.errors,
                    "spans_per_rollout": spans / load.n if load.n else 0.0,
                    "disk": v.disk,
                }
            )
        results["variants"] = rows
        results["samples"] = got["samples"]
    finally:
        fleet.tear_down(variants, policy, collector, sink, scratch)
    finish(results, t_start, memory_report, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
