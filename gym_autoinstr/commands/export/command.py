"""The ``export`` command: its options (``add_parser``, called by ``cli``) and ``main``.

The rows come from the ``runs`` table (``store.load``): a rollout's row needs no span read,
so a million of them are written in the time the table takes to load plus the writing.
``--spans`` reads the chosen traces' span files again, one at a time.  An existing file is
replaced only with ``--force`` (a table someone else wrote, or last week's, is not lost to
a command repeated from the shell history); either way it is replaced whole, by a rename."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gym_autoinstr.commands.view.where import WhereError, fields_text, parse_where

PROG = "gym-autoinstr export"
SCORE_TARGETS = ("phoenix", "mlflow")


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``export`` subcommand and its options, on ``cli``'s subparsers."""
    export = commands.add_parser(
        "export",
        help="write every rollout (or span) of runs as a table: Parquet, CSV, JSONL; or rewards as UI scores",
        description="Write a row per rollout of the runs given (run directories, campaign folders of them, span\n"
        "files) to a Parquet, CSV or JSONL file, for pandas, DuckDB or a spreadsheet: trace and job ids, task and\n"
        "repeat (they join Gym's own output rows: _ng_task_index, _ng_rollout_index), reward, masked, failure,\n"
        "tokens, duration and the time in model/tools/verify, start, services, rollout id, root span id, model\n"
        "and agent. docs/export.md lists the columns and shows queries. --to phoenix / mlflow sends the rewards\n"
        "to that UI as its own scores instead.",
        epilog="examples:\n"
        "  gym-autoinstr export RUN --to rollouts.parquet\n"
        "  gym-autoinstr export CAMPAIGN --job 3f2a --where 'reward==0' --to failed.csv\n"
        "  gym-autoinstr export RUN --spans --where 'duration>30s' --to slow-spans.jsonl.gz\n"
        "  gym-autoinstr export RUN --to phoenix=http://localhost:6006",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("paths", nargs="+", metavar="RUN", help="run directory, campaign folder, span file, or -")
    export.add_argument(
        "--to",
        required=True,
        metavar="FILE|UI",
        help="FILE ending .parquet (needs pyarrow), .csv, .jsonl (.csv.gz, .jsonl.gz: gzipped); or phoenix[=URL] "
        "or mlflow[=TRACKING_URI]: the rewards as that UI's scores",
    )
    export.add_argument(
        "--spans",
        action="store_true",
        help="a row per span instead (ids, parent, name, kind, service, times, status, attributes as JSON, and "
        "its trace's run, job, task and repeat): reads the chosen traces' span files again, one at a time, so "
        "memory stays bounded, but it is slow at scale: about a minute per million spans",
    )
    export.add_argument(
        "--all-traces",
        action="store_true",
        help="start-up traces (processes starting) and each job's own gym.job trace too, not only rollouts "
        "(the trace_kind column tells them apart)",
    )
    export.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="ID",
        help="only this collection job's rollouts (nemo.gym.job.id, or a unique prefix; repeatable)",
    )
    export.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help="only rollouts where FIELD OP NUMBER holds, as view's --where (repeatable: all must hold); "
        f"fields: {fields_text()}",
    )
    export.add_argument("--force", action="store_true", help="replace FILE if it exists")
    return export


def run(args: argparse.Namespace) -> int:
    """``main`` with the options ``add_parser`` declared."""
    return main(
        args.paths,
        to=args.to,
        spans=args.spans,
        all_traces=args.all_traces,
        jobs=args.job,
        where=args.where,
        force=args.force,
    )


