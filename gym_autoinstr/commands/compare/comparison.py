"""Two sides' rollouts compared, per task and overall, as one JSON-ready record (``compare``):
the text, ``--json`` and the page all show this record.

A side is a list of rollouts (``runs.rollout.Rollout``: the table alone, never the spans).
Per task (``nemo.gym.task.index``) and overall, each side's rollouts, mean reward over the
valid rewards (a masked sample's apart: ``masked``), failures (rollouts with an ERROR span),
p50/p95/mean of the duration and of the time in each seam (model, tools, verify: the
callees' SERVER spans), and tokens per rollout (in, out; over the rollouts that report
them).  Rollouts without a task index count in the overall figures alone; tasks on one
side alone are listed apart.

The changes (B - A), each with a 95% interval and a mark where it matters:

* reward, per task: Newcombe's hybrid score interval when every valid reward of both sides
  is 0 or 1 (pass rates), else Welch's t interval; overall: the mean over the tasks both
  sides scored of the per-task change, with the clustered interval mean ± t(0.975, T-1)·
  sd/sqrt(T) (paired by task: Miller 2024, arXiv:2411.00640); the unpaired overall means
  are given too.  Marked ``better``/``worse`` when the interval excludes 0.
* failure rate: Newcombe's interval; marked ``worse``/``better`` likewise.
* duration and each seam: marked ``slower``/``faster`` when the p50 moved by more than 10%
  and the Mann-Whitney U test (normal approximation) gives p < 0.01 (the test is run only
  when the p50 moved that much: ``p_value`` is None otherwise).
* tokens: Welch's interval on the tokens (in + out) per rollout; marked ``more``/``fewer``.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence

from gym_autoinstr.commands.compare import stats
from gym_autoinstr.commands.runs import facts as f

TIMES = ("duration", "model", "tools", "verify")
P50_SHARE = 0.10  # a p50 that moved by more than this share of A's ...
P_VALUE = 0.01  # ... with a Mann-Whitney p-value below this is marked


class Sample:
    """One side's rollouts of one task (or of every task), from their rows: what the
    comparison reads, each column taken once (list comprehensions: a million rows a second)."""

    __slots__ = ("rollouts", "rewards", "masked", "failures", "times", "tokens_in", "tokens_out", "_sorted")

    def __init__(self, rows: Sequence[tuple]) -> None:
        self.rollouts = len(rows)
        rewarded = [row for row in rows if row[f.R_REWARD] is not None]
        self.rewards: list[float] = [row[f.R_REWARD] for row in rewarded if not row[f.R_MASK]]
        self.masked = len(rewarded) - len(self.rewards)
        self.failures = sum(1 for row in rows if row[f.R_ERROR])
        seams = [row[f.R_SEAMS] for row in rows]
        self.times: dict[str, list[float]] = {
            "duration": [(row[f.R_END] - row[f.R_START]) / 1e6 for row in rows],
            "model": [seam[0] for seam in seams],
            "tools": [seam[1] for seam in seams],
            "verify": [seam[2] for seam in seams],
        }
        tokens = [row[f.R_TOKENS] for row in rows if row[f.R_TOKENS]]
        self.tokens_in: list[int] = [pair[0] for pair in tokens]
        self.tokens_out: list[int] = [pair[1] for pair in tokens]
        self._sorted: dict[str, list[float]] = {}

    def ordered(self, name: str) -> list[float]:
        """The times ``name`` sorted (once)."""
        found = self._sorted.get(name)
        if found is None:
            found = self._sorted[name] = sorted(self.times[name])
        return found

    def record(self) -> dict:
        """What this side's rollouts say on their own."""
        rewards, n = self.rewards, self.rollouts
        times = {}
        for name in TIMES:
            ordered = self.ordered(name)
            times[name] = {
                "p50": stats.percentile(ordered, 0.50) if ordered else None,
                "p95": stats.percentile(ordered, 0.95) if ordered else None,
                "mean": sum(ordered) / len(ordered) if ordered else None,
            }
        with_tokens = len(self.tokens_in)
        return {
            "rollouts": n,
            "rewarded": len(rewards),
            "masked": self.masked,
            "mean_reward": math.fsum(rewards) / len(rewards) if rewards else None,
            "failures": self.failures,
            "failure_rate": self.failures / n if n else None,
            "times_ms": times,
            "tokens": {
                "rollouts": with_tokens,
                "input_mean": sum(self.tokens_in) / with_tokens if with_tokens else None,
                "output_mean": sum(self.tokens_out) / with_tokens if with_tokens else None,
            },
        }


