"""Runtime metrics of a Gym process: what holds its event loop, its collector, its OS share.

Nothing here runs per request; started once metrics are live (``setup/meters.py``).  The
event-loop lag probe, one task per loop, also records the GC pauses ``gc.callbacks``
queue; process metrics are read with psutil at collection time.  The instruments:
docs/spans-and-metrics.md; their cost: docs/architecture.md, "What makes it cheap".
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as otel_metrics

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.attributes import GC_GENERATION
from gym_autoinstr.telemetry import metrics

LAG_INTERVAL_S = settings.LOOP_LAG_INTERVAL_MS.default / 1000.0
# The probe's first sleep; each next one doubles, up to the interval.
FIRST_SLEEP_S = 0.1
LAG_INTERVAL_ENV = settings.LOOP_LAG_INTERVAL_MS.name
LAG_BOUNDARIES_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000)
GC_BOUNDARIES_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000)


@dataclass(slots=True)
class _RuntimeState:
    lag: Any = None  # the loop-lag histogram
    gc: Any = None  # our gc callback
    loops: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)  # loops with a probe
    started: bool = False
    tasks: set[Any] = field(default_factory=set)  # the probes' tasks (a loop holds tasks weakly)
    pause: Any = None  # the GC pause histogram


_state = _RuntimeState()
_GENERATIONS = tuple({GC_GENERATION: g} for g in range(3))
# (pause ms, generation) appended by the GC callback, recorded by `drain_gc_pauses`.
# Bounded: drained at every probe wake-up and flush; 16384 is far more than a server
# collects between two of them even with the probe set to seconds.
_pauses: collections.deque[tuple[float, int]] = collections.deque(maxlen=16384)


def start(who: Any = None) -> None:
    """Register the runtime instruments on the live meter provider (once per process)."""
    if _state.started:
        return
    _state.started = True
    meter = metrics.meter()
    try:
        _state.lag = metrics.histogram(
            "gym.event_loop.lag_ms", "ms", "How late a sleeping coroutine woke on the event loop.", LAG_BOUNDARIES_MS
        )
        _start_gc(meter)
    except Exception as error:
        warn_once("runtime-metrics", "event-loop and GC metrics are off: %r", error)
    _start_process_metrics()


# -- event loop --------------------------------------------------------------------------


def watch_running_loop() -> None:
    """Start the lag probe on the running loop, once per loop (from the app's lifespan)."""
    lag = _state.lag
    if lag is None or not metrics.LIVE:
        return
    try:
        loop = asyncio.get_running_loop()
        if loop in _state.loops:  # weakly held: a closed loop's successor may reuse its id
            return
        _state.loops.add(loop)
        task = loop.create_task(_probe(loop, lag), name="gym-autoinstr-loop-lag")
        _state.tasks.add(task)  # keep a reference: the loop holds tasks weakly
        task.add_done_callback(_state.tasks.discard)
    except Exception as error:
        warn_once("loop-lag", "event-loop lag probe not started: %r", error)


def lag_interval_s() -> float:
    """The probe's sleep: ``GYM_AUTOINSTR_LOOP_LAG_INTERVAL_MS``, else ``LAG_INTERVAL_S``.
    Each wake-up costs the process a few microseconds, and an idle server wakes for it."""
    return settings.LOOP_LAG_INTERVAL_MS.read() / 1000.0


async def _probe(loop: asyncio.AbstractEventLoop, lag: Any) -> None:
    interval = lag_interval_s()
    sleep = min(FIRST_SLEEP_S, interval)
    clock = loop.time
    while True:
        before = clock()
        await asyncio.sleep(sleep)
        late = clock() - before - sleep
        lag.record(late * 1000.0 if late > 0 else 0.0)
        if _pauses:
            drain_gc_pauses()
        if sleep < interval:
            sleep = min(sleep * 2.0, interval)


# -- garbage collector -------------------------------------------------------------------


def _start_gc(meter: Any) -> None:
    _state.pause = metrics.histogram(
        "gym.gc.pause_duration_ms",
        "ms",
        "Duration of one garbage collection (the process is paused).",
        GC_BOUNDARIES_MS,
    )
    started = [0.0]
    clock = time.perf_counter
    pauses = _pauses

    def on_gc(phase: str, info: dict) -> None:
        # No SDK call here: only a float and an atomic deque append.
        if phase == "start":
            started[0] = clock()
        elif started[0]:
            pauses.append(((clock() - started[0]) * 1000.0, info.get("generation", 0)))
            started[0] = 0.0

    gc.callbacks.append(on_gc)
    _state.gc = on_gc
    for name, key, unit, description in (
        ("gym.gc.collections_total", "collections", "{collection}", "Garbage collections by generation."),
        ("gym.gc.collected_total", "collected", "{object}", "Objects the garbage collector freed, by generation."),
        (
            "gym.gc.uncollectable_total",
            "uncollectable",
            "{object}",
            "Objects the garbage collector found uncollectable.",
        ),
    ):
        meter.create_observable_counter(name, callbacks=[_gc_stat(key)], unit=unit, description=description)


def drain_gc_pauses() -> None:
    """Record the pauses the GC callback queued (from the loop-lag probe, never from GC)."""
    pause = _state.pause
    if pause is None:
        return
    while _pauses:
        try:
            ms, generation = _pauses.popleft()
            pause.record(ms, _GENERATIONS[generation if 0 <= generation < 3 else 0])
        except IndexError:
            return
        except Exception as error:
            warn_once("gc-pauses", "GC pauses not recorded: %r", error)
            return


def _gc_stat(key: str) -> Any:
    def observe(_options: Any) -> list[Any]:
        return [
            otel_metrics.Observation(stats.get(key, 0), _GENERATIONS[g]) for g, stats in enumerate(gc.get_stats()[:3])
        ]

    return observe


def stop() -> None:
    """Take the GC callback off (tests)."""
    callback = _state.gc
    if callback in gc.callbacks:
        gc.callbacks.remove(callback)
    _state.gc, _state.lag, _state.started = None, None, False
    _state.loops = weakref.WeakSet()


# -- process ---------------------------------------------------------------------------
#
# contrib's opentelemetry-instrumentation-system-metrics observes the same names, but it
# pins opentelemetry-instrumentation to its own exact release, which sends pip's resolver
# into a long backtrack whenever the contrib releases drift apart (0.66b2 without an
# aiohttp-client 0.66b2); these five observations are all we need of it, on psutil.


def _start_process_metrics() -> None:
    try:
        import psutil
    except Exception as error:
        warn_once(
            "process-metrics", "process.* metrics are off: psutil could not be imported (%r); install psutil.", error
        )
        return
    process = psutil.Process()
    meter = metrics.meter()
    user, system = {"cpu.mode": "user"}, {"cpu.mode": "system"}
    voluntary, involuntary = (
        {"process.context_switch_type": "voluntary"},
        {"process.context_switch_type": "involuntary"},
    )

    def cpu_time(_options: Any) -> list[Any]:
        times = process.cpu_times()
        return [otel_metrics.Observation(times.user, user), otel_metrics.Observation(times.system, system)]

    def memory(_options: Any) -> list[Any]:
        return [otel_metrics.Observation(process.memory_info().rss)]

    def virtual(_options: Any) -> list[Any]:
        return [otel_metrics.Observation(process.memory_info().vms)]

    def threads(_options: Any) -> list[Any]:
        return [otel_metrics.Observation(process.num_threads())]

    def descriptors(_options: Any) -> list[Any]:
        return [otel_metrics.Observation(process.num_fds())] if hasattr(process, "num_fds") else []

    def switches(_options: Any) -> list[Any]:
        counts = process.num_ctx_switches()
        return [
            otel_metrics.Observation(counts.voluntary, voluntary),
            otel_metrics.Observation(counts.involuntary, involuntary),
        ]

    try:
        meter.create_observable_counter(
            "process.cpu.time", callbacks=[cpu_time], unit="s", description="Total CPU seconds by mode."
        )
        meter.create_observable_up_down_counter(
            "process.memory.usage", callbacks=[memory], unit="By", description="Physical memory in use (RSS)."
        )
        meter.create_observable_up_down_counter(
            "process.memory.virtual", callbacks=[virtual], unit="By", description="Virtual memory committed."
        )
        meter.create_observable_up_down_counter(
            "process.thread.count", callbacks=[threads], unit="{thread}", description="Threads of the process."
        )
        meter.create_observable_up_down_counter(
            "process.open_file_descriptor.count",
            callbacks=[descriptors],
            unit="{file_descriptor}",
            description="Open file descriptors.",
        )
        meter.create_observable_counter(
            "process.context_switches",
            callbacks=[switches],
            unit="{context_switch}",
            description="Context switches by type.",
        )
    except Exception as error:
        warn_once("process-metrics", "process.* metrics are off: %r", error)
