"""The session's meter provider for the in-process metrics tests, read by an in-memory reader:
set once (OpenTelemetry allows one); every test reads the cumulative points and compares
against what it did itself (deltas)."""

from __future__ import annotations

import pytest

from gym_autoinstr.telemetry import metrics, runtime


@pytest.fixture(scope="session")
def reader():
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if otel_metrics.get_meter_provider().__class__.__name__ != "MeterProvider":
        pytest.skip("another test already set a global meter provider")
    assert metrics.activate()
    runtime.start()
    yield reader
    runtime.stop()
