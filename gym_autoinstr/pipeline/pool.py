"""Waits for an aiohttp connection slot on Gym's client, by destination Gym server.

Gym sends every inter-server request through one ``aiohttp.ClientSession`` whose
connector caps connections (``global_aiohttp_connector_limit``, ``..._limit_per_host``).
A request over the cap waits for a slot; aiohttp announces that wait through its public
``TraceConfig`` (``on_connection_queued_start`` / ``_end``).  Only requests that waited
record ``gym.http.connection_pool.queue_duration_ms`` (Gym's name, unit and buckets),
with ``nemo.gym.http.destination.server.name``: the Gym server at that host:port in
Gym's own config, else ``host:port`` (the model endpoint behind a model server).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .._log import warn_once
from . import metrics

DESTINATION = "nemo.gym.http.destination.server.name"
QUEUE_OUTCOME = "nemo.gym.http.connection_pool.queue_outcome"
BOUNDARIES_MS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 5_000, 30_000)

_state: dict[str, Any] = {"histogram": None, "trace_config": None, "names": None}
# host:port -> pre-built attribute dict (bounded: destinations are a handful of servers)
_attributes: dict[str, dict[str, str]] = {}


def _server_names() -> dict[str, str]:
    """``host:port`` -> Gym server name, from the config dict Gym already loaded."""
    names = _state["names"]
    if names is not None:
        return names
    names = {}
    config = getattr(sys.modules.get("nemo_gym.global_config"), "_GLOBAL_CONFIG_DICT", None)
    if config is not None:
        try:
            for top, value in config.items():
                try:
                    server = list(list(value.values())[0].values())[0]
                    names[f"{server['host']}:{server['port']}"] = str(top)
                except Exception:
                    continue
        except Exception as error:
            warn_once("pool:names", "destination server names unavailable (%r); host:port is used.", error)
        _state["names"] = names  # cached only once Gym's config is loaded
    return names


def destination_attributes(host: "str | None", port: "int | None") -> dict[str, str]:
    key = f"{host}:{port}"
    hit = _attributes.get(key)
    if hit is None:
        if len(_attributes) > 256:
            _attributes.clear()
        hit = _attributes[key] = {DESTINATION: _server_names().get(key, key), QUEUE_OUTCOME: "acquired"}
    return hit


def server_name_for(host: "str | None", port: "int | None") -> "str | None":
    """The Gym server at ``host:port`` per Gym's config, or None."""
    return _server_names().get(f"{host}:{port}")


async def _on_request_start(session: Any, context: Any, params: Any) -> None:
    context.gym_url = params.url


async def _on_queued_start(session: Any, context: Any, params: Any) -> None:
    context.gym_queued = time.perf_counter()


async def _on_queued_end(session: Any, context: Any, params: Any) -> None:
    started = getattr(context, "gym_queued", None)
    histogram = _state["histogram"]
    if started is None or histogram is None:
        return
    try:
        url = getattr(context, "gym_url", None)
        attributes = destination_attributes(getattr(url, "host", None), getattr(url, "port", None))
        histogram.record((time.perf_counter() - started) * 1000.0, attributes)
    except Exception as error:
        warn_once("pool:record", "connection-pool wait not recorded: %r", error)


def trace_config() -> Any:
    import aiohttp

    if _state["trace_config"] is None:
        _state["histogram"] = metrics.meter().create_histogram(
            "gym.http.connection_pool.queue_duration_ms", unit="ms",
            description="Time one queued connection acquisition waited for an aiohttp pool slot.",
            explicit_bucket_boundaries_advisory=list(BOUNDARIES_MS),
        )
        config = aiohttp.TraceConfig()
        config.on_request_start.append(_on_request_start)
        config.on_connection_queued_start.append(_on_queued_start)
        config.on_connection_queued_end.append(_on_queued_end)
        config.freeze()
        _state["trace_config"] = config
    return _state["trace_config"]


def attach(session: Any) -> bool:
    """Add our TraceConfig to an existing session (aiohttp reads the list per request)."""
    configs = getattr(session, "_trace_configs", None)
    if not isinstance(configs, list):
        warn_once("pool:attach", "this aiohttp version keeps no trace-config list on its session; pool-wait metrics are off.")
        return False
    config = trace_config()
    if config not in configs:
        configs.append(config)
    return True
