"""``gym-autoinstr view``: a rollout's trace as a waterfall, in the terminal or one HTML page.

Reads what the embedded default wrote (a run directory of per-process OTLP-JSON files,
single files, or standard input), joins the processes' spans by trace, and draws each
trace: service, span name (indented under its parent), start offset, a duration bar,
status and the attributes that matter when reading a rollout (rollout id, route, status
code, model tokens, a Ray task's wait before it started and its node).  A summary line
per trace says where the time went: model calls, tools, verify.

Rollouts collected by Gym's driver are traces of their own, each linked to its job's
``gym.job`` span: traces are grouped by job, a job line (id, counts, how many of its
rollouts are shown) above its rollouts.

Spans are the plain dicts ``files.spans_from_request`` yields.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

KEY_ATTRIBUTES = (
    ("nemo.gym.rollout.id", "rollout"),
    ("http.route", "route"),
    ("http.response.status_code", "status"),
    ("gen_ai.request.model", "model"),
    ("gen_ai.usage.input_tokens", "in_tokens"),
    ("gen_ai.usage.output_tokens", "out_tokens"),
    ("error.type", "error"),
    ("ray.task.wait.duration", "wait"),
    ("ray.node.id", "node"),
)


def _shown(key: str, value: object) -> str:
    if key == "ray.task.wait.duration" and isinstance(value, (int, float)):
        return f"{value * 1000:.1f}ms"  # how long the Ray task waited to start
    if key == "ray.node.id":
        return str(value)[:8]
    return str(value)


@dataclass
class Row:
    span: dict
    depth: int
    children: list[Row] = field(default_factory=list)


@dataclass
class Trace:
    trace_id: str
    spans: list[dict]
    rows: list[Row]  # depth-first, roots first

    @property
    def start_ns(self) -> int:
        return min(s["start_ns"] for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s["end_ns"] for s in self.spans)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def has_error(self) -> bool:
        return any(s.get("status") == "ERROR" for s in self.spans)

    @property
    def rollout_ids(self) -> set[str]:
        return {
            str(s["attributes"]["nemo.gym.rollout.id"]) for s in self.spans if "nemo.gym.rollout.id" in s["attributes"]
        }

    @property
    def services(self) -> set[str]:
        return {service(s) for s in self.spans}


def service(span: dict) -> str:
    return str((span.get("resource") or {}).get("service.name", "?"))


def duration_ms(span: dict) -> float:
    return max(0, span["end_ns"] - span["start_ns"]) / 1e6


def build_traces(spans: Iterable[dict]) -> list[Trace]:
    by_trace: dict[str, list[dict]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for span in spans:
        key = (span["trace_id"], span["span_id"])
        if key in seen:  # the same file read twice (a directory and a file in it)
            continue
        seen.add(key)
        by_trace[span["trace_id"]].append(span)
    traces = []
    for trace_id, members in by_trace.items():
        ids = {s["span_id"] for s in members}
        children: dict[str, list[dict]] = defaultdict(list)
        roots = []
        for span in members:
            parent = span.get("parent_span_id")
            (children[parent] if parent in ids else roots).append(span)
        rows: list[Row] = []

        def walk(span: dict, depth: int) -> None:
            rows.append(Row(span, depth))
            for child in sorted(children.get(span["span_id"], ()), key=lambda s: s["start_ns"]):
                walk(child, depth + 1)

        for root in sorted(roots, key=lambda s: s["start_ns"]):
            walk(root, 0)
        traces.append(Trace(trace_id, members, rows))
    return sorted(traces, key=lambda t: t.start_ns)


JOB_SPAN = "gym.job"


@dataclass
class Job:
    """A root ``gym.job`` span, its own trace, and the rollout traces linked to it."""

    span: dict
    trace: Trace | None = None  # the job's own trace, when selected
    rollouts: list[Trace] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        return str(self.span["attributes"].get("nemo.gym.job.id", self.span["span_id"]))

    @property
    def traces(self) -> list[Trace]:
        """What is drawn under the job line: its own trace unless it is the job span alone
        (the line says it all), then its rollouts."""
        own = [self.trace] if self.trace is not None and len(self.trace.spans) > 1 else []
        return own + self.rollouts


def _linked_job(trace: Trace, jobs: dict[tuple[str, str], Job]) -> Job | None:
    for row in trace.rows:
        if row.depth:
            continue
        for link in row.span.get("links") or ():
            job = jobs.get((link.get("trace_id"), link.get("span_id")))
            if job is not None:
                return job
    return None


def group_by_job(traces: Sequence[Trace], everything: Sequence[Trace]) -> list[Job | Trace]:
    """``traces`` in order, with each job's own trace and every trace whose root links to
    the job's ``gym.job`` span (found in ``everything``) gathered under one job line."""
    jobs: dict[tuple[str, str], Job] = {}
    for trace in everything:
        for span in trace.spans:
            if span["name"] == JOB_SPAN and span.get("parent_span_id") is None:
                jobs[(span["trace_id"], span["span_id"])] = Job(span)
    own = {job.span["trace_id"]: job for job in jobs.values()}
    items: list[Job | Trace] = []
    shown: set[int] = set()
    for trace in traces:
        job = own.get(trace.trace_id)
        if job is not None:
            job.trace = trace
        else:
            job = _linked_job(trace, jobs)
            if job is None:
                items.append(trace)
                continue
            job.rollouts.append(trace)
        if id(job) not in shown:
            shown.add(id(job))
            items.append(job)
    return items


