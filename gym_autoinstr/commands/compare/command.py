"""The ``compare`` command: its options (``add_parser``, called by ``cli``) and ``main``.

Each side is read with ``runs.store`` (the per-rollout table, never the spans: two runs of
a million-trace campaign compare in seconds once read), optionally narrowed to one
collection job (``nemo.gym.job.id``, any unique prefix), and compared by ``comparison``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence

USAGE_HINT = "give A B (two paths), A... --vs B... (groups of paths), or RUN --jobs A_JOB B_JOB"


class SideError(ValueError):
    """A side that cannot be read as asked: the message says why and what to do."""


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``compare`` subcommand and its options, on ``cli``'s subparsers."""
    compare = commands.add_parser(
        "compare",
        help="compare two runs (or groups of runs, or two jobs of one run): reward, failures, time, tokens",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare side A with side B, per task (nemo.gym.task.index) and overall: rollouts, mean\n"
        "reward (masked samples apart) and its change B-A with a 95% interval, failure rate, p50/p95\n"
        "duration, p50 time in the model, tools and verify, tokens per rollout; the changes that matter\n"
        "are marked. Reads the per-rollout table alone (no spans), cached after the first read.\n\n"
        "sides:\n"
        "  compare A B                      two paths (run directories, or folders of runs)\n"
        "  compare A1 A2 --vs B1 B2         groups of paths: those before --vs are A, after it B\n"
        "  compare RUN --jobs JOB_A JOB_B   two collection jobs of the same paths (a unique id prefix will do)\n"
        "  compare A --vs B --jobs JA JB    A's job JA against B's job JB\n\n"
        "statistics:\n"
        "  reward, per task: Newcombe's hybrid score interval (from two Wilson intervals) when every reward is\n"
        "    0 or 1 (pass rates), else Welch's t interval; overall: paired by task, the mean of the per-task\n"
        "    changes ± t(0.975, T-1)·sd/sqrt(T) over the T tasks both sides scored (Miller 2024,\n"
        "    arXiv:2411.00640), and the unpaired means; better/worse: the interval excludes 0\n"
        "  failure rate: Newcombe's interval; more/fewer failures likewise\n"
        "  duration and each seam: slower/faster when the p50 moved by more than 10% and the Mann-Whitney U\n"
        "    test (normal approximation) gives p < 0.01\n"
        "  tokens: Welch's interval on tokens (in + out) per rollout; more/fewer tokens likewise\n"
        "Tasks on one side alone are listed apart; rollouts without a task index count overall only.\n"
        "More in docs/compare.md.",
    )
    compare.add_argument("paths", nargs="+", metavar="PATH", help="side A's paths (with --vs), or A and B")
    compare.add_argument("--vs", nargs="+", metavar="PATH", default=None, help="side B's paths")
    compare.add_argument(
        "--jobs",
        nargs=2,
        metavar=("JOB_A", "JOB_B"),
        help="compare these two collection jobs (nemo.gym.job.id, or a unique prefix of it)",
    )
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.add_argument("--html", metavar="FILE", help="also write one self-contained HTML page with its charts")
    return compare


def run(args: argparse.Namespace) -> int:
    """``main`` with the options ``add_parser`` declared."""
    return main(args.paths, args.vs, jobs=args.jobs, as_json=args.json, html_file=args.html)


def _sides(paths: Sequence[str], vs: Sequence[str] | None, jobs: Sequence[str] | None) -> tuple[list, list]:
    """A's paths and B's paths, as the options say."""
    if vs:
        return list(paths), list(vs)
    if jobs:
        return list(paths), list(paths)
    if len(paths) != 2:
        raise SideError(f"{len(paths)} paths given and no --vs: {USAGE_HINT}")
    return [paths[0]], [paths[1]]