def gather(rollouts: Sequence) -> tuple[dict[int, Sample], Sample, int]:
    """The rollouts (``Rollout``: other traces are skipped) by task, all of them, and how
    many have no task index."""
    rows = [rollout.row for rollout in rollouts if rollout.is_rollout]
    by_task: dict[int, list[tuple]] = {}
    without = 0
    for row in rows:
        task = row[f.R_TASK]
        if task is None:
            without += 1
        else:
            found = by_task.get(task)
            if found is None:
                by_task[task] = [row]
            else:
                found.append(row)
    return {task: Sample(group) for task, group in by_task.items()}, Sample(rows), without


def _excludes_zero(interval: tuple[float, float] | None) -> int:
    """1 when the interval lies above 0, -1 below, 0 when it holds 0 (or there is none)."""
    if interval is None:
        return 0
    return 1 if interval[0] > 0 else -1 if interval[1] < 0 else 0


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def _proportion(x: float) -> int:
    return int(round(x))


def reward_change(a: Sample, b: Sample, binary: bool) -> dict:
    if not a.rewards or not b.rewards:
        return {"change": None, "interval": None, "method": None, "mark": None}
    change = math.fsum(b.rewards) / len(b.rewards) - math.fsum(a.rewards) / len(a.rewards)
    if binary:
        interval = stats.newcombe(
            _proportion(sum(a.rewards)), len(a.rewards), _proportion(sum(b.rewards)), len(b.rewards)
        )
    else:
        interval = stats.welch(a.rewards, b.rewards)
    side = _excludes_zero(interval)
    return {
        "change": change,
        "interval": _pair(interval),
        "method": "newcombe" if binary else "welch",
        "mark": {1: "better", -1: "worse", 0: None}[side],
    }


def failure_change(a: Sample, b: Sample) -> dict:
    if not a.rollouts or not b.rollouts:
        return {"change": None, "interval": None, "mark": None}
    interval = stats.newcombe(a.failures, a.rollouts, b.failures, b.rollouts)
    side = _excludes_zero(interval)
    return {
        "change": b.failures / b.rollouts - a.failures / a.rollouts,
        "interval": _pair(interval),
        "mark": {1: "worse", -1: "better", 0: None}[side],
    }


def time_change(a: Sample, b: Sample, name: str) -> dict:
    """The change of one time (``duration`` or a seam): p50 and p95 (ms), the p50's change
    as a share of A's, the Mann-Whitney p-value when the p50 moved by more than 10%."""
    ordered_a, ordered_b = a.ordered(name), b.ordered(name)
    if not ordered_a or not ordered_b:
        return {"p50_change": None, "p95_change": None, "p50_change_share": None, "p_value": None, "mark": None}
    p50_a, p50_b = stats.percentile(ordered_a, 0.5), stats.percentile(ordered_b, 0.5)
    p95_a, p95_b = stats.percentile(ordered_a, 0.95), stats.percentile(ordered_b, 0.95)
    moved = p50_b - p50_a
    share = moved / p50_a if p50_a else (None if not moved else math.copysign(math.inf, moved))
    p_value = None
    mark = None
    if share is not None and abs(share) > P50_SHARE:
        p_value = stats.mann_whitney_p(ordered_a, ordered_b)
        if p_value is not None and p_value < P_VALUE:
            mark = "slower" if moved > 0 else "faster"
    return {
        "p50_change": moved,
        "p95_change": p95_b - p95_a,
        "p50_change_share": share if share is None or math.isfinite(share) else None,
        "p_value": p_value,
        "mark": mark,
    }


def tokens_change(a: Sample, b: Sample) -> dict:
    if not a.tokens_in or not b.tokens_in:
        return {"input_change": None, "output_change": None, "total_interval": None, "mark": None}
    total_a = list(map(int.__add__, a.tokens_in, a.tokens_out))
    total_b = list(map(int.__add__, b.tokens_in, b.tokens_out))
    interval = stats.welch(total_a, total_b)
    side = _excludes_zero(interval)
    return {
        "input_change": sum(b.tokens_in) / len(b.tokens_in) - sum(a.tokens_in) / len(a.tokens_in),
        "output_change": sum(b.tokens_out) / len(b.tokens_out) - sum(a.tokens_out) / len(a.tokens_out),
        "total_interval": _pair(interval),
        "mark": {1: "more", -1: "fewer", 0: None}[side],
    }


