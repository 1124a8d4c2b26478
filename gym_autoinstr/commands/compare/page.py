"""``compare --html FILE``: the comparison as one self-contained page (inline CSS and SVG,
nothing fetched): who A and B are, the overall table, a chart of the reward change per task
(a bar per task from 0 to its change, a whisker for its 95% interval, green where marked
better, red where worse), the distributions of the duration and of each seam's time (A's
and B's histograms overlaid on the same bins, each side's bars as shares of its rollouts),
the per-task table and how each figure is computed."""

from __future__ import annotations

import html
from collections.abc import Sequence

from gym_autoinstr.commands.compare import text
from gym_autoinstr.commands.compare.comparison import TIMES, Sample
from gym_autoinstr.commands.view.charts import tick_label
from gym_autoinstr.commands.view.text import count

STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}h1{font-size:18px;margin:0 0 4px}
h2{font-size:14px;margin:18px 0 4px}.sides{margin:0;color:#444}.sides b{display:inline-block;width:18px}
table{border-collapse:collapse}td,th{padding:1px 10px;text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
tr.better td.mark,td.better{color:#1a7f37;font-weight:600}tr.worse td.mark,td.worse{color:#b00;font-weight:600}
td.mark{text-align:left}.notes{color:#555;font-size:12px;max-width:980px}
svg text{font-size:11px;fill:#555}rect.bar{fill:#9aa7b4}rect.bar.better{fill:#2da44e}rect.bar.worse{fill:#d84a4a}
line.interval{stroke:#333;stroke-width:1.2}line.zero{stroke:#999}rect.plot{fill:#fafafa;stroke:#ddd}
rect.a{fill:#4a8fd8;fill-opacity:.55}rect.b{fill:#f0883e;fill-opacity:.55}
.charts{display:flex;flex-wrap:wrap;gap:0 28px}figure{margin:8px 0}figcaption{color:#555;font-size:12px}
i.a,i.b{display:inline-block;width:14px;height:8px;margin:0 4px 0 10px}i.a{background:#4a8fd8}i.b{background:#f0883e}
"""


def _table(rows: list[tuple[str, ...]], classes: Sequence[str] = (), mark_column: int = -1) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in rows[0])
    body = []
    for number, row in enumerate(rows[1:]):
        kind = classes[number] if number < len(classes) else ""
        cells = "".join(
            f'<td class="mark">{html.escape(cell)}</td>'
            if i == mark_column % len(row)
            else f"<td>{html.escape(cell)}</td>"
            for i, cell in enumerate(row)
        )
        body.append(f'<tr class="{kind}">{cells}</tr>' if kind else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


LEFT, TOP, PLOT_H, BOTTOM = 46, 8, 160, 18


def reward_chart(record: dict) -> str:
    """A bar per task both sides have, from 0 to its reward change, its interval a whisker."""
    rows = record["tasks"]
    if not rows:
        return ""
    values = [0.0]
    for row in rows:
        reward = row["changes"]["reward"]
        values += [v for v in (reward["change"], *(reward["interval"] or ())) if v is not None]
    low, high = min(values), max(values)
    if high - low < 1e-9:
        low, high = -0.5, 0.5
    pad = (high - low) * 0.05
    low, high = low - pad, high + pad
    step = max(4.0, min(24.0, 900 / len(rows)))
    width = LEFT + step * len(rows) + 8

    def y(value: float) -> float:
        return TOP + PLOT_H * (high - value) / (high - low)

    parts = [f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{step * len(rows):.1f}" height="{PLOT_H}"></rect>']
    zero = y(0.0)
    for i, row in enumerate(rows):
        reward = row["changes"]["reward"]
        change = reward["change"]
        x = LEFT + i * step
        kind = reward["mark"] or ("none" if change is None else "same")
        top, bottom = (zero, zero) if change is None else (min(y(change), zero), max(y(change), zero))
        said = "no reward on one side" if change is None else f"change {change:+.3f}"
        if reward["interval"]:
            said += " " + text.interval_text(reward["interval"])
        parts.append(
            f'<rect class="bar {kind}" data-task="{row["task_index"]}" x="{x + step * 0.15:.1f}" y="{top:.1f}" '
            f'width="{step * 0.7:.1f}" height="{bottom - top:.1f}"><title>task {row["task_index"]}: {said}'
            f"{' (' + kind + ')' if reward['mark'] else ''}</title></rect>"
        )
        if reward["interval"]:
            centre = x + step / 2
            lo, hi = y(reward["interval"][0]), y(reward["interval"][1])
            parts.append(
                f'<line class="interval" x1="{centre:.1f}" x2="{centre:.1f}" y1="{lo:.1f}" y2="{hi:.1f}"></line>'
                f'<line class="interval" x1="{centre - step * 0.2:.1f}" x2="{centre + step * 0.2:.1f}" '
                f'y1="{lo:.1f}" y2="{lo:.1f}"></line><line class="interval" x1="{centre - step * 0.2:.1f}" '
                f'x2="{centre + step * 0.2:.1f}" y1="{hi:.1f}" y2="{hi:.1f}"></line>'
            )
    parts.append(f'<line class="zero" x1="{LEFT}" x2="{LEFT + step * len(rows):.1f}" y1="{zero:.1f}" y2="{zero:.1f}">')
    parts.append("</line>")
    for value in (high - pad, 0.0, low + pad):
        parts.append(f'<text x="{LEFT - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{value:+.2f}</text>')
    first, last = rows[0]["task_index"], rows[-1]["task_index"]
    parts.append(f'<text x="{LEFT}" y="{TOP + PLOT_H + 14}">task {first}</text>')
    parts.append(f'<text x="{width - 8:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="end">task {last}</text>')
    marked = sum(1 for row in rows if row["changes"]["reward"]["mark"])
    return (
        f'<figure class="reward"><svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{TOP + PLOT_H + BOTTOM}" role="img" aria-label="reward change per task">{"".join(parts)}</svg>'
        f"<figcaption>reward change B - A per task ({count(len(rows), 'task')} on both sides, {marked} marked: "
        "green better, red worse), the whisker its 95% interval</figcaption></figure>"
    )


def time_chart(a: Sample, b: Sample, name: str, bins: int = 30) -> str:
    """A's and B's times ``name`` as two histograms overlaid on the same bins."""
    ordered_a, ordered_b = a.ordered(name), b.ordered(name)
    if not ordered_a or not ordered_b:
        return ""
    low, high = min(ordered_a[0], ordered_b[0]), max(ordered_a[-1], ordered_b[-1])
    span = (high - low) or 1.0
    chart_w, chart_h = 440, 100
    bar_w = chart_w / bins
    shares = []
    for ordered in (ordered_a, ordered_b):
        counts = [0] * bins
        for value in ordered:
            counts[min(int((value - low) / span * bins), bins - 1)] += 1
        shares.append([c / len(ordered) for c in counts])
    peak = max(max(shares[0]), max(shares[1])) or 1.0
    bars = []
    for side, side_shares in zip(("a", "b"), shares):
        for i, share in enumerate(side_shares):
            if share:
                height = chart_h * share / peak
                bars.append(
                    f'<rect class="{side}" x="{i * bar_w:.1f}" y="{chart_h - height:.1f}" width="{bar_w:.1f}" '
                    f'height="{height:.1f}"><title>{side.upper()}: {tick_label(low + span * i / bins)} – '
                    f"{tick_label(low + span * (i + 1) / bins)}: {share * 100:.1f}%</title></rect>"
                )
    label = "duration" if name == "duration" else f"time in {name}"
    return (
        f'<figure class="times" data-time="{name}"><svg xmlns="http://www.w3.org/2000/svg" width="{chart_w}" '
        f'height="{chart_h + 16}" role="img" aria-label="{label}: A and B">{"".join(bars)}'
        f'<text x="0" y="{chart_h + 13}">{tick_label(low)}</text>'
        f'<text x="{chart_w}" y="{chart_h + 13}" text-anchor="end">{tick_label(high)}</text></svg>'
        f'<figcaption>{label} per rollout: <i class="a"></i>A ({len(ordered_a)}) <i class="b"></i>B '
        f"({len(ordered_b)}), each as shares of its rollouts</figcaption></figure>"
    )


def render(record: dict, names: dict[str, str], a: Sample, b: Sample) -> str:
    """The page, whole."""
    overall_rows = text.overall_rows(record)
    overall = _table(overall_rows, mark_column=-1)
    sections = [
        "<h2>Overall</h2>" + overall,
        "<h2>Reward change per task</h2>" + (reward_chart(record) or "<p>no task is on both sides</p>"),
        '<h2>Time per rollout</h2><div class="charts">' + "".join(time_chart(a, b, name) for name in TIMES) + "</div>",
    ]
    if record["tasks"]:
        rows = [text.TASK_HEADS] + [text.task_row(row) for row in record["tasks"]]
        kinds = [row["changes"]["reward"]["mark"] or "" for row in record["tasks"]]
        sections.append("<h2>Per task</h2>" + _table(rows, kinds, mark_column=text.TASK_HEADS.index("marks")))
    apart = [
        text.only_line(side, record[key], 10**6) for side, key in (("A", "only_a"), ("B", "only_b")) if record[key]
    ]
    without = record["without_task"]
    if without["a"] or without["b"]:
        apart.append(f"without a task index (in the overall figures only): A {without['a']}, B {without['b']}")
    notes = "".join(f"<p>{html.escape(line)}</p>" for line in apart + text.notes(record))
    sides = "".join(f'<p class="sides"><b>{side}</b>{html.escape(name)}</p>' for side, name in names.items())
    title = "gym-autoinstr compare"
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title><style>{STYLE}</style></head>'
        f'<body><h1>{title}</h1>{sides}{"".join(sections)}<div class="notes">{notes}</div></body></html>'
    )
