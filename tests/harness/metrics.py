"""What tests read off exported metrics and logs (OTLP requests the collector's sink kept)."""

from __future__ import annotations

import json

from tests.harness.collector import _attrs


def metric_points(sink) -> list[dict]:
    """Every data point received, flattened: ``{"name", "unit", "kind", "service",
    "instance" (``service.instance.id``: one per process), "attributes", "value" (a
    histogram's count), "sum", "max", "time"}``."""
    points = []
    for request in sink.metrics_requests():
        for resource_metrics in request.resource_metrics:
            resource = _attrs(resource_metrics.resource.attributes)
            service, instance = resource.get("service.name"), resource.get("service.instance.id")
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        points.append(
                            {
                                "name": metric.name,
                                "unit": metric.unit,
                                "kind": kind,
                                "service": service,
                                "instance": instance,
                                "attributes": _attrs(point.attributes),
                                "value": point.count if kind == "histogram" else (point.as_int or point.as_double),
                                "sum": getattr(point, "sum", None),
                                "max": getattr(point, "max", None),
                                "time": point.time_unix_nano,
                            }
                        )
    return points


def latest(points: list[dict], name: str) -> dict:
    """The latest cumulative point of one metric per (service, attributes)."""
    found: dict = {}
    for p in sorted((p for p in points if p["name"] == name), key=lambda p: p["time"]):
        found[(p["service"], json.dumps(p["attributes"], sort_keys=True))] = p
    return found


def log_records(sink) -> list[dict]:
    """Every log record received: ``{"service", "body", "trace_id", "span_id"}`` (hex)."""
    records = []
    for request in sink.logs_requests():
        for resource_logs in request.resource_logs:
            service = _attrs(resource_logs.resource.attributes).get("service.name")
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    records.append(
                        {
                            "service": service,
                            "body": record.body.string_value,
                            "trace_id": record.trace_id.hex(),
                            "span_id": record.span_id.hex(),
                        }
                    )
    return records
