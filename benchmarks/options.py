"""The command lines of ``./run-benchmarks`` and its modes, declared apart from the code
that runs them.

Standard library only (with ``variants.py``; ``instructions.py`` declares its own), so that
``./run-benchmarks [--mode] --help`` prints them with any Python 3, before the runner venv
is built: ``python3 -m benchmarks.options MODE --help``.  Each mode's ``main`` parses its
arguments with the parser made here.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

from benchmarks.variants import variants_help

HERE = pathlib.Path(__file__).resolve().parent


def _summary(module: str) -> str:
    """The first line of ``benchmarks/<module>.py``'s docstring, read without importing it."""
    return (ast.get_docstring(ast.parse((HERE / f"{module}.py").read_text())) or "").splitlines()[0]


def add_output_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", type=pathlib.Path, help="also write the raw results here")
    ap.add_argument("--report-from", type=pathlib.Path, help="print the report of a saved --json file and exit")


def run_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks``: the overhead ratios (``benchmarks/run.py``)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks", description=_summary("run"))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and rollouts (about 5 minutes)")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--burst", type=int, default=10000, help="requests per burst (two bursts per variant)")
    ap.add_argument("--parallel-starts", type=int, default=2, help="trios started at once")
    ap.add_argument(
        "--variants",
        help="comma-separated, besides bare (always run: the reference): " + variants_help(by_default=True),
    )
    ap.add_argument(
        "--together-windows",
        type=int,
        help="windows with bare, default and sampled out loaded together (default 8, --quick 4)",
    )
    ap.add_argument(
        "--trio-sets",
        type=int,
        default=1,
        help="stop every trio and start it afresh this many times over the run (the repetitions and "
        "together windows split evenly among the sets): the intervals then hold what stays fixed in "
        "a trio for its life; default 1",
    )
    ap.add_argument("--skip", action="append", default=[], choices=["micro", "together", "startup", "burst"])
    ap.add_argument(
        "--across",
        type=pathlib.Path,
        nargs="+",
        metavar="JSON",
        help="read several saved runs (--json) as one: each variant's overhead per run and pooled, "
        "and a dropped rollout's overhead in parts (span groups off; the dropped path); then exit",
    )
    ap.epilog = (
        "other modes (each has its own --help): --attribution (where the CPU of a rollout goes), "
        "--instructions (instructions per call of our hot paths), --trio-instructions (instructions per "
        "rollout of real trios under valgrind), --memory-over-time (each trio's processes' memory under "
        "one long load), --campaign (the query commands' time and memory over 10^4-10^6 traces)"
    )
    add_output_options(ap)
    return ap


def attribution_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --attribution`` (``benchmarks/attribution.py``)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks --attribution", description=_summary("attribution"))
    ap.add_argument("--quick", action="store_true", help="2 windows of 5 s per variant")
    ap.add_argument("--reps", type=int, help="windows per variant (default 4)")
    ap.add_argument("--seconds", type=float, help="length of a window (default 10 s)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--idle-seconds",
        type=float,
        help="length of the idle baseline, reported by thread "
        "(default 8 s, 4 with --quick; 60 to read per-second work such as the metric export)",
    )
    ap.add_argument(
        "--variants", default="default", help="besides bare, comma-separated (default: default): " + variants_help()
    )
    ap.add_argument(
        "--lever",
        action="append",
        default=[],
        metavar="LABEL[@BASE]:KEY=VALUE[,KEY=VALUE...]",
        help="one more variant: ours, default (or BASE: default, sampled, off), with these environment "
        "variables on top (repeatable), e.g. --lever 'no-metrics:OTEL_METRICS_EXPORTER=none' or "
        "--lever 'dropped-no-metrics@sampled:OTEL_METRICS_EXPORTER=none'",
    )
    ap.add_argument(
        "--together",
        action="store_true",
        help="load every variant at once in each window (the same machine conditions for all; see the module doc)",
    )
    ap.add_argument(
        "--py-spy",
        action="store_true",
        help="one more window per variant under py-spy (pip-installed into the runner venv if missing)",
    )
    ap.add_argument("--spy-rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--spy-dir", type=pathlib.Path, help="keep py-spy's raw stacks here (one file per server)")
    add_output_options(ap)
    return ap


