"""The ``view`` command: its options (``add_parser``, called by ``cli``) and ``main``."""

from __future__ import annotations

import argparse
import gc
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from gym_autoinstr.commands.view.filters import SORTS, AmbiguousTrace, Unmatched, parse_attribute_filter, select
from gym_autoinstr.commands.view.model import Job, Trace, build_traces, display_name, group_by_job
from gym_autoinstr.commands.view.overview import SHOWN, SHOWS, overview
from gym_autoinstr.commands.view.page import DEFAULT_MAX_DETAIL, detail_for_page, render_html
from gym_autoinstr.commands.view.tasks import by_task, task_lines
from gym_autoinstr.commands.view.text import (
    UNLIMITED,
    clock,
    count,
    cut,
    job_line,
    render_list,
    render_text,
    trace_record,
)
from gym_autoinstr.commands.view.where import WhereError, fields_text, parse_where
from gym_autoinstr.setup.segments import DEFAULT_PARENT

NO_TASKS = (
    "no rollout trace here carries a task index (nemo.gym.task.index: set on the rollouts Gym's collection "
    "driver sends, ng_collect_rollouts run under opentelemetry-instrument)"
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of traces, 1 or more, not {text!r}")
    return value


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``view`` subcommand and its options, on ``cli``'s subparsers."""
    view = commands.add_parser(
        "view",
        help="show traces as waterfalls in the terminal, or as one HTML page",
        description="Read a run directory written by the embedded default (or OTLP-JSON files, or - for "
        "standard input) and join every process's spans by trace. Lists the traces, one line each (start-up "
        "traces apart); --trace or --rollout draws that trace as a waterfall. Lines fit the terminal. The "
        "directory of a gym eval submit brings its Slurm jobs' traces too, where this machine has them.",
    )
    view.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help=f"run directory, a folder of runs, a file, or - (default: the newest run under ./{DEFAULT_PARENT})",
    )
    view.add_argument("--trace", metavar="ID", help="draw the trace whose id starts with ID (any unique prefix)")
    view.add_argument("--rollout", metavar="ID", help="draw the trace of this rollout id")
    view.add_argument(
        "--slowest",
        type=_positive,
        metavar="N",
        help="only the N slowest rollout traces, slowest first (start-up and job traces aside)",
    )
    view.add_argument(
        "--sort",
        choices=tuple(SORTS),
        default="start",
        help="list order: start (earliest first, the default), duration (longest first), reward (lowest first: "
        "the worst on top), tokens (most first), task (task index, then repeat); traces without the value last",
    )
    view.add_argument("--reverse", action="store_true", help="turn the --sort order round (--sort reward: best first)")
    view.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help="only traces where FIELD OP NUMBER holds, e.g. 'reward<0.5' or 'duration>=2s' (repeatable: all must "
        f"hold; a trace without the field does not match); operators < <= > >= == !=; fields: {fields_text()}",
    )
    view.add_argument(
        "--by-task",
        action="store_true",
        help="instead of the list, a line per task index of a collection run: rollouts, mean reward (masked "
        "samples apart), p50/p95 duration, failures (traces with an error); with --json, as JSON",
    )
    view.add_argument(
        "--service",
        metavar="NAME",
        help="only traces with a span of this service: its name (nemo-gym/policy_model), its short name "
        "(policy_model) or a part of one service's short name (model)",
    )
    view.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only traces with a span or resource attribute KEY equal to VALUE (repeatable)",
    )
    view.add_argument("--status", choices=("ok", "error"), help="only traces without / with an error")
    view.add_argument("--errors", action="store_true", help="only traces with an error (same as --status error)")
    view.add_argument(
        "--show",
        choices=tuple(SHOWS),
        default="slowest",
        help=f"on a terminal, a run larger than a screen is summed up (rollouts, failures, reward, p50/p95/p99 "
        f"duration, where the time went, a line per run) above the {SHOWN} rollouts this picks: slowest (the "
        "default), failed (newest first), worst (lowest reward first), newest",
    )
    view.add_argument(
        "--all", action="store_true", help="list every trace, even on a terminal and for a run larger than a screen"
    )
    view.add_argument(
        "--summary", action="store_true", help="the summary and the rows --show picks, even when piped or small"
    )
    view.add_argument("--json", action="store_true", help="print the list (or the chosen trace's spans) as JSON")
    view.add_argument("--html", metavar="FILE", help="write one self-contained HTML page instead")
    view.add_argument(
        "--html-max-traces",
        type=_positive,
        default=None,
        metavar="N",
        help="draw at most N traces on the page (errors and the slowest first; every trace is listed; default "
        "800, about 20 MB at most)",
    )
    view.add_argument(
        "--follow",
        action="store_true",
        help="follow the run directory live while its processes write: rollouts done and failed, the rate, "
        "each job's progress and ETA, reward so far (worst tasks), p50/p95 duration and where the time goes, "
        "spans lost, the newest failures; redrawn in place in a terminal, a status line per change when piped; "
        "stops when the run's processes have exited, at --timeout or on Ctrl-C, with a final summary",
    )
    view.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="with --follow: stop after this many seconds (with the final summary)",
    )
    view.add_argument(
        "--metrics",
        action="store_true",
        help="print a per-server 'why is it slow' summary from the run's metrics instead of traces",
    )
    return view


