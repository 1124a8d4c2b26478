"""``gym-autoinstr view --metrics``: why is it slow, per Gym server, from a run's metrics.

Reads the ``*.metrics.jsonl`` segments the embedded default writes (each process's, in
order, plain or gzipped; one OTLP-JSON ``ExportMetricsServiceRequest`` per line,
cumulative), keeps each process's
latest point per series, and summarises per server: requests and p50/p99 per route,
rollouts, verify and model calls, event-loop lag p99, GC pause time, connection-pool
waits by destination.  Quantiles are estimated from the histogram buckets (linear inside
a bucket, clamped to the observed min and max).
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gym_autoinstr import attributes as attr
from gym_autoinstr.setup.files import METRICS_SUFFIX, _attributes, json_lines, segment_files, segment_lines
from gym_autoinstr.setup.segments import segment_key


def metric_files(path: Path) -> list[Path]:
    if path.is_dir():
        return segment_files(path, METRICS_SUFFIX)
    return [path] if path.name.removesuffix(".gz").endswith(METRICS_SUFFIX) else []


def latest_points(lines: Iterable[str], source: str = "") -> dict[tuple, dict]:
    """``(service, metric, attributes)`` -> the latest data point (cumulative) in one file."""
    latest: dict[tuple, dict] = {}
    for request in json_lines(lines, source):
        for resource_metrics in request.get("resourceMetrics", ()):
            resource = _attributes(resource_metrics.get("resource", {}).get("attributes"))
            service = str(resource.get(attr.SERVICE_NAME, "?"))
            for scope_metrics in resource_metrics.get("scopeMetrics", ()):
                for metric in scope_metrics.get("metrics", ()):
                    for kind in ("histogram", "sum", "gauge"):
                        if kind in metric:
                            break
                    else:
                        continue
                    for point in metric[kind].get("dataPoints", ()):
                        attributes = _attributes(point.get("attributes"))
                        key = (service, metric["name"], json.dumps(attributes, sort_keys=True, default=str))
                        latest[key] = {**point, "kind": kind, "attributes": attributes}
    return latest


def read_run(path: Path) -> dict[tuple, dict]:
    points: dict[tuple, dict] = {}
    for file in metric_files(path):  # each process's segments in order: a later point of a series wins
        process = str(file.parent / segment_key(file)[0])
        for key, point in latest_points(segment_lines(file), str(file)).items():
            # processes of one server (uvicorn workers) add up: keep them apart by process
            points[(process,) + key] = point
    return points


def quantile(point: dict, q: float) -> float | None:
    counts = [int(c) for c in point.get("bucketCounts", ())]
    bounds = [float(b) for b in point.get("explicitBounds", ())]
    total = sum(counts)
    if not total:
        return None
    low_clamp = float(point.get("min", bounds[0] if bounds else 0.0))
    high_clamp = float(point.get("max", bounds[-1] if bounds else 0.0))
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            low = bounds[index - 1] if index > 0 else low_clamp
            high = bounds[index] if index < len(bounds) else high_clamp
            low, high = max(low, low_clamp), min(high, high_clamp)
            value = low + (high - low) * ((rank - seen) / count)
            return min(max(value, low_clamp), high_clamp)
        seen += count
    return high_clamp


def _merge(points: Sequence[dict]) -> dict:
    """Histogram points of one series from several processes, added up (same bounds)."""
    merged = dict(points[0])
    merged["count"] = sum(int(p.get("count", 0)) for p in points)
    merged["sum"] = sum(float(p.get("sum", 0)) for p in points)
    merged["bucketCounts"] = [
        sum(int(p["bucketCounts"][i]) for p in points) for i in range(len(points[0].get("bucketCounts", ())))
    ]
    merged["min"] = min(float(p.get("min", 0)) for p in points)
    merged["max"] = max(float(p.get("max", 0)) for p in points)
    return merged


def summarise(points: dict[tuple, dict]) -> dict[str, dict[str, Any]]:
    """Per service: the rows of the summary (already merged across its processes)."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for (_file, service, name, attributes), point in points.items():
        grouped[(service, name, attributes)].append(point)
    out: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(list))
    for (service, name, _), series in sorted(grouped.items()):
        first = series[0]
        attributes = first["attributes"]
        if first["kind"] == "histogram":
            point = _merge(series)
            scale = 1000.0 if name == "http.server.request.duration" else 1.0  # seconds -> ms
            row = {
                "count": point["count"],
                "p50_ms": (quantile(point, 0.5) or 0.0) * scale,
                "p99_ms": (quantile(point, 0.99) or 0.0) * scale,
                "sum_ms": float(point.get("sum", 0.0)) * scale,
                "attributes": attributes,
            }
        else:
            value = sum(float(p.get("asDouble", p.get("asInt", 0))) for p in series)
            row = {"value": value, "attributes": attributes}
        out[service][name].append(row)
    return out