def _changes(a: Sample, b: Sample, binary: bool) -> dict:
    return {
        "reward": reward_change(a, b, binary),
        "failure_rate": failure_change(a, b),
        "times_ms": {name: time_change(a, b, name) for name in TIMES},
        "tokens": tokens_change(a, b),
    }


def marks(changes: dict) -> list[str]:
    """The marks of one comparison's changes, as words: ``better``, ``more failures``,
    ``slower verify``, ``fewer tokens``."""
    found = []
    reward = changes["reward"].get("mark") or changes["reward"].get("paired", {}).get("mark")
    if reward:
        found.append(reward)
    failures = changes["failure_rate"]["mark"]
    if failures:
        found.append("more failures" if failures == "worse" else "fewer failures")
    for name in TIMES:
        mark = changes["times_ms"][name]["mark"]
        if mark:
            found.append(mark if name == "duration" else f"{mark} {name}")
    if changes["tokens"]["mark"]:
        found.append(f"{changes['tokens']['mark']} tokens")
    return found


def compare(a_rollouts: Sequence, b_rollouts: Sequence) -> dict:
    """The record of A against B (both: ``Rollout`` lists; rollouts alone are read)."""
    return compared(a_rollouts, b_rollouts)[0]


def compared(a_rollouts: Sequence, b_rollouts: Sequence) -> tuple[dict, Sample, Sample]:
    """``compare``'s record, and every rollout of A and of B as a ``Sample`` (the page draws
    their times)."""
    collecting = gc.isenabled()
    gc.disable()  # millions of floats in lists and no cycle among them: nothing to collect
    try:
        return _compared(a_rollouts, b_rollouts)
    finally:
        if collecting:
            gc.enable()


def _compared(a_rollouts: Sequence, b_rollouts: Sequence) -> tuple[dict, Sample, Sample]:
    tasks_a, every_a, without_a = gather(a_rollouts)
    tasks_b, every_b, without_b = gather(b_rollouts)
    binary = all(r in (0.0, 1.0) for r in every_a.rewards) and all(r in (0.0, 1.0) for r in every_b.rewards)
    both = sorted(tasks_a.keys() & tasks_b.keys())
    rows = []
    differences = []
    for task in both:
        a, b = tasks_a[task], tasks_b[task]
        changes = _changes(a, b, binary)
        if changes["reward"]["change"] is not None:
            differences.append(changes["reward"]["change"])
        rows.append({"task_index": task, "a": a.record(), "b": b.record(), "changes": changes})
        rows[-1]["marks"] = marks(changes)
    overall = _changes(every_a, every_b, binary)
    paired = stats.clustered(differences)
    side = _excludes_zero(paired)
    record_a, record_b = every_a.record(), every_b.record()
    a_mean, b_mean = record_a["mean_reward"], record_b["mean_reward"]
    overall["reward"] = {
        "paired": {
            "tasks": len(differences),
            "change": math.fsum(differences) / len(differences) if differences else None,
            "interval": _pair(paired),
            "method": "clustered by task",
            "mark": {1: "better", -1: "worse", 0: None}[side],
        },
        "unpaired": {"a": a_mean, "b": b_mean, "change": None if a_mean is None or b_mean is None else b_mean - a_mean},
    }
    record = {
        "reward_kind": "pass rate" if binary else "any",
        "overall": {"a": record_a, "b": record_b, "changes": overall, "marks": marks(overall)},
        "tasks": rows,
        "only_a": _only(tasks_a, tasks_b),
        "only_b": _only(tasks_b, tasks_a),
        "without_task": {"a": without_a, "b": without_b},
    }
    return record, every_a, every_b


def _only(mine: dict[int, Sample], theirs: dict[int, Sample]) -> list[dict]:
    return [
        {"task_index": task, "rollouts": mine[task].rollouts, "mean_reward": mine[task].record()["mean_reward"]}
        for task in sorted(mine.keys() - theirs.keys())
    ]
