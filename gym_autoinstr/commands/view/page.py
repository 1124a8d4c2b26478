"""``view --html``: one self-contained page (inline style, script and SVG, nothing from
the network): an index of every trace with search and filters, a histogram of durations,
then the waterfalls of the traces drawn, with a time axis, collapsible subtrees, span and
resource attributes."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

from gym_autoinstr.commands.view.model import Job, Trace, callee, display_name, duration_ms, service, short_service
from gym_autoinstr.commands.view.text import (
    ID_SHOWN,
    clock,
    count,
    duration_text,
    job_line,
    status_text,
    summary_text,
    tokens_text,
)

# The page inlines this many traces' waterfalls by default (about 13-20 kB each); the
# index lists every trace.  Keeps a 16k-rollout job's page near 20 MB, not 200 MB or more.
DEFAULT_MAX_DETAIL = 800
STARTUP_HEADING = "Start-up traces (processes starting, not rollouts)"


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


def _tick_label(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _html_axis(total_ms: float) -> str:
    ticks = "".join(
        f'<span class="tick" style="left:{share * 100:.0f}%">'
        f'<span class="tick-label">{_tick_label(total_ms * share)}</span></span>'
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


def _index_row(trace: Trace, drawn: set[str]) -> str:
    trace_id = html.escape(trace.trace_id)
    services = sorted(short_service(s) for s in trace.services)
    ident = (
        f'<a href="#t-{trace_id}">{trace_id[:ID_SHOWN]}</a>'
        if trace.trace_id in drawn
        else f'<span title="not drawn on this page">{trace_id[:ID_SHOWN]}</span>'
    )
    root = html.escape(display_name(trace.root))
    names = html.escape(", ".join(services))
    rollouts = html.escape(", ".join(sorted(trace.rollout_ids)))
    return (
        f'<tr class="{"error " if trace.has_error else ""}{"startup" if trace.is_startup else "run"}" '
        f'data-trace-id="{trace_id}" data-status="{"error" if trace.has_error else "ok"}" '
        f'data-services="{html.escape(" ".join(services))}">'
        f'<td>{ident}</td><td>{clock(trace.start_ns)}</td><td class="root" title="{root}">{root}</td>'
        f'<td class="services" title="{names}">{names}</td><td class=num>{len(trace.spans)}</td>'
        f"<td class=num>{html.escape(duration_text(trace.duration_ms))}</td><td>{status_text(trace)}</td>"
        f'<td class=num>{tokens_text(trace)}</td><td class="rollout" title="{rollouts}">{rollouts}</td>'
        f"<td>{'start-up' if trace.is_startup else ''}</td></tr>"
    )


# The index's columns: fixed widths for the short ones, so a long root or service list is
# cut (whole in its tooltip) instead of pushing duration and status out of the window.
INDEX_COLUMNS = (
    ("trace", "9.5em"),
    ("start (UTC)", "8.5em"),
    ("root", ""),
    ("services", ""),
    ("spans", "5em"),
    ("duration", "7em"),
    ("status", "5em"),
    ("tokens", "6.5em"),
    ("rollout", "6em"),
    ("", "6em"),
)


def _html_index(listed: Sequence[Trace], drawn: set[str]) -> str:
    """Every trace listed: the rollouts (and jobs' own traces) first, start-up traces in a
    group of their own below."""
    rows = "".join(_index_row(t, drawn) for t in listed if not t.is_startup)
    startup = [t for t in listed if t.is_startup]
    if startup:
        rows += (
            f'</tbody><tbody class="startup"><tr class="group"><th colspan="{len(INDEX_COLUMNS)}">'
            f"{STARTUP_HEADING}: {len(startup)}</th></tr>" + "".join(_index_row(t, drawn) for t in startup)
        )
    all_services = sorted({short_service(s) for t in listed for s in t.services})
    options = "".join(f'<option value="{html.escape(s)}">{html.escape(s)}</option>' for s in all_services)
    columns = "".join(f'<col style="width:{width}">' if width else "<col>" for _name, width in INDEX_COLUMNS)
    heads = "".join(f"<th>{html.escape(name)}</th>" for name, _width in INDEX_COLUMNS)
    return (
        '<section class="index"><h2>Traces</h2><p class="controls">'
        '<input id="search" type="search" placeholder="search: trace id, root span, service, rollout" size="44"> '
        '<select id="status-filter"><option value="">any status</option><option value="ok">ok</option>'
        '<option value="error">error</option></select> '
        f'<select id="service-filter"><option value="">any service</option>{options}</select> '
        '<label><input id="startup-filter" type="checkbox" checked> start-up traces</label>'
        f'<span id="shown-count">{len(listed)} of {len(listed)} shown</span></p>'
        f"{_duration_chart(listed)}"
        f'<div class="index-table"><table id="index"><colgroup>{columns}</colgroup><thead><tr>{heads}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


def _duration_chart(listed: Sequence[Trace], bins: int = 24) -> str:
    """An inline SVG histogram of the rollout traces' durations: a job's own trace lasts
    the whole job and a start-up tens of seconds, either would squeeze every rollout into
    one bar."""
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
        f'height="{chart_h * c / peak:.1f}"><title>{_tick_label(low + span * i / bins)} – '
        f"{_tick_label(low + span * (i + 1) / bins)}: {count(c, 'trace')}</title></rect>"
        for i, c in enumerate(counts)
        if c
    )
    return (
        f'<figure class="chart"><svg xmlns="http://www.w3.org/2000/svg" width="{chart_w}" height="{chart_h + 16}" '
        f'role="img" aria-label="rollout trace durations">{bars}'
        f'<text x="0" y="{chart_h + 13}">{_tick_label(low)}</text>'
        f'<text x="{chart_w}" y="{chart_h + 13}" text-anchor="end">{_tick_label(high)}</text></svg>'
        f"<figcaption>durations of {count(len(durations), 'rollout trace')} (the job's own and start-up traces "
        f"aside); tallest bar {peak}"
        "</figcaption></figure>"
    )


PAGE_SCRIPT = """
(function () {
  var search = document.getElementById('search');
  var statusFilter = document.getElementById('status-filter');
  var serviceFilter = document.getElementById('service-filter');
  var startupFilter = document.getElementById('startup-filter');
  var counter = document.getElementById('shown-count');
  var rows = Array.prototype.slice.call(document.querySelectorAll('#index tbody tr[data-trace-id]'));
  var startupHeadings = document.querySelectorAll('#index tr.group, h2.startup');
  var sections = {};
  document.querySelectorAll('section.trace').forEach(function (s) { sections[s.dataset.traceId] = s; });
  function apply() {
    var words = search.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var status = statusFilter.value, svc = serviceFilter.value, startup = startupFilter.checked, shown = 0;
    rows.forEach(function (row) {
      var text = row.textContent.toLowerCase() + ' ' + row.dataset.traceId;
      var keep = words.every(function (w) { return text.indexOf(w) >= 0; })
        && (!status || row.dataset.status === status)
        && (!svc || row.dataset.services.split(' ').indexOf(svc) >= 0)
        && (startup || !row.classList.contains('startup'));
      row.hidden = !keep;
      var section = sections[row.dataset.traceId];
      if (section) section.hidden = !keep;
      if (keep) shown += 1;
    });
    startupHeadings.forEach(function (heading) { heading.hidden = !startup; });
    counter.textContent = shown + ' of ' + rows.length + ' shown';
  }
  [search, statusFilter, serviceFilter, startupFilter].forEach(function (control) {
    control.addEventListener('input', apply);
    control.addEventListener('change', apply);
  });
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
  apply();
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
        f"{_html_index(listed, {t.trace_id for t in traces})}{legend}{''.join(sections)}"
        f"<script>{PAGE_SCRIPT}</script></body></html>"
    )


def detail_for_page(traces: Sequence[Trace], limit: int) -> list[Trace]:
    """The traces a page draws: all of them up to ``limit``; beyond, the errors and then the
    slowest, ``limit`` in all, in start order."""
    if len(traces) <= limit:
        return list(traces)
    ranked = sorted(traces, key=lambda t: (not t.has_error, -t.duration_ms))[:limit]
    keep = {id(t) for t in ranked}
    return [t for t in traces if id(t) in keep]