def run(args: argparse.Namespace) -> int:
    """``main`` with the options ``add_parser`` declared."""
    if args.follow:
        from gym_autoinstr.commands.view import live

        return live.main(args.paths, timeout=args.timeout)
    return main(
        args.paths,
        rollout=args.rollout,
        slowest=args.slowest,
        errors=args.errors,
        html_file=args.html,
        metrics=args.metrics,
        trace_id=args.trace,
        service_name=args.service,
        attributes=args.attr,
        status=args.status,
        sort=args.sort,
        reverse=args.reverse,
        where=args.where,
        per_task=args.by_task,
        as_json=args.json,
        show=args.show,
        every=args.all,
        summed=args.summary,
        **({"max_detail": args.html_max_traces} if args.html_max_traces else {}),
    )


def _terminal_width() -> int | None:
    """The columns to fit: ``COLUMNS``, else the terminal's width when standard output is
    one, else the terminal standard error is on (``view | head``, ``view | grep``: the
    lines still end up there); None when there is no terminal at all (a file, a script
    reading the output): nothing is cut."""
    import os
    import shutil
    import sys

    def is_terminal(stream) -> bool:
        try:
            return stream is not None and stream.isatty()
        except (OSError, ValueError):
            return False

    try:
        if os.environ.get("COLUMNS", "").strip().isdigit() or is_terminal(sys.stdout):
            return max(shutil.get_terminal_size((120, 24)).columns, 40)
        if is_terminal(sys.stderr):
            return max(os.get_terminal_size(sys.stderr.fileno()).columns, 40)
    except (OSError, ValueError):
        pass
    return None


def _write(lines: Iterable[str]) -> int:
    """Write to standard output; a reader that went away (``view | head``) ends the command
    quietly with 141 (128 + SIGPIPE), the shell's code for it."""
    import os
    import sys

    try:
        out = sys.stdout
        for line in lines:
            out.write(line + "\n")
        out.flush()
    except BrokenPipeError:
        try:  # the interpreter's own flush at exit must not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    return 0


def with_submitted_jobs(paths: Sequence[str]) -> list[str]:
    """``paths``, and the trace directories of the Slurm jobs submitted from them (the notes a
    ``gym eval submit`` leaves beside its own files: ``setup/runs.py``) that are on this
    machine and not among them already; where one is not, one line says where it is."""
    import sys
    from pathlib import Path

    from gym_autoinstr.setup.runs import submitted_jobs

    given = [Path(path).resolve() for path in paths if str(path) != "-"]
    result = [str(path) for path in paths]
    for path in given:
        for job in submitted_jobs(path):
            traces = Path(job["traces"])
            job_id = job.get("slurm_job_id") or "?"
            name = f"Slurm job {job_id} ({job.get('benchmark')}, submission {job['submission']})"
            if not traces.is_dir():
                host = job.get("hostname")
                where = (
                    f"on {host}: view them there, or copy them here and view both (gym-autoinstr view {path} <copy>)"
                    if host
                    else f"there yet: has the job started? (squeue -j {job_id})"
                )
                print(f"gym-autoinstr view: {name} writes its traces to {traces}, not {where}", file=sys.stderr)
                continue
            resolved = traces.resolve()
            if any(resolved == other or other in resolved.parents for other in given) or str(traces) in result:
                continue
            result.append(str(traces))
            print(f"gym-autoinstr view: reading {name} too, submitted from {path}: {traces}", file=sys.stderr)
    return result


