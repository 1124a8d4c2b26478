"""Render spans as one indented tree per trace: service, span, duration.

Spans are plain dicts (``trace_id``, ``span_id``, ``parent_span_id``, ``name``,
``kind``, ``start_ns``, ``end_ns``, ``status``, ``attributes``, ``resource``), the shape
both the OTLP readers in this package and the test sink produce.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

KEY_ATTRIBUTES = ("nemo.gym.rollout.id", "http.route", "http.response.status_code")


def group_by_trace(spans: Iterable[dict]) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        traces[span["trace_id"]].append(span)
    return dict(traces)


def _service(span: dict) -> str:
    return str((span.get("resource") or {}).get("service.name", "?"))


def _duration_ms(span: dict) -> float:
    return max(0, span.get("end_ns", 0) - span.get("start_ns", 0)) / 1e6


def render_trace(spans: list[dict], *, width: int = 100) -> str:
    """One trace as text lines: roots first, children by start time."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[Any, list[dict]] = defaultdict(list)
    roots: list[dict] = []
    for span in spans:
        parent = span.get("parent_span_id")
        if parent and parent in by_id:
            children[parent].append(span)
        else:
            roots.append(span)
    for kids in children.values():
        kids.sort(key=lambda s: s.get("start_ns", 0))
    roots.sort(key=lambda s: s.get("start_ns", 0))
    services = {_service(s) for s in spans}
    header = f"trace {spans[0]['trace_id']}  ({len(spans)} spans, {len(services)} services)"
    lines = [header]
    service_width = max((len(_service(s)) for s in spans), default=10)

    def walk(span: dict, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        label = f"{prefix}{branch}{span['name']}"
        kind = str(span.get("kind", "")).replace("SpanKind.", "")
        status = " ERROR" if span.get("status") == "ERROR" else ""
        extras = " ".join(
            f"{k.rsplit('.', 1)[-1]}={span['attributes'][k]}" for k in KEY_ATTRIBUTES if k in (span.get("attributes") or {})
        )
        lines.append(
            f"  {_service(span):<{service_width}}  {label:<60} {kind:<8} {_duration_ms(span):9.1f} ms{status}  {extras}".rstrip()
        )
        kids = children.get(span["span_id"], [])
        child_prefix = prefix if top else prefix + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            walk(kid, child_prefix, i == len(kids) - 1, False)

    for root in roots:
        walk(root, "", True, True)
    return "\n".join(lines)


def render(spans: Iterable[dict]) -> str:
    traces = group_by_trace(spans)
    ordered = sorted(traces.values(), key=lambda ss: min(s.get("start_ns", 0) for s in ss))
    return "\n\n".join(render_trace(ss) for ss in ordered)
