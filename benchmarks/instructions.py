"""Instructions per call of the micro-benchmarks' call sites, counted by valgrind.

``benchmarks/micro.py`` times each call site with the CPU clock; on a shared machine two
runs of the same code differ by tens of percent, more than most changes to a hot path.
Here the same sites (``micro.build()``) run under ``valgrind --tool=callgrind``, which
counts the instructions the process executes, not seconds: the same code, inputs and
environment give the same count whatever else the machine is doing.  Everything the
interpreter does for a call is in the count (allocation, the young-generation collections
the calls trigger), but not what a cold cache or a busy neighbour adds to it.

Per (site, variant): one process makes ``N`` calls after a warm-up of ``WARM_UP``,
another makes none after the same warm-up; the difference over ``N`` is the count per
call.  ``--code DIR`` (repeatable) counts the same sites with another copy of the
package first on ``PYTHONPATH`` (``DIR/gym_autoinstr``; e.g. ``git archive`` of an older
commit), side by side with the working tree.

    ./run-benchmarks --instructions [--sites ingress,request] [--code DIR ...]

``--objects`` counts, instead, the GC-tracked objects a request holds alive while its
response starts (sites ``ingress`` and ``hop``), or while the call or handler it wraps
runs (``request``, ``handler``; no valgrind, exact): under load a
request lives through many young collections, so each such object is carried into the
older generations, whose collections walk it again; a full collection walks every
object there, and comes once a quarter of that number has been carried in, so each
object carried in costs the server about four object-walks of a full collection, work
that instructions per call outside those collections do not show.

Inside the Gym venv, one count: ``python -m benchmarks.instructions SITE VARIANT N``
(``--alive SITE VARIANT N`` for the objects).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

WARM_UP = 50
CALLS = 2000

# The variants counted per site (micro.py has them all); the default report: our
# per-request paths beside the call they wrap.
SITES = {
    "ingress": (
        "unwrapped",
        "off+metrics",
        "dropped+metrics",
        "dropped-first+metrics",
        "root-dropped+metrics",
        "on+metrics",
    ),
    "hop": ("unwrapped", "dropped-first+metrics", "root-dropped+metrics"),
    "request": ("unwrapped", "off", "dropped", "on"),
    "handler": ("unwrapped", "dropped", "on"),
    "semaphore": ("unwrapped", "off+metrics"),
    "answered": ("unwrapped", "on", "on+outcome"),
    "job_rollout": ("unwrapped", "on"),
    "ray_submit": ("unwrapped", "off"),
}
DEFAULT_SITES = ("ingress", "request", "handler", "hop")

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _calls(site: str, variant: str, n: int) -> None:
    """In the Gym venv: set the sites up, warm up, make ``n`` calls of one.  Run as a
    script (this directory first on ``sys.path``, not the repository's), so that a
    ``--code`` copy on ``PYTHONPATH`` is the ``gym_autoinstr`` imported."""
    import micro

    bench = micro.build()
    fn = bench.cases[site][variant]
    with bench.variant(variant):
        for _ in range(WARM_UP):
            fn()
        for _ in range(n):
            fn()


def _objects(site: str, variant: str, n: int) -> None:
    """In the Gym venv: the GC-tracked objects alive (made since the call began, not
    freed) when the site's app sends its response start, per call, printed as one
    number.  Each call starts after a collection, with the collector off, so the young
    generation holds exactly those: what a request keeps alive while it runs, which a
    busy server's collections carry into the older generations and walk again (the
    caches' new entries included).  Counted by listing the generation, not by its
    counter, which objects taken from the interpreter's free lists do not move."""
    import gc

    import micro

    bench = micro.build()
    fn = bench.cases[site][variant]
    alive: list[int] = []
    with bench.variant(variant):
        for _ in range(WARM_UP):
            fn()
        seen: list[int] = []
        if site in OBJECT_SITES_IN_CALL:
            micro.ALIVE_IN_CALL = seen
        else:
            micro.ALIVE = seen
        gc.disable()
        try:
            for _ in range(n):
                seen.clear()
                gc.collect()
                start = len(gc.get_objects(generation=0))
                fn()
                alive.append(seen[0] - start)
        finally:
            micro.ALIVE = micro.ALIVE_IN_CALL = None
            gc.enable()
    print(sum(alive) / len(alive))


_WORKERS = max(1, min(4, os.cpu_count() or 1))  # counting processes at once


def _child_env(code: str | None) -> dict[str, str]:
    """The environment of a counting process: no OpenTelemetry or gym-autoinstr settings of
    this shell, and ``code`` (another copy of the package) first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))}
    env.pop("PYTHONPATH", None)
    if code:
        env["PYTHONPATH"] = code
    return env


def objects(python: pathlib.Path, site: str, variant: str, n: int, code: str | None) -> float:
    """``_objects`` in a process of the Gym venv (no valgrind)."""
    env = _child_env(code)
    out = subprocess.run(
        [str(python), __file__, "--alive", site, variant, str(n)],
        cwd=pathlib.Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{site}/{variant} objects failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def count(python: pathlib.Path, site: str, variant: str, n: int, code: str | None) -> int:
    """Instructions of one process making ``n`` calls (under callgrind)."""
    env = _child_env(code)
    env["PYTHONHASHSEED"] = "0"  # the same dict layouts in both processes
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            str(python),
            __file__,
            site,
            variant,
            str(n),
        ],
        cwd=pathlib.Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{site}/{variant} under callgrind failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return int(found.group(1))


def run(python: pathlib.Path, sites: dict, codes: list[str | None], calls: int = CALLS) -> dict:
    """``{code label: {site: {variant: instructions per call}}}``; the working tree's label
    is ``working tree``."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    results: dict = {}
    with concurrent.futures.ThreadPoolExecutor(_WORKERS) as pool:
        jobs = {}
        for code in codes:
            label = code or "working tree"
            for site, variants in sites.items():
                for variant in variants:
                    jobs[(label, site, variant)] = (
                        pool.submit(count, python, site, variant, calls, code),
                        pool.submit(count, python, site, variant, 0, code),
                    )
        for (label, site, variant), (with_calls, without) in jobs.items():
            per_call = (with_calls.result() - without.result()) / calls
            results.setdefault(label, {}).setdefault(site, {})[variant] = per_call
    return results


OBJECT_CALLS = 200  # (a collection before each call)


def run_objects(python: pathlib.Path, sites: dict, codes: list[str | None], calls: int = OBJECT_CALLS) -> dict:
    """``run``'s shape, of objects alive at the response start per call (``_objects``)."""
    results: dict = {}
    with concurrent.futures.ThreadPoolExecutor(_WORKERS) as pool:
        jobs = {
            (code or "working tree", site, variant): pool.submit(objects, python, site, variant, calls, code)
            for code in codes
            for site, variants in sites.items()
            for variant in variants
        }
        for (label, site, variant), job in jobs.items():
            results.setdefault(label, {}).setdefault(site, {})[variant] = job.result()
    return results


OBJECT_SITES_IN_CALL = ("request", "handler")  # counted inside the call our advice wraps
OBJECT_SITES = ("ingress", "hop", *OBJECT_SITES_IN_CALL)  # ingress, hop: when the app sends its response start

TITLES = {
    "instructions": "Instructions per call (valgrind callgrind; in brackets: more than the site's `unwrapped`)",
    "objects": "GC-tracked objects alive when the app sends its response start (ingress, hop) or inside the "
    "wrapped call (request, handler), per call (the collector off; in brackets: more than the site's "
    "`unwrapped`)",
}


def report(results: dict, what: str = "instructions") -> str:
    labels = list(results)
    first = results[labels[0]]
    digits = 0 if what == "instructions" else 1
    lines = [
        TITLES[what],
        "",
        "| site | variant | " + " | ".join(f"`{label}`" for label in labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for site, variants in first.items():
        for variant in variants:
            cells = []
            for label in labels:
                row = results[label].get(site, {})
                value = row.get(variant)
                base = row.get("unwrapped")
                if value is None:
                    cells.append("")
                elif base is None or variant == "unwrapped":
                    cells.append(f"{value:,.{digits}f}")
                else:
                    cells.append(f"{value:,.{digits}f} ({value - base:+,.{digits}f})")
            lines.append(f"| {site} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --instructions``'s options (``benchmarks/options.py`` prints them)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks --instructions", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sites", help="comma-separated, of: " + ",".join(SITES) + " (default: " + ",".join(DEFAULT_SITES) + ")"
    )
    ap.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="DIR",
        help="also count with DIR first on PYTHONPATH (DIR/gym_autoinstr: another copy of the package)",
    )
    ap.add_argument(
        "--calls", type=int, help=f"calls counted per site and variant (default {CALLS}; {OBJECT_CALLS} with --objects)"
    )
    ap.add_argument("--json", type=pathlib.Path, help="also write the counts here")
    ap.add_argument(
        "--objects",
        action="store_true",
        help="count GC-tracked objects alive when the app sends its response start (or, for "
        f"{', '.join(OBJECT_SITES_IN_CALL)}, inside the wrapped call), instead of instructions "
        f"(no valgrind; sites {', '.join(OBJECT_SITES)})",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and not argv[0].startswith("-"):
        _calls(argv[0], argv[1], int(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "--alive":
        _objects(argv[1], argv[2], int(argv[3]))
        return 0
    ap = parser()
    a = ap.parse_args(argv)
    for code in a.code:
        if not (pathlib.Path(code) / "gym_autoinstr" / "__init__.py").is_file():
            ap.error(f"--code {code}: no gym_autoinstr package in that directory")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from benchmarks.fleet import GYM_VERSION, use_bench_venvs
    from tests.harness.gym_install import gym_venv

    use_bench_venvs()
    venv = gym_venv(GYM_VERSION)
    wanted = [s.strip() for s in a.sites.split(",") if s.strip()] if a.sites else list(DEFAULT_SITES)
    unknown = [s for s in wanted if s not in SITES]
    if unknown:
        ap.error(f"--sites: unknown {', '.join(unknown)} (known: {', '.join(SITES)})")
    if a.objects:
        wanted = [s for s in wanted if s in OBJECT_SITES] if not a.sites else wanted
        if any(s not in OBJECT_SITES for s in wanted):
            ap.error(f"--objects: sites {', '.join(OBJECT_SITES)} only")
    sites = {s: SITES[s] for s in wanted}
    measure = run_objects if a.objects else run
    calls = a.calls if a.calls is not None else (OBJECT_CALLS if a.objects else CALLS)
    try:
        results = measure(
            venv / "bin" / "python", sites, [None, *[str(pathlib.Path(c).resolve()) for c in a.code]], calls
        )
    except RuntimeError as error:
        print(f"run-benchmarks --instructions: {error}", file=sys.stderr)
        return 1
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    print(report(results, "objects" if a.objects else "instructions"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
