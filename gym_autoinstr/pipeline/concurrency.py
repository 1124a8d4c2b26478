"""The concurrency limits Gym's servers enforce with asyncio semaphores, by site.

Gym's servers cap their own work with ``asyncio.Semaphore`` objects they create at
construction and keep on the server (the model server's ``max_concurrent_requests``,
0.7's environment ``max_concurrent_episodes``, the verifiers' ``num_processes``, the
agents' ``concurrency``, ...).  When a server starts serving (``run_webserver``), the
semaphores on it (attributes and pydantic private attributes, one level deep) are found
once and observed from then on; a site is ``<server class>.<attribute>``.

* ``gym.concurrency.limit``, ``.active`` (held), ``.available`` and ``.queue_depth``
  (waiting): observable gauges by ``nemo.gym.concurrency.site`` and
  ``nemo.gym.server.name``, read off the semaphore at collection time;
* ``gym.concurrency.queue_wait_duration_ms`` (histogram): how long one acquisition waited,
  recorded only for acquisitions that had to wait.

To time waits without a cost on the free path, each found semaphore's class is swapped
for a subclass whose ``acquire`` tests for a free slot and no waiters and then returns
the base class's own coroutine; only a waiting acquisition goes through a timing coroutine.
``isinstance`` still holds, nothing else changes; ``restore()`` swaps the classes back.
A free acquire-and-release costs about 0.3 us more than on a bare semaphore (``semaphore``
in ``benchmarks/micro.py``), beside work a Gym limit guards that takes milliseconds.
The limit is the semaphore's value when found (the server has not served a request yet).
Semaphores made later, or kept deeper than the server's own attributes, are not seen.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

from opentelemetry import metrics as otel_metrics

from .._log import warn_once
from . import metrics

SITE = "nemo.gym.concurrency.site"
WAIT_BOUNDARIES_MS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
                      300_000, 1_800_000)

# (weak semaphore, attributes, limit)
_sites: list[tuple[Any, dict[str, str], int]] = []
_lock = threading.Lock()
_state: dict[str, Any] = {"histogram": None}
_subclasses: dict[type, type] = {}
_ATTRIBUTES = "_gym_autoinstr_concurrency"


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

    cls = type(base.__name__, (base,), {"acquire": observed_acquire, "__module__": base.__module__,
                                        "__qualname__": base.__qualname__, "_gym_autoinstr_base": base})
    _subclasses[base] = cls
    return cls


async def _timed(semaphore: Any, acquire: Any) -> Any:
    started = time.perf_counter()
    try:
        return await acquire(semaphore)
    finally:
        histogram = _state["histogram"]
        if histogram is not None:
            try:
                histogram.record((time.perf_counter() - started) * 1000.0, getattr(semaphore, _ATTRIBUTES))
            except Exception as error:
                warn_once("concurrency:record", "semaphore wait not recorded: %r", error)


def _candidates(server: Any) -> list[tuple[str, Any]]:
    found = list(getattr(server, "__dict__", {}).items())
    private = getattr(server, "__pydantic_private__", None)
    if isinstance(private, dict):
        found += list(private.items())
    return [(name, value) for name, value in found if type(value) in (asyncio.Semaphore, asyncio.BoundedSemaphore)]


def _start() -> None:
    provider = otel_metrics.get_meter_provider()
    if _state["histogram"] is not None and _state.get("provider") is provider:
        return
    _state["provider"] = provider
    meter = metrics.meter()
    _state["histogram"] = meter.create_histogram(
        "gym.concurrency.queue_wait_duration_ms", unit="ms",
        description="Time one acquisition of a Gym concurrency limit (asyncio semaphore) waited.",
        explicit_bucket_boundaries_advisory=list(WAIT_BOUNDARIES_MS),
    )
    for name, read, description in (
        ("gym.concurrency.limit", lambda s, limit: limit, "Size of a Gym concurrency limit."),
        ("gym.concurrency.active", lambda s, limit: max(limit - s._value, 0), "Holders of a Gym concurrency limit."),
        ("gym.concurrency.available", lambda s, limit: max(s._value, 0), "Free slots of a Gym concurrency limit."),
        ("gym.concurrency.queue_depth", lambda s, limit: len(s._waiters or ()), "Acquisitions waiting on a Gym concurrency limit."),
    ):
        meter.create_observable_gauge(name, callbacks=[_observer(read)], unit="{slot}" if "depth" not in name else "{waiter}",
                                      description=description)


def _observer(read: Any) -> Any:
    def observe(_options: Any) -> list[Any]:
        points = []
        for ref, attributes, limit in list(_sites):
            semaphore = ref()
            if semaphore is not None:
                points.append(otel_metrics.Observation(read(semaphore, limit), attributes))
        return points

    return observe


def watch_server(server: Any, server_name: str) -> int:
    """Find and observe the semaphores on a Gym server about to serve; how many were found."""
    if not metrics.LIVE:
        return 0
    try:
        found = _candidates(server)
        if not found:
            return 0
        with _lock:
            _start()
            for attribute, semaphore in found:
                attributes = {SITE: f"{type(server).__name__}.{attribute}", metrics.SERVER_NAME: server_name}
                setattr(semaphore, _ATTRIBUTES, attributes)
                _sites.append((weakref.ref(semaphore), attributes, int(semaphore._value)))
                semaphore.__class__ = _observed_class(type(semaphore))
        return len(found)
    except Exception as error:
        warn_once("concurrency:watch", "Gym's concurrency limits are not observed: %r", error)
        return 0


def restore() -> None:
    """Give every observed semaphore its own class back (uninstrument, tests)."""
    with _lock:
        for ref, _, _ in _sites:
            semaphore = ref()
            base = getattr(type(semaphore), "_gym_autoinstr_base", None) if semaphore is not None else None
            if base is not None:
                semaphore.__class__ = base
        _sites.clear()
        _state["histogram"] = None
