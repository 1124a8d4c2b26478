"""``view --html``: one self-contained page (inline style, script and SVG, nothing from
the network): an index of every trace with search, filters and sorting, a histogram of
durations and a chart of reward against duration (``index``, ``charts``), then the
waterfalls of the traces drawn, with a time axis, collapsible subtrees, span and
resource attributes."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

from gym_autoinstr.commands.view.charts import tick_label
from gym_autoinstr.commands.view.index import INDEX_SCRIPT, STARTUP_HEADING, html_index
from gym_autoinstr.commands.view.model import Job, Trace, callee, display_name, duration_ms, service
from gym_autoinstr.commands.view.text import count, job_line, summary_text

# The page inlines this many traces' waterfalls by default (about 13-20 kB each); the
# index lists every trace.  Keeps a 16k-rollout job's page near 20 MB, not 200 MB or more.
DEFAULT_MAX_DETAIL = 800


def render_html(
    traces: Sequence[Trace | Job],
    *,
    title: str = "gym-autoinstr traces",
    index: Sequence[Trace] | None = None,
    hint: str = "",
) -> str:
    """One self-contained page: no scripts, styles or images from the network.

    ``traces``: what is drawn in detail (job headings above their traces); ``index``:
    every trace the page lists (default: those drawn); ``hint``: how to see a trace that
    is listed but not drawn."""
    sections, startup_sections = [], []
    flat: list[Trace] = []
    for item in traces:
        if isinstance(item, Job):
            sections.append(
                f'<h2 class="job" data-job-id="{html.escape(item.job_id)}" '
                f'data-trace-id="{html.escape(item.span["trace_id"])}">{html.escape(job_line(item))}</h2>'
            )
            members = item.traces
        else:
            members = [item]
        flat.extend(members)
        for trace in members:
            (startup_sections if trace.is_startup else sections).append(_html_trace(trace))
    if startup_sections:  # after the rest: the page opens on a rollout (or its job), not on a start-up
        sections.append(f'<h2 class="startup">{STARTUP_HEADING}: {len(startup_sections)}</h2>')
        sections.extend(startup_sections)
    listed = list(index) if index is not None else flat
    return _html_page(title, flat, listed, sections, hint)


def _attribute_rows(attributes: dict) -> str:
    return "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
        for k, v in sorted(attributes.items())
    )


def _html_axis(total_ms: float) -> str:
    ticks = "".join(
        f'<span class="tick" style="left:{share * 100:.0f}%">'
        f'<span class="tick-label">{tick_label(total_ms * share)}</span></span>'
        for share in (0, 0.25, 0.5, 0.75, 1)
    )
    return (
        '<div class="axis" title="time since the trace started"><span></span><span class="axis-label">time</span>'
        f'<span class="axis-cell">{ticks}</span><span></span></div>'
    )


def _html_resources(trace: Trace) -> str:
    by_service: dict[str, dict] = {}
    for span in trace.spans:
        by_service.setdefault(service(span), span.get("resource") or {})
    tables = "".join(
        f'<h4>{html.escape(name)}</h4><table class="attributes">{_attribute_rows(resource)}</table>'
        for name, resource in sorted(by_service.items())
    )
    return (
        f'<div class="resources"><details><summary>resource attributes ({count(len(by_service), "service")})</summary>'
        f"{tables}</details></div>"
    )


def _html_trace(trace: Trace) -> str:
    start, total = trace.start_ns, max(trace.end_ns - trace.start_ns, 1)
    has_children = {r.span.get("parent_span_id") for r in trace.rows if r.depth}
    rows = []
    for row in trace.rows:
        span = row.span
        width = max(0.3, 100.0 * (span["end_ns"] - span["start_ns"]) / total)
        # a bar never leaves its cell (the minimum width of a span at the very end would)
        left = max(0.0, min(100.0 * (span["start_ns"] - start) / total, 100.0 - width))
        error = span.get("status") == "ERROR"
        kind = str(span.get("kind", ""))
        service_name = html.escape(service(span))
        name = html.escape(span["name"])
        target = callee(span)
        fold = (
            '<button class="fold" type="button" title="collapse or expand the spans below">−</button>'
            if span["span_id"] in has_children
            else '<span class="nofold"></span>'
        )
        rows.append(
            f'<details class="span{" error" if error else ""}" data-span-id="{html.escape(span["span_id"])}" '
            f'data-kind="{html.escape(kind)}" data-depth="{row.depth}">'
            f'<summary><span class="service" title="{service_name}">{service_name}</span>'
            f'<span class="name" style="padding-left:{row.depth * 14}px" '
            f'title="{html.escape(display_name(span))} ({html.escape(kind)})">{fold}<span class="label">{name}</span>'
            + (f' <span class="callee">{html.escape(target)}</span>' if target else "")
            + "</span>"
            f'<span class="bar-cell"><span class="bar" style="left:{left:.2f}%;width:{width:.2f}%"></span></span>'
            f'<span class="duration">{duration_ms(span):.1f} ms</span></summary>'
            f'<table class="attributes">{_attribute_rows(span.get("attributes") or {})}</table></details>'
        )
    rollouts = ", ".join(sorted(trace.rollout_ids))
    return (
        f'<section class="trace{" error" if trace.has_error else ""}" id="t-{html.escape(trace.trace_id)}" '
        f'data-trace-id="{html.escape(trace.trace_id)}">'
        f"<h2>trace {html.escape(trace.trace_id)}"
        f"{' · rollout ' + html.escape(rollouts) if rollouts else ''}"
        f"{' · <span class=flag>ERROR</span>' if trace.has_error else ''}</h2>"
        f'<p class="summary">{html.escape(summary_text(trace))} · {count(len(trace.spans), "span")} · '
        f"{count(len(trace.services), 'service')}</p>{_html_resources(trace)}{_html_axis(trace.duration_ms)}"
        f"{''.join(rows)}</section>"
    )


FOLD_SCRIPT = """
(function () {
  function refold(section) {
    var fold = Infinity;
    section.querySelectorAll(':scope > details.span').forEach(function (row) {
      var depth = +row.dataset.depth;
      if (depth <= fold) fold = Infinity;
      row.hidden = depth > fold;
      if (!row.hidden && row.classList.contains('folded')) fold = depth;
    });
  }
  document.addEventListener('click', function (event) {
    var button = event.target.closest && event.target.closest('button.fold');
    if (!button) return;
    event.preventDefault();
    event.stopPropagation();
    var row = button.closest('details.span');
    var folded = row.classList.toggle('folded');
    button.textContent = folded ? '+' : '\\u2212';
    refold(row.parentNode);
  }, true);
})();
"""


def _html_page(title: str, traces: Sequence[Trace], listed: Sequence[Trace], sections: list[str], hint: str) -> str:
    style = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}[hidden]{display:none!important}
h1{font-size:18px;margin:0 0 4px}h2{font-size:14px;margin:18px 0 2px}.summary{color:#555;margin:0 0 6px}
h4{margin:6px 0 2px;font-size:12px}
.legend{color:#555}.legend i{display:inline-block;width:18px;height:8px;margin:0 4px 0 12px;border-radius:2px}
.flag{color:#b00}.note{background:#fff6d8;border:1px solid #e8d48a;padding:6px 8px;display:inline-block}
.index-table{max-height:420px;overflow:auto;border:1px solid #ddd}
table#index{border-collapse:collapse;width:100%;table-layout:fixed}
table#index thead th{position:sticky;top:0;background:#f4f4f4;text-align:left}
table#index td,table#index th{padding:1px 8px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
table#index tr.error td{color:#b00}table#index tr.group th{text-align:left;background:#fafafa;color:#555;
font-weight:normal;padding-top:6px}table.metrics tr.group th{text-align:left;font-weight:normal;color:#555;
padding-top:6px}
table#index td.num{text-align:right;font-variant-numeric:tabular-nums}
figure.chart{margin:8px 0}figure.chart rect{fill:#4a8fd8}figure.chart text{font-size:11px;fill:#555}
.charts{display:flex;flex-wrap:wrap;gap:0 28px;align-items:flex-start}.charts figure{max-width:484px}
figure.scatter{margin:8px 0}
figure.scatter rect.plot{fill:#fafafa;stroke:#ddd}figure.scatter text{font-size:11px;fill:#555}
figure.scatter circle{fill:#4a8fd8;fill-opacity:.6;cursor:pointer}
figure.scatter circle.error{fill:#d84a4a;fill-opacity:1}
figure.scatter circle.masked{fill:none;stroke:#4a8fd8;stroke-width:1.2}
figure.scatter circle.error.masked{stroke:#d84a4a}
figure.scatter circle.off{display:none}.masked-note{color:#555;font-size:12px;margin:0 0 4px}
#where.invalid{outline:2px solid #d84a4a}details.tasks{margin:4px 0 8px}details.tasks summary{cursor:pointer;color:#555}
table.tasks{border-collapse:collapse;margin-top:4px}table.tasks td,table.tasks th{padding:1px 10px;text-align:right;
font-variant-numeric:tabular-nums}table.tasks tbody tr{cursor:pointer}table.tasks tbody tr:hover{background:#f3f6fa}
table.tasks tfoot td{border-top:1px solid #ccc;font-weight:600}.tasks-note{color:#555;font-size:12px}
#index th[data-sort]{cursor:pointer}
#index th.sorted::after{content:" \\25BC"}#index th.sorted.ascending::after{content:" \\25B2"}
figcaption{color:#555;font-size:12px}#shown-count{margin-left:12px;color:#555}
details.span summary,.axis{display:grid;grid-template-columns:330px 320px 1fr 90px;gap:8px;padding:1px 0}
details.span summary{cursor:pointer;list-style:none}details.span summary::-webkit-details-marker{display:none}
details.span summary:hover{background:#f3f6fa}
.axis{color:#777;font-size:11px;border-bottom:1px solid #ddd}.axis-label{text-align:right}
.axis-cell{position:relative;height:16px}.tick{position:absolute;top:0;bottom:0;border-left:1px solid #bbb}
.tick-label{position:absolute;left:2px;white-space:nowrap}
.tick:last-child .tick-label{left:auto;right:2px}
.service{color:#456;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}.callee{color:#357}
button.fold{font:inherit;width:16px;height:16px;line-height:12px;padding:0;margin-right:4px;border:1px solid #bbb;
background:#fff;border-radius:3px;cursor:pointer}.nofold{display:inline-block;width:20px}
.bar-cell{position:relative;background:#f4f4f4}
.bar{position:absolute;top:3px;bottom:3px;background:#4a8fd8;border-radius:2px}
[data-kind=CLIENT] .bar,i.client{background:#a3c6ec}[data-kind=INTERNAL] .bar,i.internal{background:#52a88a}
i.server{background:#4a8fd8}details.error .bar,i.error{background:#d84a4a}
details.error .name{color:#b00}.duration{text-align:right;font-variant-numeric:tabular-nums}
table.attributes{margin:2px 0 8px 340px;border-collapse:collapse}table.attributes th{text-align:left;color:#555;
font-weight:normal;padding-right:12px}table.attributes td{font-family:monospace}
.resources table.attributes{margin-left:16px}.resources summary{cursor:pointer;color:#555}
"""
    legend = (
        '<p class="legend">'
        + "".join(
            f'<i class="{c}"></i>{label}'
            for c, label in (("server", "SERVER"), ("client", "CLIENT"), ("internal", "INTERNAL"), ("error", "ERROR"))
        )
        + " · click a row for its attributes, its − button to fold the spans below it</p>"
    )
    note = ""
    if len(traces) < len(listed):
        note = (
            f'<p class="note">{len(traces)} of the {len(listed)} traces listed are drawn on this page '
            f"(errors and the slowest first, to keep the file small). {html.escape(hint)}</p>"
        )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<p class="count">{count(len(listed), "trace")} listed, {len(traces)} drawn</p>{note}'
        f"{html_index(listed, {t.trace_id for t in traces})}{legend}{''.join(sections)}"
        f"<script>{INDEX_SCRIPT}{FOLD_SCRIPT}</script></body></html>"
    )


def detail_for_page(traces: Sequence[Trace], limit: int) -> list[Trace]:
    """The traces a page draws: all of them up to ``limit``; beyond, the errors and then the
    slowest, ``limit`` in all, in start order."""
    if len(traces) <= limit:
        return list(traces)
    ranked = sorted(traces, key=lambda t: (not t.has_error, -t.duration_ms))[:limit]
    keep = {id(t) for t in ranked}
    return [t for t in traces if id(t) in keep]
