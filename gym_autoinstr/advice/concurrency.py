"""The concurrency limits Gym's servers enforce with asyncio semaphores, by site
(``<server class>.<attribute>``): the ``gym.concurrency.*`` gauges, read off each semaphore
at collection time, and ``gym.concurrency.queue_wait_duration_ms``, the acquisitions that
waited.  A server is watched from the moment it is about to serve (``advice/ingress.py``)
and looked at again at every metrics collection, never per request.  Which semaphores
are observed, and how the limit is read: docs/spans-and-metrics.md, "Metrics".

To time waits without a cost on the free path, each found semaphore's class is swapped
for a subclass whose ``acquire`` tests for a free slot and no waiters and then returns
the base class's own coroutine; only an acquisition that finds the semaphore locked
goes through a timing coroutine.  ``isinstance``, ``locked()``, ``release()``, the
semaphore's loop binding and ``asyncio.iscoroutinefunction(acquire)`` are unchanged; a
copy or a pickle of it is a plain semaphore of the original class (nothing of ours
travels); ``restore()`` swaps the classes back.  A free acquire-and-release costs about
0.3 us more than on a bare semaphore (``semaphore`` in ``benchmarks/micro.py``), beside
work a Gym limit guards that takes milliseconds.
"""

from __future__ import annotations

import asyncio
import copyreg
import inspect
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics as otel_metrics

from gym_autoinstr import _footprint
from gym_autoinstr._log import warn_once
from gym_autoinstr.attributes import CONCURRENCY_SITE, SERVER_NAME
from gym_autoinstr.telemetry import metrics

WAIT_BOUNDARIES_MS = (
    0.1,
    0.5,
    1,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    300_000,
    1_800_000,
)

# (weak semaphore, attributes, [limit]); the limit cell can rise at collection time.
_sites: list[tuple[Any, dict[str, str], list[int]]] = []
# (weak server, server name): looked at again at every collection
_servers: list[tuple[Any, str]] = []
# Guards _sites and _servers; held only around our own bookkeeping, never around a call
# into the SDK (a collection calls our gauges with the SDK's lock held, and they take this).
_lock = threading.Lock()
_start_lock = threading.Lock()


@dataclass(slots=True)
class _ConcurrencyState:
    histogram: Any = None  # gym.concurrency.queue_wait_duration_ms
    provider: Any = None  # the meter provider it was made on
    rescanned: float = 0.0  # when the servers were last looked at again


_state = _ConcurrencyState()
_subclasses: dict[type, type] = {}
_ATTRIBUTES = "_gym_autoinstr_concurrency"
_BASE = "_gym_autoinstr_base"
PATCH = "asyncio.semaphore_class"  # its row in pointcuts.PROCESS_PATCHES
RESCAN_SECONDS = 1.0  # at most one look at the servers per collection (four gauges read them)


def _observed_class(base: type) -> type:
    cls = _subclasses.get(base)
    if cls is not None:
        return cls
    acquire = base.acquire

    def observed_acquire(self: Any) -> Any:
        # A free slot and nobody queued (``locked()``'s cheap half; its generator over
        # the waiters is what base ``acquire`` runs anyway): the base coroutine itself.
        if self._value > 0 and not self._waiters:
            return acquire(self)
        return _timed(self, acquire)

    mark_coroutine_function(observed_acquire)

    def __reduce_ex__(self: Any, protocol: int) -> Any:
        # Copies and pickles are of the original class, without our site attributes:
        # the class name resolves to the base (our subclass has the base's qualname,
        # so pickle's lookup by name would otherwise fail), and nothing of ours travels.
        state = {k: v for k, v in self.__dict__.items() if k != _ATTRIBUTES}
        return copyreg._reconstructor, (base, object, None), state

    cls = type(
        base.__name__,
        (base,),
        {
            "acquire": observed_acquire,
            "__reduce_ex__": __reduce_ex__,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            _BASE: base,
        },
    )
    _subclasses[base] = cls
    return cls


def mark_coroutine_function(function: Any) -> None:
    """``function`` (which returns a coroutine) stays a coroutine function to ``inspect`` and
    ``asyncio``: the semaphore's ``acquire``, the ingress middleware's ``__call__``."""
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark is not None:
        mark(function)
    marker = getattr(asyncio.coroutines, "_is_coroutine", None)  # what asyncio.iscoroutinefunction reads before 3.12
    if marker is not None:
        function._is_coroutine = marker


async def _timed(semaphore: Any, acquire: Any) -> Any:
    if not semaphore.locked():  # only cancelled waiters were queued: base acquire takes it at once
        return await acquire(semaphore)
    started = time.perf_counter()
    try:
        return await acquire(semaphore)
    finally:
        histogram = _state.histogram
        attributes = getattr(semaphore, _ATTRIBUTES, None)
        if histogram is not None and attributes is not None:
            try:
                histogram.record((time.perf_counter() - started) * 1000.0, attributes)
            except Exception as error:
                warn_once("concurrency:record", "semaphore wait not recorded: %r", error)


