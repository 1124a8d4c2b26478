"""Our request histograms against the SDK's: the same values recorded into each, the
same exported data, through a real ``PeriodicExportingMetricReader`` and ``MeterProvider``
(private to each test, never the global one)."""

from __future__ import annotations

import random

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)

from gym_autoinstr.fastpath import histograms

BOUNDS = (5, 10, 25, 50, 100, 250)


class Keep(MetricExporter):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.batches = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def _pipeline(fast: bool):
    inner = Keep()
    exporter = histograms.MergingExporter(inner) if fast else inner
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    if fast:
        assert histograms.bind(provider, [reader])
    meter = provider.get_meter("gym_autoinstr", "1")
    # SDK instruments beside (as the runtime's GC counters are in every process of ours)
    meter.create_observable_gauge("other.gauge", callbacks=[lambda _o: [Observation(1)]])
    counter = meter.create_counter("other.count")
    histogram = histograms.histogram(meter, provider, "gym.test.duration_ms", "ms", "A test histogram.", BOUNDS)
    return provider, inner, histogram, counter


def _by_name(batch):
    out = {}
    for resource_metrics in batch.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                out[metric.name] = (scope_metrics.scope.name, metric)
    return out


def _points(metric):
    return {
        frozenset(p.attributes.items()): (p.count, p.sum, p.min, p.max, list(p.bucket_counts), tuple(p.explicit_bounds))
        for p in metric.data.data_points
    }


@pytest.fixture(autouse=True)
def _unbind():
    yield
    histograms.unbind()


def test_the_same_values_export_as_the_sdks_histogram_would():
    # more values than a point holds before it folds them; negative and non-finite values
    # after each set's first value (negatives dropped by every SDK, +inf and NaN by SDK 1.44+
    # only: older ones count them, ours must do as the installed one); ints beside floats
    values = (
        [0, 0.5, 5, 5.0001, 10, 24.9, 25, 250, 250.1, 10_000, -1, -0.5, 7, 25.0]
        + [random.uniform(0, 400) for _ in range(3 * histograms.FOLD_AT + 7)]
        + [float("inf"), -3, float("nan")]
    )
    attribute_sets = [{"outcome": "success"}, {"outcome": "failure", "server": "a"}, {}]
    exported = {}
    for fast in (False, True):
        provider, inner, histogram, counter = _pipeline(fast)
        if fast:
            assert isinstance(histogram, histograms.FastHistogram)
        for i, value in enumerate(values):
            histogram.record(value, attribute_sets[i % 3])
        counter.add(3)
        provider.force_flush()
        (batch,) = inner.batches
        exported[fast] = _by_name(batch)
        provider.shutdown()
    sdk, ours = exported[False], exported[True]
    assert set(sdk) == set(ours) == {"gym.test.duration_ms", "other.count", "other.gauge"}
    (sdk_scope, sdk_metric), (our_scope, our_metric) = sdk["gym.test.duration_ms"], ours["gym.test.duration_ms"]
    assert our_scope == sdk_scope == "gym_autoinstr"
    assert (our_metric.unit, our_metric.description) == (sdk_metric.unit, sdk_metric.description)
    assert (
        our_metric.data.aggregation_temporality
        == sdk_metric.data.aggregation_temporality
        == AggregationTemporality.CUMULATIVE
    )
    sdk_points, our_points = _points(sdk_metric), _points(our_metric)
    assert set(sdk_points) == set(our_points)
    for key, (count, total, low, high, buckets, bounds) in sdk_points.items():
        o_count, o_total, o_low, o_high, o_buckets, o_bounds = our_points[key]
        assert (o_count, o_low, o_high, o_buckets, o_bounds) == (count, low, high, buckets, bounds)
        assert o_total == pytest.approx(total, nan_ok=True)
    assert ours["other.count"][1].data.data_points[0].value == 3  # the SDK's own instruments pass through