def main(
    paths: Sequence[str],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    html_file: str | None = None,
    metrics: bool = False,
    trace_id: str | None = None,
    service_name: str | None = None,
    attributes: Sequence[str] = (),
    status: str | None = None,
    sort: str = "start",
    reverse: bool = False,
    where: Sequence[str] = (),
    per_task: bool = False,
    as_json: bool = False,
    max_detail: int = DEFAULT_MAX_DETAIL,
    show: str = "slowest",
    every: bool = False,
    summed: bool = False,
) -> int:
    import sys
    from pathlib import Path

    from gym_autoinstr.commands import slow
    from gym_autoinstr.commands.runs import store
    from gym_autoinstr.commands.runs.facts import TAG_KEYS

    if not paths:
        newest = newest_run()
        if newest is None:
            print(
                f"gym-autoinstr view: no run here (no ./{DEFAULT_PARENT}/<run id>/); give a run directory: "
                f"gym-autoinstr view {DEFAULT_PARENT}/<run id>, or . for every run below this folder",
                file=sys.stderr,
            )
            return 2
        print(f"gym-autoinstr view: the newest run, {newest} (another: gym-autoinstr view PATH)", file=sys.stderr)
        paths = [str(newest)]
    paths = list(paths)
    if metrics:
        text = slow.render_text(slow.summary_for(with_submitted_jobs(paths)))
        if not text:
            print(
                f"gym-autoinstr view: no metrics (*.metrics.jsonl) in {', '.join(paths)}: they are written beside the "
                "spans when spans go to files (no endpoint); to the OTLP endpoint if one is set "
                "(OTEL_METRICS_EXPORTER=otlp,files keeps a copy here too)",
                file=sys.stderr,
            )
            return 1
        return _write([text])

    try:
        attribute_filters = [parse_attribute_filter(text) for text in attributes]
    except ValueError as error:
        print(f"gym-autoinstr view: --attr: {error}", file=sys.stderr)
        return 2
    try:
        conditions = [parse_where(text) for text in where]
    except WhereError as error:
        print(f"gym-autoinstr view: {error}", file=sys.stderr)
        return 2
    if sort != "start" and slowest is not None:
        print(
            f"gym-autoinstr view: --slowest ranks by duration, --sort {sort} orders by {sort}: give one of them "
            f"(--sort {sort} --where ... to narrow, or --slowest N alone)",
            file=sys.stderr,
        )
        return 2
    for path in paths:
        if str(path) != "-" and not Path(path).exists():
            print(f"gym-autoinstr view: {path}: no such file or directory", file=sys.stderr)
            return 2
    paths = with_submitted_jobs(paths)  # a Slurm submission's directory: its jobs' files too
    campaign = store.load(paths, trace=trace_id)  # --trace: the runs holding it alone
    everything: Sequence = campaign.rollouts
    if any(key not in TAG_KEYS for key, _value in attribute_filters):
        everything = _with_spans(campaign, everything)  # an attribute the table does not keep: every span
    filtered = bool(rollout or slowest or errors or trace_id or service_name or attribute_filters or status or where)
    try:
        traces = select(
            everything,
            rollout=rollout,
            slowest=slowest,
            errors=errors,
            trace_id=trace_id,
            service_name=service_name,
            attributes=attribute_filters,
            status=status,
            where=conditions,
            sort=sort,
            reverse=reverse,
        )
    except AmbiguousTrace as ambiguous:
        shown = ambiguous.candidates[:10]
        print(
            f"gym-autoinstr view: --trace {ambiguous.prefix} matches {len(ambiguous.candidates)} traces; "
            "give more of the id:",
            file=sys.stderr,
        )
        for trace in shown:
            print(f"  {trace.trace_id}  {clock(trace.start_ns)}  {display_name(trace.root)}", file=sys.stderr)
        if len(ambiguous.candidates) > len(shown):
            print(f"  … and {len(ambiguous.candidates) - len(shown)} more", file=sys.stderr)
        return 1
    except Unmatched as unmatched:
        print(f"gym-autoinstr view: {unmatched}", file=sys.stderr)
        return 1
    lost = lost_line(paths)
    if not traces:
        if lost:
            print(f"gym-autoinstr view: {lost}", file=sys.stderr)
        print(_nothing_found(paths, campaign, filtered), file=sys.stderr)
        return 1
    if html_file:
        drawn = _with_spans(campaign, detail_for_page(traces, max_detail))
        hint = (
            "To see another one: gym-autoinstr view RUN --trace ID (a prefix is enough) in the terminal, "
            "or with --html FILE for a page of it; --html-max-traces N draws more."
        )
        items = group_by_job(drawn, everything)
        drawn = [t for item in items for t in (item.traces if isinstance(item, Job) else [item])]
        page = render_html(items, index=traces, hint=hint)
        why_slow = slow.render_html(slow.summary_for([p for p in paths if p != "-"]))
        if why_slow:
            page = page.replace("<script>", why_slow + "<script>", 1)
        if lost:  # under the title, as the terminal's first line
            import html

            page = page.replace("</h1>", f'</h1><p class="lost"><b>{html.escape(lost)}</b></p>', 1)
        try:
            Path(html_file).write_text(page, encoding="utf-8")
        except OSError as error:
            why = f"{error.strerror or error}; nothing written: give a file you can write"
            print(f"gym-autoinstr view: --html {html_file}: {why}", file=sys.stderr)
            return 1
        more = f" ({len(drawn)} drawn, every one listed)" if len(drawn) < len(traces) else ""
        print(f"wrote {count(len(traces), 'trace')} to {html_file}{more}")
        return 0
    if per_task:
        summary = by_task(traces)
        if summary.overall is None:
            print(f"gym-autoinstr view: {NO_TASKS}", file=sys.stderr)
            return 1
        if as_json:
            return _write([json.dumps({**summary.record(), **({"lost": lost} if lost else {})})])
        return _write(([lost] if lost else []) + task_lines(summary, _terminal_width() or UNLIMITED))
    waterfall = trace_id is not None or rollout is not None
    if waterfall:
        traces = _with_spans(campaign, traces)
    if as_json:
        records = [trace_record(t, with_spans=waterfall) for t in traces]
        document = {"traces": records, **({"lost": lost} if lost else {})}
        return _write([json.dumps(document, indent=None if not waterfall else 1, default=str)])
    width = _terminal_width()
    overview_fits = slowest is None and sort == "start" and not reverse  # (an order asked for: the list in it)
    if summed or (not every and overview_fits and len(traces) > SCREEN and _on_terminal()):
        return _write(overview(traces, campaign.runs, show, width or UNLIMITED, lost))
    if waterfall:
        blocks = []
        for item in group_by_job(traces, everything):
            if isinstance(item, Job):
                blocks.append(cut(job_line(item), width or UNLIMITED))
                blocks.extend(render_text(t, width=width) for t in item.traces)
            else:
                blocks.append(render_text(item, width=width))
        return _write(([lost] if lost else []) + ["\n\n".join(blocks)])
    keep_order = slowest is not None or sort != "start" or reverse
    startup = [t for t in traces if t.is_startup]
    rest = [t for t in traces if not t.is_startup]
    items: Sequence[Job | Trace] = rest if keep_order else group_by_job(rest, everything)
    return _write(([cut(lost, width or UNLIMITED)] if lost else []) + render_list(items, startup, width or UNLIMITED))