def job_rollouts(rollouts: Sequence, wanted: str, where: str) -> tuple[list, str]:
    """The traces of the job whose id is ``wanted`` or starts with it, and its id."""
    of_job: dict[str, list] = {}
    for rollout in rollouts:
        job = rollout.job_id
        if job is not None:
            of_job.setdefault(job, []).append(rollout)
    matches = [job for job in of_job if job == wanted] or [job for job in of_job if job.startswith(wanted)]
    if len(matches) == 1:
        return of_job[matches[0]], matches[0]
    counts = Counter({job: sum(1 for r in traces if r.is_rollout) for job, traces in of_job.items()})

    def listed(ids: Sequence[str]) -> str:
        shown = sorted(ids, key=lambda job: -counts[job])[:10]
        more = f", … and {len(ids) - len(shown)} more" if len(ids) > len(shown) else ""
        return ", ".join(f"{job} ({counts[job]} rollouts)" for job in shown) + more

    if matches:
        raise SideError(
            f"job {wanted!r} matches {len(matches)} jobs in {where}; give more of the id: {listed(matches)}"
        )
    found = f"its jobs: {listed(list(of_job))}" if of_job else "no rollout there carries a job id (nemo.gym.job.id)"
    raise SideError(f"no job {wanted!r} in {where}; {found}")


def main(
    paths: Sequence[str],
    vs: Sequence[str] | None = None,
    *,
    jobs: Sequence[str] | None = None,
    as_json: bool = False,
    html_file: str | None = None,
) -> int:
    from pathlib import Path

    from gym_autoinstr.commands.compare import comparison, text
    from gym_autoinstr.commands.runs import store
    from gym_autoinstr.commands.view.command import _nothing_found, _terminal_width, _write
    from gym_autoinstr.commands.view.text import UNLIMITED, count

    try:
        a_paths, b_paths = _sides(paths, vs, jobs)
        for path in (*a_paths, *b_paths):
            if not Path(path).exists():
                raise SideError(f"{path}: no such file or directory")
        if html_file and not Path(html_file).absolute().parent.is_dir():
            raise SideError(f"--html {html_file}: no directory {Path(html_file).parent} to write it in; create it")
        loaded: dict = {}  # paths -> their campaign (store.load)
        sides = {}
        for side, side_paths, job in (("A", a_paths, jobs and jobs[0]), ("B", b_paths, jobs and jobs[1])):
            key = tuple(side_paths)
            if key not in loaded:
                loaded[key] = store.load(side_paths)
            where = " ".join(side_paths)
            if job:
                rollouts, job = job_rollouts(loaded[key].rollouts, job, where)
            else:
                rollouts = loaded[key].rollouts  # (``comparison`` reads the rollouts among them alone)
            sides[side] = {"paths": list(side_paths), "job": job or None, "rollouts": rollouts}
    except SideError as error:
        print(f"gym-autoinstr compare: {error}", file=sys.stderr)
        return 2
    record, every_a, every_b = comparison.compared(sides["A"]["rollouts"], sides["B"]["rollouts"])
    names = {}
    for side, every, only in (("A", every_a, record["only_a"]), ("B", every_b, record["only_b"])):
        found = sides[side]
        job = f" (job {found['job']})" if found["job"] else ""
        if not every.rollouts:
            read = f"{len(found['rollouts'])} traces read, none a rollout" if found["rollouts"] else ""
            why = read or _nothing_found(found["paths"], loaded[tuple(found["paths"])], False)
            print(f"gym-autoinstr compare: side {side} ({' '.join(found['paths'])}{job}): {why}", file=sys.stderr)
            return 1
        tasks = count(len(record["tasks"]) + len(only), "task")
        names[side] = f"{' '.join(found['paths'])}{job}: {count(every.rollouts, 'rollout')}, {tasks}"
    described = {
        "a": {"paths": sides["A"]["paths"], "job_id": sides["A"]["job"]},
        "b": {"paths": sides["B"]["paths"], "job_id": sides["B"]["job"]},
    }
    if html_file:
        from gym_autoinstr.commands.compare import page

        try:
            Path(html_file).write_text(page.render(record, names, every_a, every_b), encoding="utf-8")
        except OSError as error:
            why = f"{error.strerror or error}; nothing written: give a file you can write"
            print(f"gym-autoinstr compare: --html {html_file}: {why}", file=sys.stderr)
            return 1
        print(f"wrote the comparison to {html_file}", file=sys.stderr if as_json else sys.stdout)
        if not as_json:
            return 0
    if as_json:
        return _write([json.dumps({"sides": described, **record})])
    return _write(text.render(record, names, _terminal_width() or UNLIMITED))
