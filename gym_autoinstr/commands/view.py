"""``gym-autoinstr view``: the traces of a run, listed, and one trace as a waterfall, in the
terminal or one HTML page.

Reads what the embedded default wrote (a run directory of per-process OTLP-JSON files,
single files, or standard input) and joins the processes' spans by trace.

In the terminal, a run is first a LIST: one line per trace (start, trace id, duration,
span count, status, rollout id, model tokens, root span, services), filtered (service,
attribute, status, rollout) and sorted on request (``--slowest N``, ``--sort duration``);
the processes' start-up traces are listed apart, after the rest.  One trace, chosen by
``--trace`` (any unique prefix of its id) or ``--rollout``, is drawn as a waterfall:
service, span name (indented under its parent; a CLIENT span says which Gym server and
route it called), start offset, a duration bar, status and the attributes that matter
when reading a rollout.  A summary line per trace says where the time went: model calls,
tools, verify.  Every line fits the terminal; ``--json`` prints the same as JSON.

Rollouts collected by Gym's driver are traces of their own, each linked to its job's
``gym.job`` span: traces are grouped by job, a job line (id, counts, how many of its
rollouts are shown) above its rollouts.

The HTML page is one self-contained file (inline style, script and SVG): an index of every
trace with search and filters, a histogram of durations, then the detail of at most
``max_detail`` traces (errors and the slowest first) as waterfalls with a time axis,
collapsible subtrees, span and resource attributes.

Spans are the plain dicts ``files.spans_from_request`` yields.
"""

from __future__ import annotations

import gc
import html
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from operator import itemgetter

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

# What egress puts on a CLIENT span to a Gym server (advice/pool.py; not imported: the
# view reads files and needs none of the runtime).
DESTINATION = "nemo.gym.http.destination.server.name"
DESTINATION_ROUTE = "nemo.gym.http.destination.route"
# Roots of the processes' start-up traces (advice/startup.py): listed apart from rollouts.
STARTUP_SPANS = ("gym.startup", "gym.server.startup")
# The page inlines this many traces' waterfalls by default (about 13-20 kB each); the
# index lists every trace.  Keeps a 16k-rollout job's page near 20 MB, not 200 MB or more.
DEFAULT_MAX_DETAIL = 800
ELLIPSIS = "…"


def _shown(key: str, value: object) -> str:
    if key == "ray.task.wait.duration" and isinstance(value, (int, float)):
        return f"{value * 1000:.1f}ms"  # how long the Ray task waited to start
    if key == "ray.node.id":
        return str(value)[:8]
    return str(value)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, an ellipsis marking what was cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else ""


@dataclass(slots=True)
class Row:
    span: dict
    depth: int


@dataclass
class Trace:
    trace_id: str
    spans: list[dict]
    rows: list[Row]  # depth-first, roots first

    @cached_property
    def start_ns(self) -> int:
        return min(s["start_ns"] for s in self.spans)

    @cached_property
    def end_ns(self) -> int:
        return max(s["end_ns"] for s in self.spans)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @cached_property
    def has_error(self) -> bool:
        return any(s.get("status") == "ERROR" for s in self.spans)

    @cached_property
    def rollout_ids(self) -> set[str]:
        return {
            str(s["attributes"]["nemo.gym.rollout.id"]) for s in self.spans if "nemo.gym.rollout.id" in s["attributes"]
        }

    @cached_property
    def services(self) -> set[str]:
        return {service(s) for s in self.spans}

    @property
    def root(self) -> dict:
        return self.rows[0].span

    @cached_property
    def is_startup(self) -> bool:
        """A process's start-up (``gym env start``, a server coming up), not a rollout."""
        return any(r.depth == 0 and r.span["name"].startswith(STARTUP_SPANS) for r in self.rows)

    @cached_property
    def tokens(self) -> tuple[int, int] | None:
        """Model tokens in and out over the trace's spans, None when no span has them."""
        found, tokens_in, tokens_out = False, 0, 0
        for span in self.spans:
            attributes = span["attributes"]
            if "gen_ai.usage.input_tokens" in attributes or "gen_ai.usage.output_tokens" in attributes:
                found = True
                tokens_in += _int(attributes.get("gen_ai.usage.input_tokens"))
                tokens_out += _int(attributes.get("gen_ai.usage.output_tokens"))
        return (tokens_in, tokens_out) if found else None


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def service(span: dict) -> str:
    return str((span.get("resource") or {}).get("service.name", "?"))


