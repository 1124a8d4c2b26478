"""Gym's aiohttp client: connection-slot waits, connections, retries and timeouts
(``gym.http.connection_pool.*``, ``gym.http.retry_total``, ``gym.http.timeout_total``; their
attributes and buckets: docs/spans-and-metrics.md, "Metrics").

Gym sends every inter-server request through one ``aiohttp.ClientSession`` whose
connector caps connections: only a request over the cap waits for a slot, and records
that wait.  aiohttp's public ``TraceConfig`` announces waits, new connections and failed
attempts, at no cost on a request that succeeds first time.  Gym's
``server_utils.request`` retries a failed attempt by sending the same request again from
the same task, so a failure is remembered in the task's context and the next attempt at
that method and URL counts as one retry (the success path pays one context-variable read
and a ``None`` test).

Where the installed aiohttp has them (checked by name and signature; 3.14 does), these
come from hooks on the session's own ``_request`` and its connector's
``_wait_for_available_connection`` and ``_create_connection``, set on those two objects
only: a ``TraceConfig``, even an empty one, costs about 15 µs per request (aiohttp
builds a trace context, rebuilds the URL and sends a signal at each step of every
request), the hooks about 1 µs.  A pool wait is then one record per acquisition, the
whole wait.  Other aiohttp versions, or ``GYM_AUTOINSTR_AIOHTTP_HOOKS=0``, get the
``TraceConfig``.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from dataclasses import dataclass
from typing import Any

from gym_autoinstr import _footprint, settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.advice import fleet_addresses
from gym_autoinstr.attributes import DESTINATION, HTTP_INTERNAL, QUEUE_OUTCOME, RETRY_REASON
from gym_autoinstr.telemetry import metrics

BOUNDARIES_MS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 5_000, 30_000)


@dataclass(slots=True)
class _PoolState:
    histogram: Any = None  # gym.http.connection_pool.queue_duration_ms, once made
    trace_config: Any = None  # the aiohttp TraceConfig, on an aiohttp without our hooks
    retries: Any = None  # counters of retries and timeouts, made with the histogram
    timeouts: Any = None


_state = _PoolState()
# destination server name -> [connections opened]; read by the observable counter.
_connects: dict[str, list[int]] = {}
# The attempts made inside a traced Gym request are counted on its CLIENT span, the
# current span while Gym's request runs: ``advice/egress.py`` starts the count by setting
# the span's ``gym_attempts`` to 0 (a slot of ``lean.LeanSpan``; an instance attribute of
# the SDK's span); ``count_attempts`` adds one per attempt to a current span that has it.
# (method, url, reason) of this task's last failed attempt, until its next attempt starts.
_failed: contextvars.ContextVar[tuple[str, Any, str] | None] = contextvars.ContextVar(
    "gym_autoinstr_failed", default=None
)
_TIMEOUTS = ({HTTP_INTERNAL: False}, {HTTP_INTERNAL: True})
_RETRIES: dict[tuple[str, bool], dict[str, Any]] = {}
# host:port -> pre-built attribute dict (bounded: destinations are a handful of servers)
_attributes: dict[str, dict[str, str]] = {}


def destination_attributes(host: str | None, port: int | None) -> dict[str, str]:
    key = f"{host}:{port}"
    hit = _attributes.get(key)
    if hit is None:
        if len(_attributes) > 256:
            _attributes.clear()
        hit = _attributes[key] = {DESTINATION: fleet_addresses.server_names().get(key, key), QUEUE_OUTCOME: "acquired"}
    return hit


async def _on_request_start(session: Any, context: Any, params: Any) -> None:
    context.gym_url = params.url
    failed = _failed.get()
    if failed is not None:
        _count_retry(failed, params)


def _internal(url: Any) -> bool:
    return fleet_addresses.server_name_for(getattr(url, "host", None), getattr(url, "port", None)) is not None


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


def _count_retry(failed: tuple[str, Any, str], params: Any) -> None:
    _count_retry_of(failed, params.method, params.url)


def _count_retry_of(failed: tuple[str, Any, str], method: Any, url: Any) -> None:
    _failed.set(None)
    try:
        failed_method, failed_url, reason = failed
        if failed_method != method or failed_url != url or _state.retries is None:
            return  # the failed request was not sent again: another request of this task
        key = (reason, _internal(url))
        attributes = _RETRIES.get(key)
        if attributes is None:
            attributes = _RETRIES[key] = {RETRY_REASON: key[0], HTTP_INTERNAL: key[1]}
        _state.retries.add(1, attributes)
    except Exception as error:
        warn_once("pool:retry", "HTTP retry not counted: %r", error)


async def _on_request_exception(session: Any, context: Any, params: Any) -> None:
    _failed_attempt(params.method, params.url, params.url, params.exception)


def _failed_attempt(method: Any, key: Any, url: Any, error: BaseException) -> None:
    """An attempt at ``method`` ``key`` (``url``: where it went) ended in ``error``."""
    try:
        reason = retry_reason(error)
        if reason == "timeout" and _state.timeouts is not None:
            _state.timeouts.add(1, _TIMEOUTS[_internal(url)])
        _failed.set((method, key, reason))
    except Exception as failure:
        warn_once("pool:exception", "HTTP failure not counted: %r", failure)


async def _on_connection_created(session: Any, context: Any, params: Any) -> None:
    url = getattr(context, "gym_url", None)
    _connection_opened(getattr(url, "host", None), getattr(url, "port", None))


def _connection_opened(host: Any, port: Any) -> None:
    try:
        name = destination_attributes(host, port)[DESTINATION]
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
    if started is not None:
        url = getattr(context, "gym_url", None)
        _waited(started, getattr(url, "host", None), getattr(url, "port", None))


def _waited(started: float, host: Any, port: Any) -> None:
    histogram = _state.histogram
    if histogram is None:
        return
    try:
        histogram.record((time.perf_counter() - started) * 1000.0, destination_attributes(host, port))
    except Exception as error:
        warn_once("pool:record", "connection-pool wait not recorded: %r", error)


def _instruments() -> None:
    if _state.histogram is None:
        _state.histogram = metrics.histogram(
            "gym.http.connection_pool.queue_duration_ms",
            "ms",
            "Time one queued connection acquisition waited for an aiohttp pool slot.",
            BOUNDARIES_MS,
        )
        meter = metrics.meter()
        _state.retries = meter.create_counter(
            "gym.http.retry_total",
            unit="{retry}",
            description="Outbound HTTP requests Gym sent again after a failed attempt, by reason.",
        )
        _state.timeouts = meter.create_counter(
            "gym.http.timeout_total", unit="{timeout}", description="Outbound HTTP attempts that timed out."
        )
        meter.create_observable_counter(
            "gym.http.connection_pool.connect_total",
            callbacks=[_observe_connects],
            unit="{connection}",
            description="Connections Gym's aiohttp client opened, by destination server.",
        )


def trace_config() -> Any:
    import aiohttp

    if _state.trace_config is None:
        _instruments()
        config = aiohttp.TraceConfig()
        config.on_request_start.append(_on_request_start)
        config.on_request_exception.append(_on_request_exception)
        config.on_connection_queued_start.append(_on_queued_start)
        config.on_connection_queued_end.append(_on_queued_end)
        config.on_connection_create_end.append(_on_connection_created)
        config.freeze()
        _state.trace_config = config
    return _state.trace_config


HOOKS_ENV = settings.AIOHTTP_HOOKS.name
# (owner attribute, the parameters it must take) for each hook
_HOOKED = (
    ("_request", ("method", "str_or_url")),
    ("_wait_for_available_connection", ("key", "traces")),
    ("_create_connection", ("req", "traces", "timeout")),
)


def _hookable(session: Any) -> bool:
    if not settings.AIOHTTP_HOOKS.read():
        return False
    connector = getattr(session, "connector", None)
    for name, parameters in _HOOKED:
        method = getattr(session if name == "_request" else connector, name, None)
        if not inspect.iscoroutinefunction(method):
            return False
        try:
            names = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            return False
        if names[: len(parameters)] != list(parameters):
            return False
    return True


def _hook(session: Any) -> None:
    """Observe ``session`` through hooks on it and its connector (see the module doc)."""
    connector = session.connector
    if getattr(session, "__dict__", {}).get("_request") is not None:
        return  # hooked already
    request = session._request
    wait = connector._wait_for_available_connection
    create = connector._create_connection

    async def _request(method: Any, str_or_url: Any, *args: Any, **kwargs: Any) -> Any:
        failed = _failed.get()
        if failed is not None:
            _count_retry_of(failed, str(method).upper(), str(str_or_url))
        try:
            call = request(method, str_or_url, *args, **kwargs)
            # aiohttp's coroutine holds the arguments it takes: the dict of them made for
            # this frame is let go rather than kept for as long as the attempt runs.
            args = kwargs = None
            return await call
        except BaseException as error:
            _failed_attempt(str(method).upper(), str(str_or_url), _url(str_or_url), error)
            raise

    async def _wait_for_available_connection(key: Any, traces: Any) -> None:
        started = time.perf_counter()
        await wait(key, traces)
        _waited(started, getattr(key, "host", None), getattr(key, "port", None))

    async def _create_connection(req: Any, traces: Any, timeout: Any) -> Any:
        made = await create(req, traces, timeout)
        url = getattr(req, "url", None)
        _connection_opened(getattr(url, "host", None), getattr(url, "port", None))
        return made

    # Instance attributes, past ClientSession's debug-mode __setattr__ warning: other
    # sessions and connectors in the process are not touched (rows of pointcuts.PROCESS_PATCHES).
    _footprint.apply(
        "aiohttp.connector_wait", connector, "_wait_for_available_connection", _wait_for_available_connection
    )
    _footprint.apply("aiohttp.connector_create", connector, "_create_connection", _create_connection)
    _footprint.apply("aiohttp.session_request", session, "_request", _request)


def _url(str_or_url: Any) -> Any:
    try:
        from yarl import URL

        return URL(str(str_or_url))
    except Exception:
        return None


def count_attempts(session: Any) -> None:
    """Count the attempts Gym's ``server_utils.request`` makes on ``session`` (its retries
    call ``session.request`` again) on the span of the traced request they are made in
    (``gym_attempts``), through an instance attribute on this session alone: a patch of
    ``ClientSession.request`` would make every call on every session build a bound
    wrapper first (about 9 k instructions a call; this costs about a fifth of that).
    (A per-request cell in a ContextVar of its own took two objects, a list and the
    set's token, that lived as long as the call.)"""
    if getattr(session, "__dict__", {}).get("request") is not None:
        return  # counted already
    from gym_autoinstr.fastpath import context_ops, contract

    request = session.request
    current, key = context_ops.current_context, contract.SPAN_KEY  # (an API without the key: nothing counted)

    def counted(*args: Any, **kwargs: Any) -> Any:
        span = current().get(key)
        made = getattr(span, "gym_attempts", None)
        if made is not None:
            span.gym_attempts = made + 1
        return request(*args, **kwargs)

    # An instance attribute, past ClientSession's debug-mode __setattr__ warning
    _footprint.apply("aiohttp.session_attempts", session, "request", counted)


def attach(session: Any) -> bool:
    """Observe Gym's client session: hooks where this aiohttp allows, else our TraceConfig
    (aiohttp reads the session's list per request)."""
    if _hookable(session):
        _instruments()
        _hook(session)
        return True
    configs = getattr(session, "_trace_configs", None)
    if not isinstance(configs, list):
        warn_once(
            "pool:attach", "this aiohttp version keeps no trace-config list on its session; pool-wait metrics are off."
        )
        return False
    config = trace_config()
    if config not in configs:
        configs.append(config)
        _footprint.record("aiohttp.trace_config", lambda: config in configs and configs.remove(config), owner=session)
    return True
