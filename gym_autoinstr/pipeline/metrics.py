"""Metric instruments: HTTP server duration (ingress) and the fleet size (orchestrator).

* ``http.server.request.duration`` (seconds, histogram) is recorded by the ingress
  middleware for every traced request, dimensioned by ``http.request.method``,
  ``http.route`` (the template, never the raw path) and ``http.response.status_code``;
  the server is told apart by the resource (``service.name``).
* ``gym.servers.active`` (gauge) is written by the orchestrator only: the number of
  servers once ``RunHelper.wait_for_spinup`` reports them all ready, 0 after
  ``RunHelper.shutdown``.

Reward and accuracy are never mirrored into telemetry.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from .._log import warn_once
from ..version import __version__

_instruments: dict[str, Any] = {}
_provider: object = None


def _meter_instruments() -> dict[str, Any]:
    global _provider
    provider = metrics.get_meter_provider()
    if provider is not _provider:
        meter = provider.get_meter("gym_autoinstr", __version__)
        _instruments.clear()
        _instruments["duration"] = meter.create_histogram(
            "http.server.request.duration", unit="s", description="Duration of HTTP server requests."
        )
        _instruments["servers"] = meter.create_gauge(
            "gym.servers.active", unit="{server}", description="Gym servers up in this run (orchestrator)."
        )
        # No meter provider configured (e.g. the file default): nothing would be kept,
        # so requests skip building the measurement altogether.
        _instruments["live"] = type(provider).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider")
        _provider = provider
    return _instruments


def record_server_duration(seconds: float, method: str, route: "str | None", status: "int | None") -> None:
    instruments = _meter_instruments()
    if not instruments["live"]:
        return
    attributes: dict[str, Any] = {"http.request.method": method}
    if route:
        attributes["http.route"] = route
    if status:
        attributes["http.response.status_code"] = status
    instruments["duration"].record(seconds, attributes)


def set_servers_active(value: int) -> None:
    try:
        _meter_instruments()["servers"].set(value)
    except Exception as error:
        warn_once("servers-active", "could not record gym.servers.active: %r", error)
