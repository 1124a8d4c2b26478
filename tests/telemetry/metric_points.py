"""The points the in-memory reader of the in-process metrics tests holds (its fixture,
``reader``: ``conftest.py``)."""

from __future__ import annotations


def points(reader, name: str) -> list:
    data = reader.get_metrics_data()
    found = []
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    found.extend((metric, point) for point in metric.data.data_points)
    return found


def counts(reader, name: str, key: str | None = None) -> dict:
    """Histogram counts (or sums' values) by one attribute."""
    out: dict = {}
    for _, point in points(reader, name):
        label = dict(point.attributes).get(key) if key else None
        out[label] = out.get(label, 0) + getattr(point, "count", getattr(point, "value", 0))
    return out