SECTIONS = (
    (
        "http.server.request.duration",
        "requests",
        lambda a: (
            f"{a.get(attr.HTTP_REQUEST_METHOD, '')} {a.get(attr.HTTP_ROUTE, '?')} "
            f"{a.get(attr.HTTP_RESPONSE_STATUS_CODE, '')}"
        ).strip(),
    ),
    ("gym.rollout.duration_ms", "rollouts", lambda a: a.get(attr.ROLLOUT_OUTCOME, "")),
    ("gym.verify.duration_ms", "verify", lambda a: a.get(attr.VERIFY_OUTCOME, "")),
    ("gym.model.call_duration_ms", "model calls", lambda a: a.get(attr.MODEL_DIALECT, "")),
    ("gym.model.time_to_first_byte_ms", "model first byte", lambda a: a.get(attr.MODEL_DIALECT, "")),
    (
        "gym.http.connection_pool.queue_duration_ms",
        "waits for a connection",
        lambda a: f"to {a.get(attr.DESTINATION, '?')}",
    ),
    (
        "gym.concurrency.queue_wait_duration_ms",
        "waits for a Gym limit",
        lambda a: a.get(attr.CONCURRENCY_SITE, "?"),
    ),
    ("gym.sandbox.startup_duration_ms", "sandbox starts", lambda a: a.get(attr.SANDBOX_PROVIDER, "")),
    ("gym.sandbox.exec_duration_ms", "sandbox execs", lambda a: a.get(attr.SANDBOX_PROVIDER, "")),
    ("gym.event_loop.lag_ms", "event-loop lag", lambda a: ""),
    ("gym.gc.pause_duration_ms", "GC pauses", lambda a: f"gen {a.get(attr.GC_GENERATION, '?')}"),
)


def rows(summary: dict[str, dict[str, Any]]) -> list[tuple[str, list[tuple[str, str, int, float, float, float]]]]:
    """``(service, [(section, label, count, p50, p99, total ms)])`` in display order."""
    out = []
    for service in sorted(summary):
        lines = []
        for name, section, label in SECTIONS:
            for row in summary[service].get(name, ()):
                if "count" in row and row["count"]:
                    lines.append(
                        (section, label(row["attributes"]), row["count"], row["p50_ms"], row["p99_ms"], row["sum_ms"])
                    )
        if lines:
            out.append((service, lines))
    return out


def render_text(summary: dict[str, dict[str, Any]]) -> str:
    blocks = []
    for service, lines in rows(summary):
        text = [service, f"  {'':24} {'':34} {'count':>7} {'p50 ms':>9} {'p99 ms':>9} {'total ms':>10}"]
        for section, label, count, p50, p99, total in lines:
            text.append(f"  {section:24} {label[:34]:34} {count:7d} {p50:9.1f} {p99:9.1f} {total:10.1f}")
        in_flight = [r["value"] for r in summary[service].get("gym.server.requests.in_flight", ())]
        if in_flight:
            text.append(f"  requests in flight at the last export: {int(sum(in_flight))}")
        blocks.append("\n".join(text))
    return "\n\n".join(blocks)


CHART_WIDTH = 160  # px of the inline p50/p99 bar of a row


def _bar(p50: float, p99: float, scale: float) -> str:
    """An inline SVG bar: p99 (light) and p50 (dark), as long as their share of ``scale``."""
    wide = max(1.0, CHART_WIDTH * p99 / scale) if scale > 0 else 1.0
    narrow = max(1.0, CHART_WIDTH * p50 / scale) if scale > 0 else 1.0
    return (
        f'<svg class="p-bar" xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="10">'
        f"<title>p50 {p50:.1f} ms, p99 {p99:.1f} ms</title>"
        f'<rect class="p99" x="0" y="1" width="{wide:.1f}" height="8" fill="#a3c6ec"/>'
        f'<rect class="p50" x="0" y="1" width="{narrow:.1f}" height="8" fill="#4a8fd8"/></svg>'
    )


# Rows about the process rather than the requests it served: drawn to a scale of their own.
# A process's GC pauses count its start-up (the imports of Gym and its dependencies make
# the longest collections of a run, hundreds of milliseconds), which would otherwise set
# the scale every request bar is drawn to.
PROCESS_SECTIONS = ("event-loop lag", "GC pauses")
PROCESS_HEADING = "the process: its own scale (GC pauses count its start-up too)"


def _html_rows(lines: list[tuple[str, str, int, float, float, float]]) -> str:
    scale = max(p99 for *_, p99, _total in lines)
    return "".join(
        f"<tr><td>{html.escape(section)}</td><td>{html.escape(label)}</td><td>{count}</td>"
        f"<td>{p50:.1f}</td><td>{p99:.1f}</td><td>{total:.1f}</td><td>{_bar(p50, p99, scale)}</td></tr>"
        for section, label, count, p50, p99, total in lines
    )


def render_html(summary: dict[str, dict[str, Any]]) -> str:
    """A ``<section>`` for the view's HTML page (empty when there are no metrics): per
    server, a table of its rows with an inline bar each (p50 and p99, to the scale of the
    slowest p99 among the server's request rows; the process's own rows, event-loop lag
    and GC pauses, below them to a scale of theirs)."""
    parts = []
    for service, lines in rows(summary):
        work = [line for line in lines if line[0] not in PROCESS_SECTIONS]
        process = [line for line in lines if line[0] in PROCESS_SECTIONS]
        body = _html_rows(work) if work else ""
        if process:
            body += f'<tr class="group"><th colspan="7">{html.escape(PROCESS_HEADING)}</th></tr>{_html_rows(process)}'
        parts.append(
            f'<h3>{html.escape(service)}</h3><table class="metrics"><tr><th></th><th></th><th>count</th>'
            f"<th>p50 ms</th><th>p99 ms</th><th>total ms</th><th>p50 / p99</th></tr>{body}</table>"
        )
    if not parts:
        return ""
    return '<section class="why-slow"><h2>Why is it slow: per server</h2>' + "".join(parts) + "</section>"


def summary_for(paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    points: dict[tuple, dict] = {}
    for path in paths:
        target = Path(path)
        if str(path) != "-" and target.exists():
            points.update(read_run(target))
    return summarise(points)