def job_line(job: Job) -> str:
    attributes = job.span.get("attributes") or {}
    counts = " ".join(
        f"{label}={attributes[key]}"
        for key, label in (
            ("nemo.gym.job.rollouts.sent", "sent"),
            ("nemo.gym.job.rollouts.failed", "failed"),
            ("nemo.gym.job.num_repeats", "repeats"),
        )
        if key in attributes
    )
    return (
        f"job {job.job_id}  {service(job.span)}  {duration_ms(job.span):.1f} ms  {counts}".rstrip()
        + f"  | {len(job.rollouts)} linked rollout traces below (job trace {job.span['trace_id']})"
    )


def select(
    traces: Sequence[Trace],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    trace_id: str | None = None,
) -> list[Trace]:
    chosen = list(traces)
    if trace_id is not None:
        chosen = [t for t in chosen if t.trace_id == trace_id.lower()]
    if rollout is not None:
        chosen = [t for t in chosen if rollout in t.rollout_ids]
    if errors:
        chosen = [t for t in chosen if t.has_error]
    if slowest is not None:
        chosen = sorted(chosen, key=lambda t: t.duration_ms, reverse=True)[:slowest]
    return chosen


def _server_type(span: dict) -> str:
    return str((span.get("resource") or {}).get("nemo.gym.server.type", ""))


def summary(trace: Trace) -> dict[str, float]:
    """Milliseconds of the trace spent in model calls, tools and verify.

    Counted from the SERVER spans of the callee (what the model server, or the
    resources server, spent on the request), so nested spans are not counted twice.
    """
    totals = {"total": trace.duration_ms, "model": 0.0, "tools": 0.0, "verify": 0.0}
    for span in trace.spans:
        if span.get("kind") != "SERVER":
            continue
        route = str(span["attributes"].get("http.route") or span["name"].partition(" ")[2])
        kind = _server_type(span)
        if kind == "responses_api_models":
            totals["model"] += duration_ms(span)
        elif kind == "resources_servers":
            if route.endswith("/verify"):
                totals["verify"] += duration_ms(span)
            elif not route.endswith(("/seed_session", "/aggregate_metrics")):
                totals["tools"] += duration_ms(span)
    return totals


def _summary_text(trace: Trace) -> str:
    parts = summary(trace)
    return (
        f"total {parts['total']:.1f} ms | model {parts['model']:.1f} ms | tools {parts['tools']:.1f} ms"
        f" | verify {parts['verify']:.1f} ms"
    )