def newest_run() -> Path | None:
    """The run directory under ``./gym-autoinstr-runs`` written to last (None: none there)."""
    try:
        runs = [p for p in Path(DEFAULT_PARENT).iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return None

    def written(run: Path) -> float:
        try:
            return max([f.stat().st_mtime for f in run.iterdir()] + [run.stat().st_mtime])
        except OSError:
            return 0.0

    return max(runs, key=written, default=None)


def _nothing_found(paths: Sequence[str], campaign, filtered: bool) -> str:
    """What was read, and the likely reason nothing is listed."""
    files = sum(len(source.files) for source in campaign.sources)
    read = ", ".join(str(p) for p in paths)
    if filtered and campaign.rollouts:
        return (
            f"no traces found matching the filters, of the {len(campaign.rollouts)} read in {read}: "
            "loosen them (--rollout, --trace, --errors, --where, --attr, --service, --status), "
            "or leave them out to list every trace"
        )
    if list(paths) == ["-"]:
        return (
            "no traces found: no spans on standard input; pipe a span file's lines "
            "(OTLP-JSON, one request a line), e.g. zcat RUN/*.jsonl.gz | gym-autoinstr view -"
        )
    if files:
        return (
            f"no traces found: {files} span files in {read} hold no span (an empty or cut-short run, "
            "or files that are not OTLP-JSON lines)"
        )
    return (
        f"no traces found: no span files (*.jsonl, *.jsonl.gz) in {read}. Is it a run directory "
        f"(./{DEFAULT_PARENT}/<run id>)? With an OTLP endpoint configured, spans went there, not to files; "
        "gym-autoinstr doctor says where this environment sends them"
    )


SCREEN = 40  # more traces than this on a terminal: the summary and the rows that matter (``overview``)


def _on_terminal() -> bool:
    import sys

    try:
        return sys.stdout.isatty()
    except (OSError, ValueError):
        return False


def _with_spans(campaign, chosen: Sequence) -> list[Trace]:
    """``chosen`` (table rows, or traces already) as ``Trace`` objects with their spans, in
    their order; their spans read from the files holding them alone."""
    if all(isinstance(t, Trace) for t in chosen):
        return list(chosen)
    collecting = gc.isenabled()
    gc.disable()  # many span dicts, no cycles among them: the collector would walk them again and again
    try:
        built = {t.trace_id: t for t in build_traces(campaign.spans_of(chosen))}
    finally:
        if collecting:
            gc.enable()
    return [built[t.trace_id] for t in chosen if t.trace_id in built]


def lost_line(paths: Sequence[str]) -> str | None:
    """ "N spans of M lost: ..." from the process notes of the run directories read, or None
    when nothing was lost (or nothing says: OTLP-JSON files without notes)."""
    from pathlib import Path

    from gym_autoinstr import losses
    from gym_autoinstr.setup.notes import process_notes

    found = [note for path in paths if str(path) != "-" and Path(path).is_dir() for note in process_notes(Path(path))]
    return losses.describe(found)
