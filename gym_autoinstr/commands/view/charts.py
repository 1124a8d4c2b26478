"""The page's charts, inline SVG over the rollout traces (a job's own trace lasts the whole
job and a start-up tens of seconds: either would squeeze every rollout into a corner):

* a histogram of their durations (``duration_chart``);
* reward against duration (``reward_chart``): one dot per rollout trace, failures (an
  ERROR span) red, masked samples hollow, those without a reward in a strip below the
  axis; a dot's tooltip names its trace, and clicking it opens the trace's waterfall when
  the page draws it."""

from __future__ import annotations

import html
from collections.abc import Sequence

from gym_autoinstr.commands.view.model import Trace
from gym_autoinstr.commands.view.text import ID_SHOWN, count, duration_text, number_text


def tick_label(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def duration_chart(listed: Sequence[Trace], bins: int = 24) -> str:
    """An inline SVG histogram of the rollout traces' durations."""
    durations = [t.duration_ms for t in listed if t.is_rollout]
    if len(durations) < 2:
        return ""
    low, high = min(durations), max(durations)
    span = (high - low) or 1.0
    counts = [0] * bins
    for value in durations:
        counts[min(int((value - low) / span * bins), bins - 1)] += 1
    peak = max(counts)
    chart_w, chart_h, bar_w = 480, 90, 480 / bins
    bars = "".join(
        f'<rect x="{i * bar_w + 1:.1f}" y="{chart_h - chart_h * c / peak:.1f}" width="{bar_w - 2:.1f}" '
        f'height="{chart_h * c / peak:.1f}"><title>{tick_label(low + span * i / bins)} – '
        f"{tick_label(low + span * (i + 1) / bins)}: {count(c, 'trace')}</title></rect>"
        for i, c in enumerate(counts)
        if c
    )
    return (
        f'<figure class="chart"><svg xmlns="http://www.w3.org/2000/svg" width="{chart_w}" height="{chart_h + 16}" '
        f'role="img" aria-label="rollout trace durations">{bars}'
        f'<text x="0" y="{chart_h + 13}">{tick_label(low)}</text>'
        f'<text x="{chart_w}" y="{chart_h + 13}" text-anchor="end">{tick_label(high)}</text></svg>'
        f"<figcaption>durations of {count(len(durations), 'rollout trace')} (the job's own and start-up traces "
        f"aside); tallest bar {peak}"
        "</figcaption></figure>"
    )


# The scatter's plot area, inside margins for the axis labels.
LEFT, TOP, PLOT_W, PLOT_H, STRIP = 34, 6, 446, 110, 14


def reward_chart(listed: Sequence[Trace]) -> str:
    """An inline SVG of reward (up) against duration (across), a dot per rollout trace;
    nothing when no rollout trace has a reward (older files)."""
    rollouts = [t for t in listed if t.is_rollout]
    rewarded = [t.reward for t in rollouts if t.reward is not None]
    if not rewarded:
        return ""
    durations = [t.duration_ms for t in rollouts]
    low, high = min(durations), max(durations)
    spread = (high - low) or 1.0
    bottom, top = min(min(rewarded), 0.0), max(max(rewarded), 1.0)
    rise = (top - bottom) or 1.0
    missing = len(rollouts) - len(rewarded)
    height = TOP + PLOT_H + (STRIP if missing else 0) + 16
    dots = []
    for trace in rollouts:
        x = LEFT + PLOT_W * (trace.duration_ms - low) / spread
        if trace.reward is None:
            y, said = TOP + PLOT_H + STRIP - 4, "no reward"
        else:
            y, said = TOP + PLOT_H * (top - trace.reward) / rise, f"reward {number_text(trace.reward)}"
        kind = "error" if trace.has_error else "ok"
        if trace.reward is not None and trace.mask_sample:
            kind += " masked"
            said += " (masked)"
        failed = " · ERROR" if trace.has_error else ""
        dots.append(
            f'<circle class="{kind}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" data-trace-id="{html.escape(trace.trace_id)}">'
            f"<title>{trace.trace_id[:ID_SHOWN]} · {said} · {duration_text(trace.duration_ms)}{failed}</title></circle>"
        )
    axis_y = TOP + PLOT_H
    labels = (
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{number_text(top)}</text>'
        f'<text x="{LEFT - 4}" y="{axis_y}" text-anchor="end">{number_text(bottom)}</text>'
        + (f'<text x="{LEFT - 4}" y="{axis_y + STRIP - 1}" text-anchor="end">none</text>' if missing else "")
        + f'<text x="{LEFT}" y="{height - 3}">{tick_label(low)}</text>'
        f'<text x="{LEFT + PLOT_W}" y="{height - 3}" text-anchor="end">{tick_label(high)}</text>'
    )
    frame = f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}"></rect>'
    failed = sum(1 for t in rollouts if t.has_error)
    masked = sum(1 for t in rollouts if t.reward is not None and t.mask_sample)
    notes = [f"{failed} failed (red)"] if failed else []
    notes += [f"{masked} masked (hollow)"] if masked else []
    notes += [f"{missing} without a reward (below the axis)"] if missing else []
    return (
        f'<figure class="scatter"><svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + PLOT_W + 4}" '
        f'height="{height}" role="img" aria-label="reward against duration">{frame}{labels}{"".join(dots)}</svg>'
        f"<figcaption>reward (up) against duration (across) of {count(len(rollouts), 'rollout trace')}"
        + (f": {', '.join(notes)}" if notes else "")
        + "; click a dot for its waterfall</figcaption></figure>"
    )
