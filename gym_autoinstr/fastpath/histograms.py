"""Histograms recorded on Gym's request path, aggregated here and exported with the SDK's.

``histogram()`` hands out a ``FastHistogram`` (a record appends to its attribute set's
point, found by the dict's identity; values are folded in bulk) when every reader exports
through a ``MergingExporter``, which adds the snapshots to the SDK's batch; otherwise the
SDK's instrument.  Why, and when: docs/architecture.md, "What makes it cheap".
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import contract

ENV = settings.FAST_HISTOGRAMS.name
# The SDK's default cardinality limit: attribute sets beyond it share one overflow point.
MAX_ATTRIBUTE_SETS = 2000
_OVERFLOW = (("otel.metric.overflow", True),)
_NO_ATTRIBUTES: frozenset = frozenset()
_INFINITY = float("inf")


@dataclass(slots=True)
class _HistogramsState:
    provider: Any = None  # the meter provider ours are bound to
    histograms: list = field(default_factory=list)  # ours, merged at export
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _HistogramsState()


def enabled_by_env() -> bool:
    return settings.FAST_HISTOGRAMS.read()


# Values a point holds before the thread recording the next one folds them in.
FOLD_AT = 512


class _Point:
    __slots__ = ("start", "count", "sum", "min", "max", "buckets", "pending")

    def __init__(self, size: int) -> None:
        self.start = time.time_ns()
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.buckets = [0] * size
        # values recorded and not folded yet; appended to without the lock (one C-level
        # append), taken off its front only under the lock (see ``_fold``)
        self.pending: list = []


def _kept_by_sdk(amount: float) -> bool:
    """Whether the installed SDK's histogram keeps this negative or non-finite value: SDKs
    before 1.44 drop only what is ``< 0`` (so they keep +inf and NaN); newer ones drop every
    non-finite value too."""
    if amount < 0 or (amount == amount and amount != _INFINITY):
        return False
    return _sdk_keeps_non_finite()


_KEEPS_NON_FINITE: list[bool] = []  # computed once, on the first non-finite value


def _sdk_keeps_non_finite() -> bool:
    if not _KEEPS_NON_FINITE:
        try:
            from opentelemetry.sdk.metrics import Histogram  # the instrument (public), as it records

            _KEEPS_NON_FINITE.append("isfinite" not in Histogram.record.__code__.co_names)
        except Exception:  # a changed SDK: drop them, as the newest does
            _KEEPS_NON_FINITE.append(False)
    return _KEEPS_NON_FINITE[0]


class FastHistogram:
    """An explicit-bucket histogram with the SDK's semantics for one instrument."""

    def __init__(self, name: str, unit: str, description: str, boundaries: Sequence[float]) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.boundaries = tuple(float(b) for b in boundaries)
        self._points: dict[Any, _Point] = {}
        # id(attributes dict) -> (that dict, its point).  Our recorders pass the same few
        # pre-built dicts and never change one, so a dict seen before skips building and
        # hashing its key; the entry holds the dict, so its id cannot be reused meanwhile.
        self._seen: dict[int, tuple[Any, _Point]] = {}
        self._lock = threading.Lock()

    def record(self, amount: float, attributes: dict | None = None, context: Any = None) -> None:
        seen = self._seen.get(id(attributes))
        if seen is not None and seen[0] is attributes:
            point = seen[1]
        else:
            if not 0 <= amount < _INFINITY and not _kept_by_sdk(amount):  # as the SDK (a known set's: at the fold)
                warn_once(f"histogram-dropped:{self.name}", "%s: negative or non-finite value dropped", self.name)
                return
            with self._lock:
                point = self._point_of(attributes)
            if point is None:
                return
        pending = point.pending
        pending.append(amount)
        if len(pending) >= FOLD_AT:
            with self._lock:
                self._fold(point)

    def _fold(self, point: _Point) -> None:
        """Add the point's pending values to it (lock held).  Values appended meanwhile
        stay pending: only the ones counted here are taken off the list's front."""
        pending = point.pending
        taken = len(pending)
        if not taken:
            return
        amounts = pending[:taken]
        del pending[:taken]
        total = sum(amounts)
        if not isfinite(total) or min(amounts) < 0:  # a negative, infinite or NaN value somewhere
            kept = [a for a in amounts if 0 <= a < _INFINITY or _kept_by_sdk(a)]
            if len(kept) != len(amounts):
                warn_once(
                    f"histogram-dropped:{self.name}",
                    "%s: %d negative or non-finite value(s) dropped",
                    self.name,
                    len(amounts) - len(kept),
                )
            nans = [a for a in kept if a != a]
            if nans:  # (an SDK that keeps them) NaN: counted, in the first bucket, the sum NaN
                point.count += len(nans)
                point.sum += nans[0]
                point.buckets[0] += len(nans)
                kept = [a for a in kept if a == a]
            amounts, total = kept, sum(kept)
            if not amounts:
                return
        amounts.sort()
        point.count += len(amounts)
        point.sum += total
        if amounts[0] < point.min:
            point.min = amounts[0]
        if amounts[-1] > point.max:
            point.max = amounts[-1]
        # bucket i holds bounds[i-1] < value <= bounds[i] (the SDK's bisect_left on the
        # bounds); on the sorted values, how many are <= a bound is bisect_right's index
        buckets, below = point.buckets, 0
        for i, bound in enumerate(self.boundaries):
            upto = bisect_right(amounts, bound)
            if upto != below:
                buckets[i] += upto - below
                below = upto
        if below != len(amounts):
            buckets[-1] += len(amounts) - below

    def _point_of(self, attributes: dict | None) -> _Point | None:
        """The point of ``attributes`` (lock held), made on first use; remembered by the
        dict's identity (see ``_seen``)."""
        try:
            key = frozenset(attributes.items()) if attributes else _NO_ATTRIBUTES
        except TypeError:  # a list value: not one of ours
            warn_once(f"histogram-attributes:{self.name}", "%s: unhashable attributes, value dropped", self.name)
            return None
        point = self._points.get(key)
        if point is None:
            if len(self._points) >= MAX_ATTRIBUTE_SETS:
                key = frozenset(_OVERFLOW)
                point = self._points.get(key)
            if point is None:
                point = self._points[key] = _Point(len(self.boundaries) + 1)
        if len(self._seen) >= 2 * MAX_ATTRIBUTE_SETS:
            self._seen.clear()
        self._seen[id(attributes)] = (attributes, point)
        return point

    def metric(self, now: int) -> Any:
        """This instrument's cumulative data as an SDK ``Metric`` (None before any record)."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, HistogramDataPoint, Metric

        with self._lock:
            for point in self._points.values():
                self._fold(point)
            snapshot = [
                (dict(key), p.start, p.count, p.sum, p.min, p.max, list(p.buckets))
                for key, p in self._points.items()
                if p.count
            ]
        if not snapshot:
            return None
        # (SDKs before exemplars have no such field)
        extra = {"exemplars": []} if "exemplars" in getattr(HistogramDataPoint, "__dataclass_fields__", ()) else {}
        points = [
            HistogramDataPoint(
                attributes=attributes,
                start_time_unix_nano=start,
                time_unix_nano=now,
                count=count,
                sum=total,
                bucket_counts=buckets,
                explicit_bounds=self.boundaries,
                min=low,
                max=high,
                **extra,
            )
            for attributes, start, count, total, low, high, buckets in snapshot
        ]
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE),
        )


def active(provider: Any) -> bool:
    """Fast histograms serve ``provider`` (bound by ``setup/meters.py`` when it qualifies)."""
    return provider is not None and provider is _state.provider


def histogram(meter: Any, provider: Any, name: str, unit: str, description: str, boundaries: Sequence[float]) -> Any:
    """A fast histogram when ``provider`` is the one bound here, else the SDK's."""
    if active(provider):
        with _state.lock:
            for existing in _state.histograms:
                if existing.name == name:
                    return existing
            made = FastHistogram(name, unit, description, boundaries)
            _state.histograms.append(made)
            return made
    return meter.create_histogram(
        name, unit=unit, description=description, explicit_bucket_boundaries_advisory=list(boundaries)
    )


