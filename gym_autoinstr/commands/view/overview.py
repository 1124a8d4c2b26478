"""At scale, answers, not dumps: the list of a run (or a campaign of runs) larger than a
screen, led by what the run says as a whole, then the rows that matter.

The summary: rollouts (the traces that are neither a process's start-up nor a job's own),
jobs and runs, failures (rollouts with an ERROR span) and how they failed, reward (mean
over the valid rewards, masked samples counted apart; the shares at 0 and at 1), the
duration's p50/p95/p99 (nearest rank) and maximum, where the time went (model calls,
tools, verify, as shares of the rollouts' total time) and tokens per rollout; with more
than one run, a line per run.  Then the ``SHOWN`` rows ``--show`` picks: the slowest
(default), the failed (newest first), the worst (lowest reward first), the newest; and a
line saying how many more there are and how to see them (``--all``, ``--json``)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from gym_autoinstr.commands.view.text import count, cut, duration_text, list_lines, number_text

SHOWN = 20
SHOWS = {
    "slowest": ("slowest", lambda ts: sorted(ts, key=lambda t: -t.duration_ms)),
    "failed": ("newest failed", lambda ts: sorted((t for t in ts if t.has_error), key=lambda t: -t.start_ns)),
    "worst": (
        "lowest-reward",
        lambda ts: sorted((t for t in ts if t.reward is not None), key=lambda t: (t.reward, -t.duration_ms)),
    ),
    "newest": ("newest", lambda ts: sorted(ts, key=lambda t: -t.start_ns)),
}
RUN_LINES = 30  # runs listed one per line; more are summed up in one


def _percentile(ordered: Sequence[float], share: float) -> float:
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _reward_text(rollouts: Sequence) -> str:
    rewards = [t.reward for t in rollouts if t.reward is not None and not t.mask_sample]
    masked = sum(1 for t in rollouts if t.reward is not None and t.mask_sample)
    if not rewards:
        return "no reward" + (f" ({masked} masked)" if masked else "")
    zero, one = sum(1 for r in rewards if r == 0), sum(1 for r in rewards if r == 1)
    return (
        f"mean {number_text(sum(rewards) / len(rewards))} over {count(len(rewards), 'reward')}"
        + (f" ({masked} masked apart)" if masked else "")
        + f", {_share(zero, len(rewards))} at 0, {_share(one, len(rewards))} at 1"
    )


def _failures_text(failed: Sequence) -> str:
    kinds = Counter(t.failure.get("error_type") or t.failure.get("stage") or "error" for t in failed)
    top = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(3))
    return f" ({top}{', ...' if len(kinds) > 3 else ''})" if top else ""


def summary_lines(traces: Sequence, runs: Sequence[str], width: int) -> list[str]:
    """The run's (or campaign's) summary, a few lines, each at most ``width`` wide."""
    rollouts = [t for t in traces if t.is_rollout]
    others = len(traces) - len(rollouts)
    failed = [t for t in rollouts if t.has_error]
    jobs = {t.job_id for t in rollouts if t.job_id}
    where = f" in {count(len(runs), 'run')}" if len(runs) > 1 else ""
    lines = [
        f"{count(len(rollouts), 'rollout')}{where}"
        + (f", {count(len(jobs), 'job')}" if jobs else "")
        + f"; failed {len(failed)} ({_share(len(failed), len(rollouts))}){_failures_text(failed)}"
        + (f"; {others} other traces (start-up, jobs' own)" if others else "")
    ]
    if rollouts:
        lines.append(f"reward: {_reward_text(rollouts)}")
        ordered = sorted(t.duration_ms for t in rollouts)
        lines.append(
            "duration: "
            + "  ".join(f"p{int(q * 100)} {duration_text(_percentile(ordered, q))}" for q in (0.5, 0.95, 0.99))
            + f"  max {duration_text(ordered[-1])}"
        )
        seams = [t.seams_ms() for t in rollouts]
        total = sum(ordered)
        time_in = "  ".join(
            f"{part} {_share(sum(s[part] for s in seams), total)}" for part in ("model", "tools", "verify")
        )
        tokens = [t.tokens for t in rollouts if t.tokens]
        per = (
            f"; tokens a rollout: in {sum(i for i, _ in tokens) / len(tokens):.0f}, "
            f"out {sum(o for _, o in tokens) / len(tokens):.0f}"
            if tokens
            else ""
        )
        lines.append(f"time in: {time_in} (of the rollouts' total){per}")
    if len(runs) > 1:
        lines.extend(run_lines(rollouts, runs))
    return [cut(line, width) for line in lines]


def run_lines(rollouts: Sequence, runs: Sequence[str]) -> list[str]:
    """A line per run: rollouts, failed, mean reward, p50 duration."""
    by_run: dict[str, list] = defaultdict(list)
    for t in rollouts:
        by_run[t.run].append(t)
    named = max((len(run) for run in runs[:RUN_LINES]), default=3)
    lines = [f"  {'run':<{named}}  {'rollouts':>9}  {'failed':>7}  {'reward':>7}  {'p50':>9}"]
    for run in runs[:RUN_LINES]:
        members = by_run.get(run, [])
        rewards = [t.reward for t in members if t.reward is not None and not t.mask_sample]
        mean = number_text(sum(rewards) / len(rewards)) if rewards else "-"
        p50 = duration_text(_percentile(sorted(t.duration_ms for t in members), 0.5)) if members else "-"
        failed = sum(1 for t in members if t.has_error)
        lines.append(f"  {run:<{named}}  {len(members):>9}  {failed:>7}  {mean:>7}  {p50:>9}")
    if len(runs) > RUN_LINES:
        lines.append(f"  ... and {len(runs) - RUN_LINES} more runs (--json: every row, with its run)")
    return lines


def overview(traces: Sequence, runs: Sequence[str], show: str, width: int, lost: str | None) -> list[str]:
    """The summary, the ``SHOWN`` rows ``show`` picks among the rollouts, and how to see more."""
    heading, pick = SHOWS[show]
    rollouts = [t for t in traces if t.is_rollout]
    chosen = pick(rollouts)[:SHOWN]
    lines = ([cut(lost, width)] if lost else []) + summary_lines(traces, runs, width) + [""]
    if chosen:
        lines.append(cut(f"the {len(chosen)} {heading} rollouts (--show slowest|failed|worst|newest):", width))
        lines.extend(list_lines(chosen, width))
    else:
        lines.append(cut(f"no {heading} rollouts (--show slowest|failed|worst|newest)", width))
    more = len(traces) - len(chosen)
    lines += [
        "",
        cut(
            f"... and {count(more, 'more trace')}: --all lists every trace, --json gives every row, "
            "--where narrows (reward<0.5, duration>2s), --by-task per task, --trace ID draws one",
            width,
        ),
    ]
    return lines