def _short_service(name: str) -> str:
    return name.removeprefix("nemo-gym/")


def duration_ms(span: dict) -> float:
    return max(0, span["end_ns"] - span["start_ns"]) / 1e6


def callee(span: dict) -> str:
    """``→ server /route`` for a CLIENT span: the Gym server it called and the route, else
    the host and path it called ("" for other spans, or when nothing says)."""
    if span.get("kind") != "CLIENT":
        return ""
    attributes = span.get("attributes") or {}
    server = attributes.get(DESTINATION)
    route = attributes.get(DESTINATION_ROUTE)
    if server is None or route is None:  # older files, or a call outside the fleet
        url = str(attributes.get("url.full") or "")
        rest = url.partition("://")[2] if "://" in url else url
        host, slash, path = rest.partition("/")
        server = server or attributes.get("server.address") or host or None
        if route is None and slash:
            path = "/" + path
            if path.startswith("/ng-rollout/"):
                path = "/" + path[len("/ng-rollout/") :].partition("/")[2]
            route = path
    if not server and not route:
        return ""
    return "→ " + " ".join(str(part) for part in (server, route) if part)


def display_name(span: dict) -> str:
    target = callee(span)
    return f"{span['name']} {target}" if target else span["name"]


_START = itemgetter("start_ns")


def build_traces(spans: Iterable[dict]) -> list[Trace]:
    by_trace: dict[str, dict[str, dict]] = defaultdict(dict)
    for span in spans:
        # keyed by span id: the same file read twice (a directory and a file in it) shows each span once
        by_trace[span["trace_id"]][span["span_id"]] = span
    traces = []
    for trace_id, by_id in by_trace.items():
        children: dict[str, list[dict]] = defaultdict(list)
        roots = []
        for span in by_id.values():
            parent = span.get("parent_span_id")
            if parent in by_id:
                children[parent].append(span)
            else:
                roots.append(span)
        rows: list[Row] = []
        # depth-first without recursion: a deep trace must not hit the recursion limit
        roots.sort(key=_START)
        stack = [(root, 0) for root in reversed(roots)]
        while stack:
            span, depth = stack.pop()
            rows.append(Row(span, depth))
            kids = children.get(span["span_id"])
            if kids:
                kids.sort(key=_START)
                stack.extend([(child, depth + 1) for child in reversed(kids)])
        traces.append(Trace(trace_id, list(by_id.values()), rows))
    traces.sort(key=lambda t: t.start_ns)
    return traces


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
        for row in trace.rows:
            if row.depth == 0 and row.span["name"] == JOB_SPAN:
                jobs[(row.span["trace_id"], row.span["span_id"])] = Job(row.span)
    own = {job.span["trace_id"]: job for job in jobs.values()}
    items: list[Job | Trace] = []
    shown: set[int] = set()
    for trace in traces:
        job = own.get(trace.trace_id)
        if job is not None:
            job.trace = trace
        else:
            job = _linked_job(trace, jobs) if jobs else None
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


# ----------------------------------------------------------------------------- selecting


class AmbiguousTrace(ValueError):
    """A ``--trace`` prefix shared by more than one trace."""

    def __init__(self, prefix: str, candidates: list[Trace]) -> None:
        self.prefix, self.candidates = prefix, candidates
        super().__init__(prefix)


def _has_service(trace: Trace, name: str) -> bool:
    return any(s == name or _short_service(s) == name for s in trace.services)