def _candidates(server: Any) -> list[tuple[str, Any]]:
    """The not yet observed asyncio semaphores on a server's own attributes, each once."""
    found = list(getattr(server, "__dict__", {}).items())
    private = getattr(server, "__pydantic_private__", None)
    if isinstance(private, dict):
        found += list(private.items())
    seen: set[int] = set()
    candidates = []
    for name, value in found:
        if isinstance(value, asyncio.Semaphore) and _BASE not in type(value).__dict__ and id(value) not in seen:
            seen.add(id(value))
            candidates.append((name, value))
    return candidates


def _limit_of(semaphore: Any) -> int:
    bound = getattr(semaphore, "_bound_value", None)  # BoundedSemaphore
    return int(bound) if isinstance(bound, int) else max(int(semaphore._value), 0)


def _start() -> None:
    provider = otel_metrics.get_meter_provider()
    if _state.histogram is not None and _state.provider is provider:
        return
    _state.provider = provider
    meter = metrics.meter()
    _state.histogram = metrics.histogram(
        "gym.concurrency.queue_wait_duration_ms",
        "ms",
        "Time one acquisition of a Gym concurrency limit (asyncio semaphore) waited.",
        WAIT_BOUNDARIES_MS,
    )
    for name, read, description in (
        ("gym.concurrency.limit", lambda s, limit: limit, "Size of a Gym concurrency limit."),
        ("gym.concurrency.active", lambda s, limit: max(limit - s._value, 0), "Holders of a Gym concurrency limit."),
        ("gym.concurrency.available", lambda s, limit: max(s._value, 0), "Free slots of a Gym concurrency limit."),
        (
            "gym.concurrency.queue_depth",
            lambda s, limit: len(s._waiters or ()),
            "Acquisitions waiting on a Gym concurrency limit.",
        ),
    ):
        meter.create_observable_gauge(
            name,
            callbacks=[_observer(read)],
            unit="{slot}" if "depth" not in name else "{waiter}",
            description=description,
        )


def _observer(read: Any) -> Any:
    def observe(_options: Any) -> list[Any]:
        _rescan()
        points = []
        for ref, attributes, limit in list(_sites):
            semaphore = ref()
            if semaphore is not None:
                free = semaphore._value
                if free > limit[0] and not hasattr(semaphore, "_bound_value"):
                    limit[0] = free
                points.append(otel_metrics.Observation(read(semaphore, limit[0]), attributes))
        return points

    return observe


def _rescan() -> None:
    """Semaphores the watched servers made or replaced since: observed from now on."""
    now = time.monotonic()
    if now - _state.rescanned < RESCAN_SECONDS:
        return
    _state.rescanned = now
    try:
        for ref, name in list(_servers):
            server = ref()
            if server is not None:
                _observe(server, name)
    except Exception as error:
        warn_once("concurrency:rescan", "Gym's later concurrency limits are not observed: %r", error)


def _observe(server: Any, server_name: str) -> int:
    found = _candidates(server)
    if not found:
        return 0
    with _lock:
        for attribute, semaphore in found:
            if _BASE in type(semaphore).__dict__:  # another thread was first
                continue
            attributes = {CONCURRENCY_SITE: f"{type(server).__name__}.{attribute}", SERVER_NAME: server_name}
            # a semaphore that replaces another at the same site takes its place
            _sites[:] = [site for site in _sites if site[1] != attributes]
            setattr(semaphore, _ATTRIBUTES, attributes)
            _sites.append((weakref.ref(semaphore), attributes, [_limit_of(semaphore)]))
            semaphore.__class__ = _observed_class(type(semaphore))
    return len(found)


def watch_server(server: Any, server_name: str) -> int:
    """Observe the semaphores of a Gym server about to serve, now and at every later
    collection; how many were found now."""
    if not metrics.LIVE:
        return 0
    try:
        with _start_lock:  # never under _lock: the SDK calls our gauges under a lock of its own
            _start()  # the gauges exist from now on: their collections look at the server again
        _footprint.record(PATCH, _restore)  # pointcuts.PROCESS_PATCHES: uninstrument calls it
        with _lock:
            if not any(ref() is server for ref, _ in _servers):
                _servers.append((_reference(server), server_name))
        return _observe(server, server_name)
    except Exception as error:
        warn_once("concurrency:watch", "Gym's concurrency limits are not observed: %r", error)
        return 0


def _reference(server: Any) -> Any:
    try:
        return weakref.ref(server)
    except TypeError:  # not weakly referenceable: a server lives as long as its process anyway
        return lambda: server


def restore() -> None:
    """Give every observed semaphore its own class back (tests; uninstrument restores
    it through ``_footprint``)."""
    _footprint.discard(PATCH)
    _restore()


def _restore() -> None:
    with _lock:
        for ref, _, _ in _sites:
            semaphore = ref()
            base = type(semaphore).__dict__.get(_BASE) if semaphore is not None else None
            if base is not None:
                semaphore.__class__ = base
                semaphore.__dict__.pop(_ATTRIBUTES, None)
        _sites.clear()
        _servers.clear()
        _state.histogram = None
        _state.rescanned = 0.0
