"""The ``files`` variant's run directory: what it holds and what it costs on disk.

With nothing configured for export, ours writes OTLP-JSON (the Collector file exporter's
format: one request a line, ids in hex) into a run directory, which the benchmark names
per trio (``GYM_AUTOINSTR_OUTPUT_DIR``).  Nothing reaches the sink, so the spans of the
measured windows are counted here, by the same trace-id tags the sink counts by, and so
are the metric data points.  Once a trio's processes have exited, every file in its
directory is summed, whatever its name (segments, compressed or not, metrics, notes): the
disk a user's run takes, over the rollouts the trio completed.

Standard library only; no trio is started here.
"""

from __future__ import annotations

import base64
import binascii
import collections
import gzip
import json
import os
import pathlib
import stat
import zlib
from collections.abc import Iterator

from benchmarks.sink import TAG_BYTES

GZIP_MAGIC = b"\x1f\x8b"
POINT_KINDS = ("sum", "gauge", "histogram", "exponentialHistogram", "summary")


def directory_bytes(directory: pathlib.Path | str | None) -> tuple[int, int]:
    """The sizes of every regular file under ``directory`` summed, and how many there are;
    (0, 0) when it does not exist."""
    total = files = 0
    if directory is None:
        return 0, 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                st = os.stat(os.path.join(root, name), follow_symlinks=False)
            except OSError:  # gone between the listing and the stat (a segment renamed)
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                files += 1
    return total, files


def _lines(path: pathlib.Path) -> Iterator[bytes]:
    """A file's lines, gunzipped when it is gzip (by its first bytes, not its name); a
    compressed file cut short (its process killed) yields what it holds up to the cut."""
    try:
        with open(path, "rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
        with gzip.open(path, "rb") if compressed else open(path, "rb") as handle:
            yield from handle
    except (OSError, EOFError, zlib.error):
        return


def tag_of(trace_id: str) -> str:
    """The first ``TAG_BYTES`` of a trace id, in hex: ids are hex in our files (32 digits),
    base64 in protobuf's own JSON mapping; '' for anything else."""
    if len(trace_id) == 32:
        return trace_id[: 2 * TAG_BYTES].lower()
    try:
        return base64.b64decode(trace_id, validate=True)[:TAG_BYTES].hex()
    except (binascii.Error, ValueError):
        return ""


def _points(metric: dict) -> int:
    return sum(len((metric.get(kind) or {}).get("dataPoints") or ()) for kind in POINT_KINDS)


def count_telemetry(directory: pathlib.Path | str | None) -> dict:
    """Spans by trace-id tag (hex), metric data points, lines that did not parse (a line
    cut short by a crash), and the lines' bytes uncompressed (``plain_bytes``: what the
    same telemetry took before segments were gzipped), over every ``*.jsonl*`` file under
    ``directory``."""
    spans: collections.Counter[str] = collections.Counter()
    points = bad = plain = 0
    for path in sorted(pathlib.Path(directory).rglob("*.jsonl*")) if directory else ():
        for line in _lines(path):
            plain += len(line)
            has_spans, has_metrics = b'"resourceSpans"' in line, b'"resourceMetrics"' in line
            if not (has_spans or has_metrics):
                continue
            try:
                request = json.loads(line)
            except ValueError:
                bad += 1
                continue
            for resource_spans in request.get("resourceSpans") or ():
                for scope_spans in resource_spans.get("scopeSpans") or ():
                    for span in scope_spans.get("spans") or ():
                        spans[tag_of(str(span.get("traceId", "")))] += 1
            for resource_metrics in request.get("resourceMetrics") or ():
                for scope_metrics in resource_metrics.get("scopeMetrics") or ():
                    points += sum(_points(m) for m in scope_metrics.get("metrics") or ())
    return {"spans_by_tag": dict(spans), "metric_points": points, "bad_lines": bad, "plain_bytes": plain}


def record_trio(directory: pathlib.Path, rollouts: int, label: str) -> dict:
    """One stopped trio's run directory: its disk use (``bytes``, ``files``) over the
    ``rollouts`` it completed, and what it holds (``count_telemetry``)."""
    size, files = directory_bytes(directory)
    return {"trio": label, "bytes": size, "files": files, "rollouts": rollouts, **count_telemetry(directory)}


def spans_with_tags(trios: list[dict], tags: list[bytes]) -> int:
    """Spans whose trace ids carry one of ``tags``, over every trio's directory."""
    wanted = {t.hex() for t in tags}
    return sum(n for trio in trios for tag, n in trio.get("spans_by_tag", {}).items() if tag in wanted)


def bytes_per_rollout(trios: list[dict], key: str = "bytes") -> float | None:
    """All the trios' bytes (``key``: on disk, or ``plain_bytes``) over all their completed
    rollouts (None without rollouts)."""
    rollouts = sum(t["rollouts"] for t in trios)
    return sum(t.get(key, 0) for t in trios) / rollouts if rollouts else None


def disk_report(variants: list[dict]) -> list[str]:
    """The report's lines on the run directories of the variants that wrote one (their rows'
    ``disk``: ``record_trio``'s records); [] when none did."""
    rows = [v for v in variants if v.get("disk")]
    if not rows:
        return []
    lines = [
        "Disk of the run directory (nothing configured for export: the embedded default's files), every "
        "file in it summed once the trio's processes had exited, over the rollouts that trio completed "
        "(warm-up and every window included; start-up's spans, metrics and notes are in the bytes); the "
        "variant's spans per rollout above are counted in these files, by the same trace-id tags as at the sink; "
        "'uncompressed' is the same lines' bytes before gzip (what one plain file per process took before segments):",
        "",
        "| variant | trio | files | bytes | rollouts completed | bytes per rollout | uncompressed per rollout | "
        "metric data points | lines cut short |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def per(trios: list[dict], key: str = "bytes", bold: bool = False) -> str:
        value = bytes_per_rollout(trios, key)
        return "-" if value is None else (f"**{value:,.0f}**" if bold else f"{value:,.0f}")

    for v in rows:
        for trio in v["disk"]:
            lines.append(
                f"| {v['label']} | {trio['trio']} | {trio['files']} | {trio['bytes']:,} | {trio['rollouts']:,} | "
                f"{per([trio])} | {per([trio], 'plain_bytes')} | {trio.get('metric_points', 0):,} | "
                f"{trio.get('bad_lines', 0)} |"
            )
        if len(v["disk"]) > 1:
            lines.append(
                f"| {v['label']} | all | {sum(t['files'] for t in v['disk'])} | "
                f"{sum(t['bytes'] for t in v['disk']):,} | {sum(t['rollouts'] for t in v['disk']):,} | "
                f"{per(v['disk'], bold=True)} | {per(v['disk'], 'plain_bytes', bold=True)} | "
                f"{sum(t.get('metric_points', 0) for t in v['disk']):,} | "
                f"{sum(t.get('bad_lines', 0) for t in v['disk'])} |"
            )
    lines.append("")
    return lines
