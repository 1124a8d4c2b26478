"""Gym's aiohttp client: connection-slot waits, connections, retries and timeouts.

Gym sends every inter-server request through one ``aiohttp.ClientSession`` whose
connector caps connections (``global_aiohttp_connector_limit``, ``..._limit_per_host``).
A request over the cap waits for a slot; aiohttp announces that wait through its public
``TraceConfig`` (``on_connection_queued_start`` / ``_end``).  Only requests that waited
record ``gym.http.connection_pool.queue_duration_ms`` (Gym's name, unit and buckets),
with ``nemo.gym.http.destination.server.name``: the Gym server at that host:port in
Gym's own config, else ``host:port`` (the model endpoint behind a model server).

The same ``TraceConfig`` gives, at no cost on a request that succeeds first time:

* ``gym.http.connection_pool.connect_total`` (observable counter) by destination: new
  connections opened (``on_connection_create_end``, once per connection, not per request);
* ``gym.http.timeout_total`` by ``nemo.gym.http.internal`` (the callee is a Gym server):
  an attempt that ended in a timeout (``on_request_exception``, failures only);
* ``gym.http.retry_total`` by ``nemo.gym.http.retry_reason`` (``server_disconnected``,
  ``client_os_error``, ``timeout``, ``other``) and ``nemo.gym.http.internal``: Gym's
  ``server_utils.request`` retries a failed attempt by sending the same request again
  from the same task, so a failure is remembered in the task's context and the next
  attempt at that method and URL counts as one retry.  The success path pays one
  context-variable read and a ``None`` test in ``on_request_start``.
"""

from __future__ import annotations

import contextvars
import sys
import time
from typing import Any

from .._log import warn_once
from . import metrics

DESTINATION = "nemo.gym.http.destination.server.name"
QUEUE_OUTCOME = "nemo.gym.http.connection_pool.queue_outcome"
BOUNDARIES_MS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 5_000, 30_000)

INTERNAL = "nemo.gym.http.internal"
RETRY_REASON = "nemo.gym.http.retry_reason"

_state: dict[str, Any] = {"histogram": None, "trace_config": None, "names": None, "retries": None, "timeouts": None}
# destination server name -> [connections opened]; read by the observable counter.
_connects: dict[str, list[int]] = {}
# (method, url, reason) of this task's last failed attempt, until its next attempt starts.
_failed: contextvars.ContextVar["tuple[str, Any, str] | None"] = contextvars.ContextVar("gym_autoinstr_failed", default=None)
_TIMEOUTS = ({INTERNAL: False}, {INTERNAL: True})
_RETRIES: dict[tuple[str, bool], dict[str, Any]] = {}
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
    failed = _failed.get()
    if failed is not None:
        _count_retry(failed, params)


def _internal(url: Any) -> bool:
    return server_name_for(getattr(url, "host", None), getattr(url, "port", None)) is not None


def retry_reason(error: BaseException) -> str:
    """Gym's retry reasons, from the exception an attempt ended with."""
    import aiohttp

    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "server_disconnected"
    if isinstance(error, TimeoutError):  # asyncio's and aiohttp's timeouts (3.11+: one class)
        return "timeout"
    if isinstance(error, aiohttp.ClientOSError):
        return "client_os_error"
    return "other"


def _count_retry(failed: "tuple[str, Any, str]", params: Any) -> None:
    _failed.set(None)
    try:
        method, url, reason = failed
        if method != params.method or url != params.url or _state["retries"] is None:
            return  # the failed request was not sent again: another request of this task
        key = (reason, _internal(url))
        attributes = _RETRIES.get(key)
        if attributes is None:
            attributes = _RETRIES[key] = {RETRY_REASON: key[0], INTERNAL: key[1]}
        _state["retries"].add(1, attributes)
    except Exception as error:
        warn_once("pool:retry", "HTTP retry not counted: %r", error)


async def _on_request_exception(session: Any, context: Any, params: Any) -> None:
    try:
        reason = retry_reason(params.exception)
        if reason == "timeout" and _state["timeouts"] is not None:
            _state["timeouts"].add(1, _TIMEOUTS[_internal(params.url)])
        _failed.set((params.method, params.url, reason))
    except Exception as error:
        warn_once("pool:exception", "HTTP failure not counted: %r", error)


async def _on_connection_created(session: Any, context: Any, params: Any) -> None:
    try:
        url = getattr(context, "gym_url", None)
        name = destination_attributes(getattr(url, "host", None), getattr(url, "port", None))[DESTINATION]
        cell = _connects.get(name)
        if cell is None:
            if len(_connects) >= 256:  # destinations are a handful of servers and endpoints
                return
            cell = _connects.setdefault(name, [0])
        cell[0] += 1
    except Exception as error:
        warn_once("pool:connect", "new connection not counted: %r", error)


def _observe_connects(_options: Any) -> list[Any]:
    from opentelemetry.metrics import Observation

    return [Observation(cell[0], {DESTINATION: name}) for name, cell in list(_connects.items())]


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
        _state["histogram"] = metrics.histogram(
            "gym.http.connection_pool.queue_duration_ms", "ms",
            "Time one queued connection acquisition waited for an aiohttp pool slot.", BOUNDARIES_MS)
        meter = metrics.meter()
        _state["retries"] = meter.create_counter(
            "gym.http.retry_total", unit="{retry}", description="Outbound HTTP requests Gym sent again after a failed attempt, by reason.")
        _state["timeouts"] = meter.create_counter(
            "gym.http.timeout_total", unit="{timeout}", description="Outbound HTTP attempts that timed out.")
        meter.create_observable_counter(
            "gym.http.connection_pool.connect_total", callbacks=[_observe_connects], unit="{connection}",
            description="Connections Gym's aiohttp client opened, by destination server.")
        config = aiohttp.TraceConfig()
        config.on_request_start.append(_on_request_start)
        config.on_request_exception.append(_on_request_exception)
        config.on_connection_queued_start.append(_on_queued_start)
        config.on_connection_queued_end.append(_on_queued_end)
        config.on_connection_create_end.append(_on_connection_created)
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