def test_cumulative_across_exports_with_a_fixed_start_time():
    provider, inner, histogram, _ = _pipeline(True)
    histogram.record(7, {"k": "v"})
    provider.force_flush()
    histogram.record(70, {"k": "v"})
    provider.force_flush()
    first, second = (_by_name(b)["gym.test.duration_ms"][1].data.data_points[0] for b in inner.batches)
    assert (first.count, second.count, second.sum, second.max) == (1, 2, 77, 70)
    assert first.start_time_unix_nano == second.start_time_unix_nano < second.time_unix_nano
    provider.shutdown()


def test_negative_values_dropped_and_attribute_sets_bounded(monkeypatch):
    monkeypatch.setattr(histograms, "MAX_ATTRIBUTE_SETS", 3)
    provider, inner, histogram, _ = _pipeline(True)
    histogram.record(-1, {"k": "v"})
    for i in range(5):
        histogram.record(1, {"k": str(i)})
    provider.force_flush()
    points = _points(_by_name(inner.batches[0])["gym.test.duration_ms"][1])
    assert len(points) == 4 and points[frozenset({("otel.metric.overflow", True)})][0] == 2
    assert sum(p[0] for p in points.values()) == 5
    provider.shutdown()


def test_a_dict_seen_before_lands_on_its_point_and_the_memory_of_dicts_is_bounded(monkeypatch):
    monkeypatch.setattr(histograms, "MAX_ATTRIBUTE_SETS", 4)  # dicts remembered: at most 8
    provider, inner, histogram, _ = _pipeline(True)
    kept = {"k": "kept"}
    for _i in range(20):
        histogram.record(1, kept)  # the same object: found by identity
        histogram.record(2, {"k": "kept"})  # an equal dict made anew each time
        histogram.record(3, {"k": "other"})
    histogram.record(4)
    histogram.record(4, None)
    assert len(histogram._seen) <= 8
    provider.force_flush()
    points = _points(_by_name(inner.batches[0])["gym.test.duration_ms"][1])
    assert {key: value[:2] for key, value in points.items()} == {
        frozenset({("k", "kept")}): (40, 60.0),
        frozenset({("k", "other")}): (20, 60.0),
        frozenset(): (2, 8.0),
    }
    provider.shutdown()


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"},
        {"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"},
        {"OTEL_METRICS_EXEMPLAR_FILTER": "trace_based"},
        {histograms.ENV: "0"},
    ],
)
def test_the_sdks_histograms_whenever_ours_could_not_match(monkeypatch, env):
    monkeypatch.delenv(histograms.ENV, raising=False)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    assert histograms.qualifies(OTLPMetricExporter())  # on by default
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert not histograms.qualifies(OTLPMetricExporter())


def test_a_provider_not_bound_gets_the_sdks_histogram():
    inner = Keep()
    reader = PeriodicExportingMetricReader(inner, export_interval_millis=10**9)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    # not every reader merges: not bound
    assert not histograms.bind(provider, [reader])
    made = histograms.histogram(provider.get_meter("m"), provider, "h", "ms", "d", BOUNDS)
    assert not isinstance(made, histograms.FastHistogram)
    provider.shutdown()


def test_values_recorded_from_many_threads_while_exports_run_are_each_counted_once():
    import threading

    provider, inner, histogram, _ = _pipeline(True)
    attributes = {"k": "v"}
    threads, per_thread = 8, 4 * histograms.FOLD_AT + 3
    start = threading.Barrier(threads + 1)

    def record(offset):
        start.wait()
        for i in range(per_thread):
            histogram.record((i + offset) % 300, attributes)

    workers = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    while any(worker.is_alive() for worker in workers):
        provider.force_flush()
    for worker in workers:
        worker.join()
    provider.force_flush()
    last = _points(_by_name(inner.batches[-1])["gym.test.duration_ms"][1])
    ((count, total, low, high, buckets, _bounds),) = last.values()
    expected = [(i + n) % 300 for n in range(threads) for i in range(per_thread)]
    assert count == len(expected) == sum(buckets)
    assert (total, low, high) == (sum(expected), 0, 299)
    assert buckets == [
        sum(1 for v in expected if lo < v <= hi) for lo, hi in zip((float("-inf"),) + BOUNDS, BOUNDS + (float("inf"),))
    ]
    provider.shutdown()