def _refuse(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def _target(to: str) -> tuple[str, str | None] | None:
    """``(UI, address)`` for a scores target (``phoenix``, ``mlflow=URI``); None for a file."""
    name, equals, address = to.partition("=")
    if name.lower() in SCORE_TARGETS and (equals or name == to):
        return name.lower(), (address or None)
    return None


def _file_problem(to: str, force: bool) -> str | None:
    from gym_autoinstr.commands.export import formats

    if Path(to).is_dir():
        return f"--to {to}: is a directory; give a file name in it ({to.rstrip('/')}/rollouts.parquet)"
    kind = formats.format_of(to)
    if kind is None:
        endings = ", ".join(formats.FORMATS)
        return (
            f"--to {to}: the file's name says no format; end it with one of {endings} "
            f"(or give {' or '.join(SCORE_TARGETS)} to send the rewards as scores)"
        )
    if kind == "parquet" and (missing := formats.parquet_missing()):
        return f"--to {to}: {missing}"
    path = Path(to)
    if not path.parent.is_dir():
        return f"--to {to}: no directory {path.parent} to write it in; create it first (mkdir -p {path.parent})"
    if path.exists() and not force:
        return f"--to {to}: exists; give --force to replace it, or another name"
    return None


def _jobs(wanted: Sequence[str], known: set[str]) -> tuple[set[str], str | None]:
    """The job ids ``wanted`` names (each exactly or by a unique prefix), or why not."""
    chosen: set[str] = set()
    for text in wanted:
        if text in known:
            chosen.add(text)
            continue
        matching = sorted(job for job in known if job.startswith(text))
        if len(matching) == 1:
            chosen.add(matching[0])
            continue
        if matching:
            return chosen, f"--job {text} matches {len(matching)} jobs; give more of the id: {', '.join(matching)}"
        listed = ", ".join(sorted(known)[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        where = f"the jobs here: {listed}" if known else "no trace here belongs to a collection job"
        return chosen, f"--job {text}: no such job in the runs given; {where}"
    return chosen, None


def main(
    paths: Sequence[str],
    *,
    to: str,
    spans: bool = False,
    all_traces: bool = False,
    jobs: Sequence[str] = (),
    where: Sequence[str] = (),
    force: bool = False,
) -> int:
    from gym_autoinstr.commands.export import columns, formats
    from gym_autoinstr.commands.runs import store
    from gym_autoinstr.commands.view.command import _nothing_found

    target = _target(to)
    if target and spans:
        return _refuse(f"--to {to} sends rollouts' rewards as scores; --spans writes a file: give --to FILE")
    if not target and (problem := _file_problem(to, force)):
        return _refuse(problem)
    try:
        conditions = [parse_where(text) for text in where]
    except WhereError as error:
        return _refuse(str(error))
    for path in paths:
        if str(path) != "-" and not Path(path).exists():
            return _refuse(f"{path}: no such file or directory")

    campaign = store.load(paths)
    if not campaign.rollouts:
        print(f"{PROG}: {_nothing_found(paths, campaign, False)}", file=sys.stderr)
        return 1
    job_ids, problem = _jobs(jobs, {r.job_id for r in campaign.rollouts if r.job_id is not None})
    if problem:
        return _refuse(problem)
    chosen = [
        r
        for r in campaign.rollouts
        if (all_traces or r.is_rollout)
        and (not job_ids or r.job_id in job_ids)
        and all(condition.matches(r) for condition in conditions)
    ]
    what = "traces" if all_traces else "rollouts"
    if not chosen:
        filters = " matching the filters" if (job_ids or conditions) else ""
        print(
            f"{PROG}: no {what}{filters} among the {len(campaign.rollouts)} traces read; nothing written",
            file=sys.stderr,
        )
        return 1

    if target:
        from gym_autoinstr.commands.export import scores  # its own messages, its exit code

        return scores.send(*target, chosen)
    path = Path(to)
    try:
        if spans:
            written = formats.write(path, columns.SPAN_COLUMNS, columns.span_records(campaign, chosen))
            detail = f"{written} spans of {len(chosen)} {what}"
        else:
            written = formats.write(path, columns.ROLLOUT_COLUMNS, map(columns.rollout_record, chosen))
            detail = f"{written} {what}"
    except OSError as error:  # a full disk, a directory not ours: the old file, if any, is as it was
        print(
            f"{PROG}: --to {to}: {error.strerror or error}; nothing written: give a file you can write", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; {to} not written", file=sys.stderr)
        return 130
    print(f"wrote {detail} to {to} ({_size(path.stat().st_size)})")
    return 0


def _size(size: int) -> str:
    if size < 1000:
        return f"{size} bytes"
    return f"{size / 1e3:.1f} KB" if size < 1_000_000 else f"{size / 1e6:.1f} MB"