def _has_attribute(trace: Trace, key: str, value: str) -> bool:
    for span in trace.spans:
        for attributes in (span.get("attributes") or {}, span.get("resource") or {}):
            if key in attributes and _text(attributes[key]) == value:
                return True
    return False


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_attribute_filter(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise ValueError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def select(
    traces: Sequence[Trace],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    trace_id: str | None = None,
    service_name: str | None = None,
    attributes: Sequence[tuple[str, str]] = (),
    status: str | None = None,
    sort: str = "start",
) -> list[Trace]:
    """The traces the filters keep, in start order (``sort="duration"``: longest first;
    ``slowest``: the N longest, longest first).  ``trace_id`` is any prefix of one trace's
    id (case-insensitive); a prefix of several raises ``AmbiguousTrace``."""
    chosen = list(traces)
    if trace_id is not None:
        prefix = trace_id.strip().lower()
        chosen = [t for t in chosen if t.trace_id.startswith(prefix)]
        if len(chosen) > 1 and not any(t.trace_id == prefix for t in chosen):
            raise AmbiguousTrace(prefix, chosen)
        chosen = [t for t in chosen if t.trace_id == prefix] or chosen
    if rollout is not None:
        chosen = [t for t in chosen if rollout in t.rollout_ids]
    if service_name is not None:
        chosen = [t for t in chosen if _has_service(t, service_name)]
    for key, value in attributes:
        chosen = [t for t in chosen if _has_attribute(t, key, value)]
    if errors or status == "error":
        chosen = [t for t in chosen if t.has_error]
    elif status == "ok":
        chosen = [t for t in chosen if not t.has_error]
    if slowest is not None:
        chosen = sorted(chosen, key=lambda t: t.duration_ms, reverse=True)[:slowest]
    elif sort == "duration":
        chosen = sorted(chosen, key=lambda t: t.duration_ms, reverse=True)
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


# ----------------------------------------------------------------------------- the list


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _duration(ms: float) -> str:
    if ms >= 100_000:
        return f"{ms / 1000:.0f} s"
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.1f} ms"


def _tokens_text(trace: Trace) -> str:
    return f"{trace.tokens[0]}/{trace.tokens[1]}" if trace.tokens else ""


def _status_text(trace: Trace) -> str:
    return "ERROR" if trace.has_error else "ok"


ID_SHOWN = 12  # characters of a trace id in the list: enough to be unique, and a --trace prefix