def instructions_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --instructions``: declared in ``benchmarks/instructions.py``, beside
    the sites it names (that module, too, imports only the standard library at the top)."""
    from benchmarks.instructions import parser

    return parser()


def trio_instructions_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --trio-instructions`` (``benchmarks/trio_instructions.py``)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks --trio-instructions", description=_summary("trio_instructions"))
    ap.add_argument("--rollouts", type=int, default=100, help="rollouts per window (default 100)")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="closed-loop clients per window (default 1: each rollout alone, the same steps every time)",
    )
    ap.add_argument("--reps", type=int, default=3, help="windows per variant (default 3)")
    ap.add_argument("--idle-seconds", type=float, default=15.0, help="length of each idle window (default 15)")
    ap.add_argument(
        "--variants",
        default="default,sampled",
        help="comma-separated, besides bare: off, default, sampled, per_rollout, all (default: default,sampled)",
    )
    ap.add_argument(
        "--by-function",
        type=int,
        default=0,
        metavar="N",
        help="also count by Python function (servers run with -X perf) and list the N functions of "
        "gym_autoinstr and OpenTelemetry whose instructions per rollout differ most from span "
        "groups off (or bare)",
    )
    ap.add_argument(
        "--cache-sim",
        action="store_true",
        help="also simulate the caches (callgrind --cache-sim=yes) and report first- and last-level "
        "misses per rollout beside the instructions; slower",
    )
    add_output_options(ap)
    return ap


def memory_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --memory-over-time`` (``benchmarks/memory.py``)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks --memory-over-time", description=_summary("memory"))
    ap.add_argument("--quick", action="store_true", help="60 s of load, RSS every 2 s (a smoke run)")
    ap.add_argument(
        "--seconds", type=float, help="length of the load, every trio at once (default 600; 60 with --quick)"
    )
    ap.add_argument("--interval", type=float, help="seconds between two RSS samples (default 5; 2 with --quick)")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop clients per trio (default 32)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of load per trio before sampling (default 10)")
    ap.add_argument(
        "--variants",
        default="default,files",
        help="comma-separated, besides bare (default: default,files): " + variants_help(),
    )
    ap.add_argument("--parallel-starts", type=int, default=2, help="trios started at once")
    add_output_options(ap)
    return ap


def campaign_parser() -> argparse.ArgumentParser:
    """``./run-benchmarks --campaign`` (``benchmarks/campaign.py``)."""
    ap = argparse.ArgumentParser(prog="run-benchmarks --campaign", description=_summary("campaign"))
    ap.add_argument(
        "--traces",
        default="10000,100000,1000000",
        help="comma-separated campaign sizes, in traces (default 10000,100000,1000000)",
    )
    ap.add_argument(
        "--runs",
        type=int,
        help="run directories per campaign (default by size: 3 for 10^4, 10 for 10^5, 30 for 10^6; "
        "one per 33,000 traces otherwise)",
    )
    ap.add_argument("--reps", type=int, default=1, help="times each later read is timed (the median shown; default 1)")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="also time every command with an empty cache (by default only the first view reads with one)",
    )
    ap.add_argument("--generate-only", action="store_true", help="build and check the campaigns (cached), time nothing")
    ap.add_argument("--gzip-level", type=int, default=6, help="of the generated segments (default 6, as the writer)")
    ap.add_argument("--workers", type=int, help="processes generating a campaign (default: one per CPU)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a command may take (default 3600)")
    ap.add_argument(
        "--max-memory-gb",
        type=float,
        help="stop a command whose process tree holds more than this (default 3/4 of the machine's memory)",
    )
    ap.add_argument(
        "--output", type=pathlib.Path, help="the JSON results (default .cache/benchmarks/campaign-<time>.json)"
    )
    ap.add_argument("--report-from", type=pathlib.Path, help="print the report of a saved --output file and exit")
    return ap


PARSERS = {
    "run": run_parser,
    "attribution": attribution_parser,
    "instructions": instructions_parser,
    "trio_instructions": trio_instructions_parser,
    "memory": memory_parser,
    "campaign": campaign_parser,
}


if __name__ == "__main__":  # python3 -m benchmarks.options MODE ARGS...: parse (--help prints and exits)
    PARSERS[sys.argv[1]]().parse_args(sys.argv[2:])