def _key_attributes(span: dict) -> str:
    attributes = span.get("attributes") or {}
    return " ".join(f"{label}={_shown(key, attributes[key])}" for key, label in KEY_ATTRIBUTES if key in attributes)


def render_text(trace: Trace, *, bar_width: int = 24) -> str:
    start, total = trace.start_ns, max(trace.end_ns - trace.start_ns, 1)
    rollouts = ", ".join(sorted(trace.rollout_ids))
    lines = [
        f"trace {trace.trace_id}  {len(trace.spans)} spans, {len(trace.services)} services"
        + (f", rollout {rollouts}" if rollouts else "")
        + (", ERROR" if trace.has_error else ""),
        f"  {_summary_text(trace)}",
    ]
    service_width = max(len(service(r.span)) for r in trace.rows)
    name_width = max(len(r.span["name"]) + 2 * r.depth for r in trace.rows)
    for row in trace.rows:
        span = row.span
        offset = (span["start_ns"] - start) / 1e6
        left = int(bar_width * (span["start_ns"] - start) / total)
        width = max(1, int(round(bar_width * (span["end_ns"] - span["start_ns"]) / total)))
        bar = " " * left + "█" * min(width, bar_width - left)
        status = "ERROR" if span.get("status") == "ERROR" else ""
        name = "  " * row.depth + span["name"]
        lines.append(
            f"  {service(span):<{service_width}}  {name:<{name_width}}  +{offset:8.1f} ms {duration_ms(span):8.1f} ms"
            f" |{bar:<{bar_width}}| {status:<5} {_key_attributes(span)}".rstrip()
        )
    return "\n".join(lines)


def render_html(traces: Sequence[Trace | Job], *, title: str = "gym-autoinstr traces") -> str:
    """One self-contained page: no scripts or styles from the network."""
    sections = []
    flat: list[Trace] = []
    for item in traces:
        if isinstance(item, Job):
            sections.append(
                f'<h2 class="job" data-job-id="{html.escape(item.job_id)}" '
                f'data-trace-id="{html.escape(item.span["trace_id"])}">{html.escape(job_line(item))}</h2>'
            )
            members = item.traces
            flat.extend(members)
        else:
            flat.append(item)
            members = [item]
        sections.extend(_html_trace(trace) for trace in members)
    traces = flat
    return _html_page(title, traces, sections)


def _html_trace(trace: Trace) -> str:
    start, total = trace.start_ns, max(trace.end_ns - trace.start_ns, 1)
    rows = []
    for row in trace.rows:
        span = row.span
        width = max(0.3, 100.0 * (span["end_ns"] - span["start_ns"]) / total)
        # a bar never leaves its cell (the minimum width of a span at the very end would)
        left = max(0.0, min(100.0 * (span["start_ns"] - start) / total, 100.0 - width))
        attributes = "".join(
            f"<tr><th>{html.escape(str(k))}</th>"
            f"<td>{html.escape(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
            for k, v in sorted((span.get("attributes") or {}).items())
        )
        error = span.get("status") == "ERROR"
        kind = str(span.get("kind", ""))
        service_name = html.escape(service(span))
        name = html.escape(span["name"])
        rows.append(
            f'<details class="span{" error" if error else ""}" data-span-id="{html.escape(span["span_id"])}" '
            f'data-kind="{html.escape(kind)}">'
            f'<summary><span class="service" title="{service_name}">{service_name}</span>'
            f'<span class="name" style="padding-left:{row.depth * 14}px" '
            f'title="{name} ({html.escape(kind)})">{name}</span>'
            f'<span class="bar-cell"><span class="bar" style="left:{left:.2f}%;width:{width:.2f}%"></span></span>'
            f'<span class="duration">{duration_ms(span):.1f} ms</span></summary>'
            f'<table class="attributes">{attributes}</table></details>'
        )
    rollouts = ", ".join(sorted(trace.rollout_ids))
    return (
        f'<section class="trace{" error" if trace.has_error else ""}" data-trace-id="{html.escape(trace.trace_id)}">'
        f"<h2>trace {html.escape(trace.trace_id)}"
        f"{' · rollout ' + html.escape(rollouts) if rollouts else ''}"
        f"{' · <span class=flag>ERROR</span>' if trace.has_error else ''}</h2>"
        f'<p class="summary">{html.escape(_summary_text(trace))} · {len(trace.spans)} spans · '
        f"{len(trace.services)} services</p>{''.join(rows)}</section>"
    )