def qualifies(exporter: Any) -> bool:
    """``exporter`` takes histograms as the fast ones write them: cumulative, explicit
    buckets (the SDK's default aggregation), and no exemplars were asked for."""
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality
    from opentelemetry.sdk.metrics.view import DefaultAggregation, ExplicitBucketHistogramAggregation

    if not enabled_by_env() or not contract.part_on(contract.HISTOGRAMS) or settings.METRICS_EXEMPLAR_FILTER.read():
        return False
    temporality = (getattr(exporter, contract.PREFERRED_TEMPORALITY, None) or {}).get(Histogram)
    aggregation = (getattr(exporter, contract.PREFERRED_AGGREGATION, None) or {}).get(Histogram)
    explicit = type(aggregation) is ExplicitBucketHistogramAggregation and (
        getattr(aggregation, contract.BUCKET_BOUNDARIES, 0) is None
        and getattr(aggregation, contract.RECORD_MIN_MAX, False) is True
    )
    return temporality in (None, AggregationTemporality.CUMULATIVE) and (
        aggregation is None or type(aggregation) is DefaultAggregation or explicit
    )


def bind(provider: Any, readers: Sequence[Any]) -> bool:
    """Serve ``provider`` with fast histograms if every reader exports through a
    ``MergingExporter``; returns whether it does."""
    ok = bool(readers) and all(isinstance(getattr(r, contract.READER_EXPORTER, None), MergingExporter) for r in readers)
    with _state.lock:
        _state.provider = provider if ok else None
        _state.histograms = []
    return ok


def unbind() -> None:
    with _state.lock:
        _state.provider = None
        _state.histograms = []


def _merged(metrics_data: Any) -> Any:
    """``metrics_data`` with the fast histograms added to the ``gym_autoinstr`` scope."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from gym_autoinstr.version import __version__

    now = time.time_ns()
    extra = [m for m in (h.metric(now) for h in list(_state.histograms)) if m is not None]
    if not extra or not metrics_data.resource_metrics:
        return metrics_data
    first, *rest = metrics_data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, scope_metrics in enumerate(scopes):
        if scope_metrics.scope.name == "gym_autoinstr":
            scopes[i] = ScopeMetrics(
                scope=scope_metrics.scope, metrics=[*scope_metrics.metrics, *extra], schema_url=scope_metrics.schema_url
            )
            break
    else:
        scopes.append(
            ScopeMetrics(scope=InstrumentationScope("gym_autoinstr", __version__), metrics=extra, schema_url="")
        )
    merged = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
    return MetricsData(resource_metrics=[merged, *rest])


def _base() -> type:
    from opentelemetry.sdk.metrics.export import MetricExporter

    return MetricExporter


class MergingExporter(_base()):
    """Passes each batch to ``inner`` with the fast histograms' data added."""

    def __init__(self, inner: Any) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, contract.PREFERRED_TEMPORALITY, None),
            preferred_aggregation=getattr(inner, contract.PREFERRED_AGGREGATION, None),
        )
        self.inner = inner

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        try:
            if _state.histograms:
                metrics_data = _merged(metrics_data)
        except Exception as error:
            warn_once("histograms-merge", "request histograms left out of this export: %r", error)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
