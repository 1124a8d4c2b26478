"""``compare`` in the terminal: who A and B are, the overall changes, a line per task, the
tasks on one side alone, and how each figure is computed; every line cut to the width."""

from __future__ import annotations

import textwrap

from gym_autoinstr.commands.compare.comparison import P50_SHARE, P_VALUE, TIMES
from gym_autoinstr.commands.view.text import UNLIMITED, count, cut, duration_text

SEAM_LABELS = {"duration": "duration", "model": "model", "tools": "tools", "verify": "verify"}


def _reward(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _signed(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def interval_text(interval: list[float] | None, digits: int = 3, scale: float = 1.0) -> str:
    if interval is None:
        return ""
    low, high = interval
    return f"[{low * scale:+.{digits}f}, {high * scale:+.{digits}f}]"


def _ms(value: float | None) -> str:
    return "" if value is None else duration_text(value)


def _ms_change(change: dict) -> str:
    moved = change["p50_change"]
    if moved is None:
        return ""
    text = ("+" if moved >= 0 else "-") + duration_text(abs(moved))
    share = change["p50_change_share"]
    return text + (f" ({share * 100:+.0f}%)" if share is not None else "")


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}%"


def _tokens(side: dict) -> str:
    tokens = side["tokens"]
    if tokens["input_mean"] is None:
        return ""
    return f"{tokens['input_mean']:.0f}/{tokens['output_mean']:.0f}"


def _table(rows: list[tuple[str, ...]], width: int, left: int = 1) -> list[str]:
    """Columns padded to their widest cell: the first ``left`` to the left, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append(cut("  ".join(cells).rstrip(), width))
    return lines


def overall_rows(record: dict) -> list[tuple[str, ...]]:
    overall = record["overall"]
    a, b, changes = overall["a"], overall["b"], overall["changes"]
    paired, unpaired = changes["reward"]["paired"], changes["reward"]["unpaired"]
    rows = [
        ("overall", "A", "B", "change", "95% interval / test", "mark"),
        ("rollouts", str(a["rollouts"]), str(b["rollouts"]), _signed(b["rollouts"] - a["rollouts"], 0), "", ""),
        ("mean reward", _reward(a["mean_reward"]), _reward(b["mean_reward"]), _signed(unpaired["change"]), "", ""),
        (
            f"  paired by task ({count(paired['tasks'], 'task')})",
            "",
            "",
            _signed(paired["change"]),
            interval_text(paired["interval"]),
            paired["mark"] or "",
        ),
        ("masked", str(a["masked"]), str(b["masked"]), "", "", ""),
    ]
    failures = changes["failure_rate"]
    rows.append(
        (
            "failure rate",
            _rate(a["failure_rate"]),
            _rate(b["failure_rate"]),
            "" if failures["change"] is None else f"{failures['change'] * 100:+.2f} pts",
            interval_text(failures["interval"], 2, 100.0) + (" pts" if failures["interval"] else ""),
            {"worse": "more failures", "better": "fewer failures", None: ""}[failures["mark"]],
        )
    )
    for name in TIMES:
        change = changes["times_ms"][name]
        p_value = change["p_value"]
        rows.append(
            (
                f"{SEAM_LABELS[name]} p50",
                _ms(a["times_ms"][name]["p50"]),
                _ms(b["times_ms"][name]["p50"]),
                _ms_change(change),
                "" if p_value is None else f"p={p_value:.2g}" if p_value >= 1e-15 else "p<1e-15",
                change["mark"] or "",
            )
        )
        if name == "duration":
            moved = change["p95_change"]
            rows.append(
                (
                    "duration p95",
                    _ms(a["times_ms"][name]["p95"]),
                    _ms(b["times_ms"][name]["p95"]),
                    "" if moved is None else ("+" if moved >= 0 else "-") + duration_text(abs(moved)),
                    "",
                    "",
                )
            )
    tokens = changes["tokens"]
    rows.append(
        (
            "tokens in/out",
            _tokens(a),
            _tokens(b),
            "" if tokens["input_change"] is None else f"{tokens['input_change']:+.0f}/{tokens['output_change']:+.0f}",
            interval_text(tokens["total_interval"], 0) + (" total" if tokens["total_interval"] else ""),
            f"{tokens['mark']} tokens" if tokens["mark"] else "",
        )
    )
    return rows


TASK_HEADS = (
    "task",
    "rollouts",
    "reward A",
    "reward B",
    "change",
    "95% interval",
    "marks",
    "failed",
    "p50 A",
    "p50 B",
    "verify A",
    "verify B",
    "model A",
    "model B",
    "tools A",
    "tools B",
    "p95 A",
    "p95 B",
    "tokens A",
    "tokens B",
)


def task_row(row: dict) -> tuple[str, ...]:
    a, b, changes = row["a"], row["b"], row["changes"]
    reward = changes["reward"]
    times = []
    for name in ("duration", "verify", "model", "tools"):
        times += [_ms(a["times_ms"][name]["p50"]), _ms(b["times_ms"][name]["p50"])]
    return (
        str(row["task_index"]),
        f"{a['rollouts']}/{b['rollouts']}",
        _reward(a["mean_reward"]),
        _reward(b["mean_reward"]),
        _signed(reward["change"]),
        interval_text(reward["interval"]),
        ", ".join(row["marks"]),
        f"{a['failures']}/{b['failures']}",
        *times,
        _ms(a["times_ms"]["duration"]["p95"]),
        _ms(b["times_ms"]["duration"]["p95"]),
        _tokens(a),
        _tokens(b),
    )


def only_line(side: str, only: list[dict], width: int) -> str:
    tasks = ", ".join(str(item["task_index"]) for item in only)
    rollouts = sum(item["rollouts"] for item in only)
    return cut(f"only in {side}: {count(len(only), 'task')} ({count(rollouts, 'rollout')}): {tasks}", width)


def notes(record: dict) -> list[str]:
    """How each figure is computed, in a few lines."""
    per_task = (
        "Newcombe's hybrid score interval (every reward is 0 or 1: pass rates)"
        if record["reward_kind"] == "pass rate"
        else "Welch's t interval (the difference itself when neither side varies)"
    )
    return [
        "change: B - A. mean reward: over valid rewards (masked samples apart). Per task, the change's 95% "
        f"interval is {per_task}; overall, paired by task: the mean of the per-task changes ± t(0.975, T-1)·sd/√T "
        "(Miller 2024, arXiv:2411.00640). better/worse: the interval excludes 0.",
        f"slower/faster: p50 moved by more than {P50_SHARE:.0%} and Mann-Whitney U p < {P_VALUE} (p shown when "
        "tested). failure rate: rollouts with an ERROR span, Newcombe's interval. tokens: mean in/out per rollout, "
        "Welch's interval on the total. Percentiles by nearest rank.",
    ]


def render(record: dict, sides: dict[str, str], width: int) -> list[str]:
    """The whole comparison as lines at most ``width`` long; ``sides``: A's and B's names."""
    lines = [cut(f"{side}: {name}", width) for side, name in sides.items()]
    lines.append("")
    lines += _table(overall_rows(record), width)
    lines.append("")
    if record["tasks"]:
        lines += _table([TASK_HEADS] + [task_row(row) for row in record["tasks"]], width, left=0)
    else:
        lines.append(cut("no task is on both sides: nothing to compare task by task", width))
    for side, key in (("A", "only_a"), ("B", "only_b")):
        if record[key]:
            lines.append(only_line(side, record[key], width))
    without = record["without_task"]
    if without["a"] or without["b"]:
        lines.append(
            cut(f"without a task index (in the overall figures only): A {without['a']}, B {without['b']}", width)
        )
    lines.append("")
    for note in notes(record):  # wrapped, not cut: every word of them counts
        lines += textwrap.wrap(note, width) if width < UNLIMITED else [note]
    return lines