def _html_page(title: str, traces: Sequence[Trace], sections: list[str]) -> str:
    style = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}h2{font-size:14px;margin:18px 0 2px}.summary{color:#555;margin:0 0 6px}
.legend{color:#555}.legend i{display:inline-block;width:18px;height:8px;margin:0 4px 0 12px;border-radius:2px}
.flag{color:#b00}
details.span summary{display:grid;grid-template-columns:330px 320px 1fr 90px;gap:8px;cursor:pointer;padding:1px 0;
list-style:none}details.span summary::-webkit-details-marker{display:none}
details.span summary:hover{background:#f3f6fa}
.service{color:#456;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.name::before{content:"\\25B8";display:inline-block;width:12px;color:#999}details[open] .name::before{content:"\\25BE"}
.bar-cell{position:relative;background:#f4f4f4}
.bar{position:absolute;top:3px;bottom:3px;background:#4a8fd8;border-radius:2px}
[data-kind=CLIENT] .bar,i.client{background:#a3c6ec}[data-kind=INTERNAL] .bar,i.internal{background:#52a88a}
i.server{background:#4a8fd8}details.error .bar,i.error{background:#d84a4a}
details.error .name{color:#b00}.duration{text-align:right;font-variant-numeric:tabular-nums}
table.attributes{margin:2px 0 8px 340px;border-collapse:collapse}table.attributes th{text-align:left;color:#555;
font-weight:normal;padding-right:12px}table.attributes td{font-family:monospace}
"""
    legend = (
        '<p class="legend">'
        + "".join(
            f'<i class="{c}"></i>{label}'
            for c, label in (("server", "SERVER"), ("client", "CLIENT"), ("internal", "INTERNAL"), ("error", "ERROR"))
        )
        + " · click a row for its attributes</p>"
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<p class="count">{len(traces)} traces</p>{legend}{"".join(sections)}</body></html>'
    )


def main(
    paths: Sequence[str],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    html_file: str | None = None,
    metrics: bool = False,
    trace_id: str | None = None,
) -> int:
    import sys
    from pathlib import Path

    from gym_autoinstr.commands import slow
    from gym_autoinstr.setup.files import read_path

    if metrics:
        text = slow.render_text(slow.summary_for(paths or ["."]))
        if not text:
            print(
                "no metrics found (the embedded default writes *.metrics.jsonl into the run directory)", file=sys.stderr
            )
            return 1
        print(text)
        return 0

    spans: list[dict] = []
    for path in paths or ["."]:
        target = Path(path)
        if str(path) != "-" and not target.exists():
            print(f"gym-autoinstr view: {path}: no such file or directory", file=sys.stderr)
            return 2
        spans.extend(read_path(target))
    everything = build_traces(spans)
    traces = select(everything, rollout=rollout, slowest=slowest, errors=errors, trace_id=trace_id)
    if not traces:
        print(
            "no traces found" + (" matching the filters" if (rollout or slowest or errors or trace_id) else ""),
            file=sys.stderr,
        )
        return 1
    if html_file:
        page = render_html(group_by_job(traces, everything))
        why_slow = slow.render_html(slow.summary_for([p for p in (paths or ["."]) if p != "-"]))
        if why_slow:
            page = page.replace("</body>", why_slow + "</body>", 1)
        Path(html_file).write_text(page, encoding="utf-8")
        print(f"wrote {len(traces)} traces to {html_file}")
        return 0
    blocks = []
    for item in group_by_job(traces, everything):
        if isinstance(item, Job):
            blocks.append(job_line(item))
            blocks.extend(render_text(t) for t in item.traces)
        else:
            blocks.append(render_text(item))
    print("\n\n".join(blocks))
    return 0