def list_lines(traces: Sequence[Trace], width: int) -> list[str]:
    """A header and one line per trace, each at most ``width`` columns."""
    rollout_width = min(max([len(", ".join(sorted(t.rollout_ids))) for t in traces] + [7]), 14)
    token_width = min(max([len(_tokens_text(t)) for t in traces] + [6]), 15)
    fixed = 12 + 2 + ID_SHOWN + 2 + 9 + 2 + 5 + 2 + 5 + 2 + rollout_width + 2 + token_width + 2
    roots = [display_name(t.root) for t in traces]
    services = [",".join(sorted(_short_service(s) for s in t.services)) for t in traces]
    root_width = max(4, min(max([len(r) for r in roots] + [4]), max(12, (width - fixed) * 3 // 5)))

    def line(start, trace_id, took, spans, status, rollout, tokens, root, names) -> str:
        text = (
            f"{start:<12}  {trace_id:<{ID_SHOWN}}  {took:>9}  {spans:>5}  {status:<5}  "
            f"{cut(rollout, rollout_width):<{rollout_width}}  {tokens:>{token_width}}  "
            f"{cut(root, root_width):<{root_width}}  {names}"
        )
        return cut(text.rstrip(), width)

    lines = [line("start (UTC)", "trace", "duration", "spans", "status", "rollout", "tokens", "root", "services")]
    for trace, root, names in zip(traces, roots, services):
        lines.append(
            line(
                _clock(trace.start_ns),
                trace.trace_id[:ID_SHOWN],
                _duration(trace.duration_ms),
                str(len(trace.spans)),
                _status_text(trace),
                ", ".join(sorted(trace.rollout_ids)),
                _tokens_text(trace),
                root,
                names,
            )
        )
    return lines


def render_list(items: Sequence[Job | Trace], startup: Sequence[Trace], width: int) -> list[str]:
    """The run as a list: its traces (job lines above their rollouts), then the start-up
    traces apart."""
    traces: list[Trace] = []
    for item in items:
        traces.extend(item.traces if isinstance(item, Job) else [item])
    lines: list[str] = []
    if traces:
        table = iter(list_lines(traces, width))
        lines.append(next(table))
        for item in items:
            if isinstance(item, Job):
                lines.append(cut(job_line(item), width))
                lines.extend(next(table) for _ in item.traces)
            else:
                lines.append(next(table))
    if startup:
        if lines:
            lines.append("")
        lines.append(cut(f"start-up traces (processes starting, not rollouts): {len(startup)}", width))
        lines.extend(list_lines(startup, width))
    lines.append("")
    lines.append(cut("one trace as a waterfall: --trace ID (any unique prefix) or --rollout ID", width))
    return lines


def trace_record(trace: Trace, *, with_spans: bool = False) -> dict:
    """The trace for ``--json``: its list line's fields (and its spans, depth-first)."""
    record = {
        "trace_id": trace.trace_id,
        "start_ns": trace.start_ns,
        "start": datetime.fromtimestamp(trace.start_ns / 1e9, tz=timezone.utc).isoformat(),
        "duration_ms": trace.duration_ms,
        "root": trace.root["name"],
        "services": sorted(trace.services),
        "span_count": len(trace.spans),
        "status": "error" if trace.has_error else "ok",
        "tokens": {"input": trace.tokens[0], "output": trace.tokens[1]} if trace.tokens else None,
        "rollout_ids": sorted(trace.rollout_ids),
        "startup": trace.is_startup,
        "summary_ms": summary(trace),
    }
    if with_spans:
        record["spans"] = [{**row.span, "depth": row.depth, "callee": callee(row.span) or None} for row in trace.rows]
    return record


# ----------------------------------------------------------------------------- a waterfall


def render_text(trace: Trace, *, bar_width: int = 24, width: int | None = None) -> str:
    """The trace as a waterfall; each line at most ``width`` columns when given."""
    start, total = trace.start_ns, max(trace.end_ns - trace.start_ns, 1)
    limit = width if width is not None else 10_000
    rollouts = ", ".join(sorted(trace.rollout_ids))
    lines = [
        cut(
            f"trace {trace.trace_id}  {len(trace.spans)} spans, {len(trace.services)} services"
            + (f", rollout {rollouts}" if rollouts else "")
            + (", ERROR" if trace.has_error else ""),
            limit,
        ),
        cut(f"  {_summary_text(trace)}", limit),
    ]
    names = ["  " * r.depth + display_name(r.span) for r in trace.rows]
    service_width = max(len(service(r.span)) for r in trace.rows)
    name_width = max(len(n) for n in names)
    if width is not None:
        service_width = min(service_width, max(10, width // 4))
        bar_width = min(bar_width, max(8, width // 8))
        fixed = 2 + service_width + 2 + 2 + 24 + 2 + bar_width + 7
        name_width = min(name_width, max(16, width - fixed - 8))  # names first, attributes in what is left
    for row, name in zip(trace.rows, names):
        span = row.span
        offset = (span["start_ns"] - start) / 1e6
        left = min(int(bar_width * (span["start_ns"] - start) / total), bar_width - 1)
        bar_len = max(1, int(round(bar_width * (span["end_ns"] - span["start_ns"]) / total)))
        bar = " " * left + "█" * min(bar_len, bar_width - left)
        status = "ERROR" if span.get("status") == "ERROR" else ""
        text = (
            f"  {cut(service(span), service_width):<{service_width}}  {cut(name, name_width):<{name_width}}"
            f"  +{offset:8.1f} ms {duration_ms(span):8.1f} ms |{bar:<{bar_width}}| {status:<5} {_key_attributes(span)}"
        )
        lines.append(cut(text.rstrip(), limit))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the page


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
        f'<div class="resources"><details><summary>resource attributes ({len(by_service)} services)</summary>'
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
        f'<p class="summary">{html.escape(_summary_text(trace))} · {len(trace.spans)} spans · '
        f"{len(trace.services)} services</p>{_html_resources(trace)}{_html_axis(trace.duration_ms)}"
        f"{''.join(rows)}</section>"
    )


def _html_index(listed: Sequence[Trace], drawn: set[str]) -> str:
    rows = []
    for trace in listed:
        trace_id = html.escape(trace.trace_id)
        services = sorted(_short_service(s) for s in trace.services)
        ident = (
            f'<a href="#t-{trace_id}">{trace_id[:ID_SHOWN]}</a>'
            if trace.trace_id in drawn
            else f'<span title="not drawn on this page">{trace_id[:ID_SHOWN]}</span>'
        )
        rows.append(
            f'<tr class="{"error " if trace.has_error else ""}{"startup" if trace.is_startup else "run"}" '
            f'data-trace-id="{trace_id}" data-status="{"error" if trace.has_error else "ok"}" '
            f'data-services="{html.escape(" ".join(services))}">'
            f"<td>{ident}</td><td>{_clock(trace.start_ns)}</td><td>{html.escape(display_name(trace.root))}</td>"
            f"<td>{html.escape(', '.join(services))}</td><td class=num>{len(trace.spans)}</td>"
            f"<td class=num>{html.escape(_duration(trace.duration_ms))}</td><td>{_status_text(trace)}</td>"
            f"<td class=num>{_tokens_text(trace)}</td><td>{html.escape(', '.join(sorted(trace.rollout_ids)))}</td>"
            f"<td>{'start-up' if trace.is_startup else ''}</td></tr>"
        )
    all_services = sorted({_short_service(s) for t in listed for s in t.services})
    options = "".join(f'<option value="{html.escape(s)}">{html.escape(s)}</option>' for s in all_services)
    return (
        '<section class="index"><h2>Traces</h2><p class="controls">'
        '<input id="search" type="search" placeholder="search: trace id, root span, service, rollout" size="44"> '
        '<select id="status-filter"><option value="">any status</option><option value="ok">ok</option>'
        '<option value="error">error</option></select> '
        f'<select id="service-filter"><option value="">any service</option>{options}</select> '
        '<label><input id="startup-filter" type="checkbox" checked> start-up traces</label>'
        f'<span id="shown-count">{len(listed)} of {len(listed)} shown</span></p>'
        f"{_duration_chart(listed)}"
        '<div class="index-table"><table id="index"><thead><tr><th>trace</th><th>start (UTC)</th><th>root</th>'
        "<th>services</th><th>spans</th><th>duration</th><th>status</th><th>tokens</th><th>rollout</th><th></th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _duration_chart(listed: Sequence[Trace], bins: int = 24) -> str:
    """An inline SVG histogram of the (non-start-up) traces' durations."""
    durations = [t.duration_ms for t in listed if not t.is_startup]
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
        f"{_tick_label(low + span * (i + 1) / bins)}: {c} traces</title></rect>"
        for i, c in enumerate(counts)
        if c
    )
    return (
        f'<figure class="chart"><svg xmlns="http://www.w3.org/2000/svg" width="{chart_w}" height="{chart_h + 16}" '
        f'role="img" aria-label="trace durations">{bars}'
        f'<text x="0" y="{chart_h + 13}">{_tick_label(low)}</text>'
        f'<text x="{chart_w}" y="{chart_h + 13}" text-anchor="end">{_tick_label(high)}</text></svg>'
        f"<figcaption>durations of {len(durations)} traces (start-up traces aside); tallest bar {peak}"
        "</figcaption></figure>"
    )


PAGE_SCRIPT = """
(function () {
  var search = document.getElementById('search');
  var statusFilter = document.getElementById('status-filter');
  var serviceFilter = document.getElementById('service-filter');
  var startupFilter = document.getElementById('startup-filter');
  var counter = document.getElementById('shown-count');
  var rows = Array.prototype.slice.call(document.querySelectorAll('#index tbody tr'));
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
table#index{border-collapse:collapse;width:100%}table#index th{position:sticky;top:0;background:#f4f4f4;text-align:left}
table#index td,table#index th{padding:1px 8px;white-space:nowrap}table#index tr.error td{color:#b00}
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
        f'<p class="count">{len(listed)} traces listed, {len(traces)} drawn</p>{note}'
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


# ----------------------------------------------------------------------------- the command


UNLIMITED = 1_000_000


def _terminal_width() -> int | None:
    """The columns to fit: ``COLUMNS``, else the terminal's width when standard output is
    one, else the terminal standard error is on (``view | head``, ``view | grep``: the
    lines still end up there); None when there is no terminal at all (a file, a script
    reading the output): nothing is cut."""
    import os
    import shutil
    import sys

    def is_terminal(stream) -> bool:
        try:
            return stream is not None and stream.isatty()
        except (OSError, ValueError):
            return False

    try:
        if os.environ.get("COLUMNS", "").strip().isdigit() or is_terminal(sys.stdout):
            return max(shutil.get_terminal_size((120, 24)).columns, 40)
        if is_terminal(sys.stderr):
            return max(os.get_terminal_size(sys.stderr.fileno()).columns, 40)
    except (OSError, ValueError):
        pass
    return None


def _write(lines: Iterable[str]) -> int:
    """Write to standard output; a reader that went away (``view | head``) ends the command
    quietly with 141 (128 + SIGPIPE), the shell's code for it."""
    import os
    import sys

    try:
        out = sys.stdout
        for line in lines:
            out.write(line + "\n")
        out.flush()
    except BrokenPipeError:
        try:  # the interpreter's own flush at exit must not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    return 0


def main(
    paths: Sequence[str],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    html_file: str | None = None,
    metrics: bool = False,
    trace_id: str | None = None,
    service_name: str | None = None,
    attributes: Sequence[str] = (),
    status: str | None = None,
    sort: str = "start",
    as_json: bool = False,
    max_detail: int = DEFAULT_MAX_DETAIL,
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
        return _write([text])

    try:
        attribute_filters = [parse_attribute_filter(text) for text in attributes]
    except ValueError as error:
        print(f"gym-autoinstr view: --attr: {error}", file=sys.stderr)
        return 2
    for path in paths or ["."]:
        if str(path) != "-" and not Path(path).exists():
            print(f"gym-autoinstr view: {path}: no such file or directory", file=sys.stderr)
            return 2
    # Hundreds of thousands of span dicts, and no reference cycles among them: the cyclic
    # collector would walk the growing heap again and again (about 3/4 of the time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        spans: list[dict] = []
        for path in paths or ["."]:
            spans.extend(read_path(Path(path)))
        everything = build_traces(spans)
    finally:
        if collecting:
            gc.freeze()  # what was read stays: later collections need not walk it
            gc.enable()
    filtered = bool(rollout or slowest or errors or trace_id or service_name or attribute_filters or status)
    try:
        traces = select(
            everything,
            rollout=rollout,
            slowest=slowest,
            errors=errors,
            trace_id=trace_id,
            service_name=service_name,
            attributes=attribute_filters,
            status=status,
            sort=sort,
        )
    except AmbiguousTrace as ambiguous:
        shown = ambiguous.candidates[:10]
        print(
            f"gym-autoinstr view: --trace {ambiguous.prefix} matches {len(ambiguous.candidates)} traces; "
            "give more of the id:",
            file=sys.stderr,
        )
        for trace in shown:
            print(f"  {trace.trace_id}  {_clock(trace.start_ns)}  {display_name(trace.root)}", file=sys.stderr)
        if len(ambiguous.candidates) > len(shown):
            print(f"  … and {len(ambiguous.candidates) - len(shown)} more", file=sys.stderr)
        return 1
    if not traces:
        print("no traces found" + (" matching the filters" if filtered else ""), file=sys.stderr)
        return 1
    if html_file:
        drawn = detail_for_page(traces, max_detail)
        hint = (
            "To see another one: gym-autoinstr view RUN --trace ID (a prefix is enough) in the terminal, "
            "or with --html FILE for a page of it; --html-max-traces N draws more."
        )
        items = group_by_job(drawn, everything)
        drawn = [t for item in items for t in (item.traces if isinstance(item, Job) else [item])]
        page = render_html(items, index=traces, hint=hint)
        why_slow = slow.render_html(slow.summary_for([p for p in (paths or ["."]) if p != "-"]))
        if why_slow:
            page = page.replace("<script>", why_slow + "<script>", 1)
        Path(html_file).write_text(page, encoding="utf-8")
        more = f" ({len(drawn)} drawn, every one listed)" if len(drawn) < len(traces) else ""
        print(f"wrote {len(traces)} traces to {html_file}{more}")
        return 0
    waterfall = trace_id is not None or rollout is not None
    if as_json:
        records = [trace_record(t, with_spans=waterfall) for t in traces]
        return _write([json.dumps({"traces": records}, indent=None if not waterfall else 1, default=str)])
    width = _terminal_width()
    if waterfall:
        blocks = []
        for item in group_by_job(traces, everything):
            if isinstance(item, Job):
                blocks.append(cut(job_line(item), width or UNLIMITED))
                blocks.extend(render_text(t, width=width) for t in item.traces)
            else:
                blocks.append(render_text(item, width=width))
        return _write(["\n\n".join(blocks)])
    keep_order = slowest is not None or sort == "duration"
    startup = [t for t in traces if t.is_startup]
    rest = [t for t in traces if not t.is_startup]
    items: Sequence[Job | Trace] = rest if keep_order else group_by_job(rest, everything)
    return _write(render_list(items, startup, width or UNLIMITED))
