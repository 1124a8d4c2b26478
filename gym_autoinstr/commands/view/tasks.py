"""``--by-task``: a collection run's rollouts per task, in text and as JSON.

A row per task index (``nemo.gym.task.index``, on the rollouts Gym's collection driver
sent), by task: how many rollout traces (its repeats), their mean reward, how many
rewards it is over, how many are masked, the 50th and 95th percentile of their
durations, and the failures (traces with an ERROR span); a last row ``all`` over every
task.  The mean is over the rewards that are valid measurements: a masked sample's
(``nemo.gym.mask_sample``) is left out, and counted apart.  Percentiles are by nearest
rank (the smallest duration with at least that share of the task's at or below it: with
5 repeats, p50 is the 3rd shortest and p95 the longest).  Start-up traces and a job's own
trace are not rollouts; rollout traces without a task index are counted apart.

The page shows the same table (``task_table_html``), folded under its index; a click on a
task's row shows that task's rollouts alone (``task==N`` in the index's ``where`` box)."""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gym_autoinstr.commands.view.model import Trace
from gym_autoinstr.commands.view.text import count, cut, duration_text


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the ``ceil(share * n)``-th smallest of ``values``."""
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


@dataclass
class TaskRow:
    task: int | None  # None: the row over every task
    rollouts: int
    rewarded: int  # rollouts whose reward is a valid measurement (the mean is over these)
    masked: int
    mean_reward: float | None
    p50_ms: float
    p95_ms: float
    failures: int

    def record(self) -> dict:
        return {
            "task_index": self.task,
            "rollouts": self.rollouts,
            "mean_reward": self.mean_reward,
            "rewarded": self.rewarded,
            "masked": self.masked,
            "p50_duration_ms": self.p50_ms,
            "p95_duration_ms": self.p95_ms,
            "failures": self.failures,
        }


def _row(task: int | None, traces: Sequence[Trace]) -> TaskRow:
    rewards = [t.reward for t in traces if t.reward is not None and not t.mask_sample]
    durations = [t.duration_ms for t in traces]
    return TaskRow(
        task=task,
        rollouts=len(traces),
        rewarded=len(rewards),
        masked=sum(1 for t in traces if t.reward is not None and t.mask_sample),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        p50_ms=percentile(durations, 0.50),
        p95_ms=percentile(durations, 0.95),
        failures=sum(1 for t in traces if t.has_error),
    )


@dataclass
class TaskSummary:
    tasks: list[TaskRow]  # by task index
    overall: TaskRow | None  # over every task's rollouts; None when no task
    without_task: int  # rollout traces without a task index

    def record(self) -> dict:
        return {
            "tasks": [row.record() for row in self.tasks],
            "all": self.overall.record() if self.overall else None,
            "rollouts_without_task_index": self.without_task,
        }


def by_task(traces: Sequence[Trace]) -> TaskSummary:
    """The rollout traces among ``traces`` summarised per task index."""
    groups: dict[int, list[Trace]] = defaultdict(list)
    without = 0
    for trace in traces:
        if not trace.is_rollout:
            continue
        if trace.task_index is None:
            without += 1
        else:
            groups[trace.task_index].append(trace)
    rows = [_row(task, groups[task]) for task in sorted(groups)]
    every = [t for task in sorted(groups) for t in groups[task]]
    return TaskSummary(rows, _row(None, every) if every else None, without)


HEADS = ("task", "rollouts", "mean reward", "rewarded", "masked", "p50 duration", "p95 duration", "failures")


def _cells(row: TaskRow) -> tuple[str, ...]:
    return (
        "all" if row.task is None else str(row.task),
        str(row.rollouts),
        "" if row.mean_reward is None else f"{row.mean_reward:.3f}",
        str(row.rewarded),
        str(row.masked),
        duration_text(row.p50_ms),
        duration_text(row.p95_ms),
        str(row.failures),
    )


NOTE = (
    "mean reward: over the rewards that are valid (masked samples apart); percentiles by nearest rank; "
    "failures: traces with an ERROR span"
)


def task_table_html(summary: TaskSummary) -> str:
    """The summary as a folded table for the page; "" when no rollout has a task index."""
    if summary.overall is None:
        return ""

    def row(task: TaskRow, attributes: str) -> str:
        return f"<tr{attributes}>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _cells(task)) + "</tr>"

    rows = "".join(row(task, f' data-task="{task.task}" title="list task {task.task} alone"') for task in summary.tasks)
    apart = (
        f" {count(summary.without_task, 'rollout trace')} without a task index not counted."
        if summary.without_task
        else ""
    )
    heads = "".join(f"<th>{html.escape(head)}</th>" for head in HEADS)
    return (
        f'<details class="tasks"><summary>Per task: {count(len(summary.tasks), "task")}, '
        f"{count(summary.overall.rollouts, 'rollout')}</summary>"
        f'<table class="tasks"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody>'
        f'<tfoot>{row(summary.overall, "")}</tfoot></table><p class="tasks-note">{NOTE}.{apart}</p></details>'
    )


def task_lines(summary: TaskSummary, width: int) -> list[str]:
    """The summary as a table: a header, a line per task, the ``all`` line, and what is
    counted how."""
    table = [HEADS] + [_cells(row) for row in summary.tasks]
    if summary.overall is not None:
        table.append(_cells(summary.overall))
    widths = [max(len(cells[i]) for cells in table) for i in range(len(HEADS))]
    lines = [cut("  ".join(cell.rjust(w) for cell, w in zip(cells, widths)), width) for cells in table]
    if summary.overall is not None and len(lines) > 2:
        lines.insert(-1, cut("  ".join("-" * w for w in widths), width))
    lines.append("")
    if summary.without_task:
        lines.append(cut(f"{count(summary.without_task, 'rollout trace')} without a task index not counted", width))
    lines.append(cut(NOTE, width))
    return lines
