"""The test harness's collector: real rotel-agent, real OpenTelemetry SDK exporters.

SDK --OTLP/HTTP or OTLP/gRPC--> rotel-agent --OTLP/HTTP gzip--> OtlpSink
"""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("rotel")
pytest.importorskip("opentelemetry.proto")
pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: E402
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: E402
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: E402
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402
from opentelemetry.proto.common.v1 import common_pb2  # noqa: E402
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402

from tests.harness.collector import Collector, OtlpSink  # noqa: E402


def _emit_trace(exporter, service_name: str, marker: str) -> dict:
    """Emit a SERVER parent and a CLIENT child span; return their SDK contexts."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name, "test.marker": marker}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gym-autoinstr.harness-test", "1.2.3")
    with tracer.start_as_current_span(
        f"parent {marker}", kind=SpanKind.SERVER, attributes={"http.route": "/run"}
    ) as parent:
        with tracer.start_as_current_span(
            f"child {marker}",
            kind=SpanKind.CLIENT,
            attributes={
                "marker": marker,
                "count": 7,
                "ratio": 0.5,
                "flag": True,
                "tags": ["a", "b"],
            },
        ) as child:
            child.add_event("upstream.called")
            child.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    return {
        "trace_id": format(parent.get_span_context().trace_id, "032x"),
        "parent_id": format(parent.get_span_context().span_id, "016x"),
        "child_id": format(child.get_span_context().span_id, "016x"),
    }


def _assert_trace_received(sink: OtlpSink, ids: dict, service_name: str, marker: str) -> None:
    def both_arrived(spans):
        names = {s["name"] for s in spans if s["trace_id"] == ids["trace_id"]}
        return {f"parent {marker}", f"child {marker}"} <= names

    assert sink.wait_for(both_arrived, timeout=15, interval=0.05), sink.spans()
    by_name = {s["name"]: s for s in sink.spans() if s["trace_id"] == ids["trace_id"]}
    parent = by_name[f"parent {marker}"]
    child = by_name[f"child {marker}"]

    assert parent["span_id"] == ids["parent_id"]
    assert parent["parent_span_id"] is None
    assert parent["kind"] == "SERVER"
    assert parent["attributes"] == {"http.route": "/run"}
    assert parent["status"] == "UNSET"

    assert child["span_id"] == ids["child_id"]
    assert child["parent_span_id"] == ids["parent_id"]
    assert child["trace_id"] == ids["trace_id"]
    assert child["kind"] == "CLIENT"
    assert child["attributes"] == {
        "marker": marker,
        "count": 7,
        "ratio": 0.5,
        "flag": True,
        "tags": ["a", "b"],
    }
    assert child["events"] == ["upstream.called"]
    assert child["status"] == "ERROR"
    assert child["status_message"] == "boom"
    assert child["scope"] == "gym-autoinstr.harness-test"
    assert parent["start_ns"] <= child["start_ns"] <= child["end_ns"] <= parent["end_ns"]

    for span in (parent, child):
        assert span["resource"]["service.name"] == service_name
        assert span["resource"]["test.marker"] == marker
        assert span["resource"]["telemetry.sdk.language"] == "python"

    # rotel forwards gzip-compressed OTLP/HTTP protobuf; the sink keeps the
    # decompressed bytes, in which the exported strings are visible.
    trace_requests = [r for r in sink.requests() if r["path"] == "/v1/traces"]
    assert trace_requests
    assert all(r["headers"].get("content-encoding") == "gzip" for r in trace_requests)
    assert any(marker.encode() in body for body in sink.raw_bodies())
    assert sink.errors() == []


def test_http_protobuf_export_reaches_sink(collector):
    exporter = HttpSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=10)
    ids = _emit_trace(exporter, "svc-http", "via-http-7f3a")
    _assert_trace_received(collector.sink, ids, "svc-http", "via-http-7f3a")


def test_grpc_export_reaches_sink(collector):
    exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=10)
    ids = _emit_trace(exporter, "svc-grpc", "via-grpc-91bc")
    _assert_trace_received(collector.sink, ids, "svc-grpc", "via-grpc-91bc")


def test_spans_arrive_quickly(collector):
    import time

    exporter = HttpSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=10)
    start = time.monotonic()
    ids = _emit_trace(exporter, "svc-latency", "latency")
    assert collector.sink.wait_for(
        lambda spans: sum(s["trace_id"] == ids["trace_id"] for s in spans) == 2,
        timeout=10,
        interval=0.02,
    )
    assert time.monotonic() - start < 2.0


def test_metrics_are_forwarded(collector):
    exporter = HttpMetricExporter(endpoint=f"{collector.http_endpoint}/v1/metrics", timeout=10)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "svc-metrics"}))
    provider.get_meter("harness-test").create_counter("harness.test.rollouts").add(3, {"k": "v"})
    provider.shutdown()  # forces a collect + export

    import time

    deadline = time.monotonic() + 15
    while "harness.test.rollouts" not in collector.sink.metric_names():
        assert time.monotonic() < deadline, collector.sink.requests()
        time.sleep(0.05)
    request = collector.sink.metrics_requests()[-1]
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    assert metric.name == "harness.test.rollouts"
    point = metric.sum.data_points[0]
    assert point.as_int == 3
    assert {kv.key: kv.value.string_value for kv in point.attributes} == {"k": "v"}


def test_exporter_retries_when_sink_fails(collector):
    collector.sink.fail_next(2, status=503)
    exporter = HttpSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=10)
    ids = _emit_trace(exporter, "svc-retry", "retry-marker")
    _assert_trace_received(collector.sink, ids, "svc-retry", "retry-marker")
    # the two failed attempts were seen (and kept) by the sink as well
    assert len([r for r in collector.sink.requests() if r["path"] == "/v1/traces"]) >= 3


def test_kill_and_restart_keep_ports(collector):
    http_endpoint, grpc_endpoint, pid = collector.http_endpoint, collector.grpc_endpoint, collector.pid
    collector.kill()
    assert not collector.is_running()
    collector.restart()
    assert collector.is_running()
    assert collector.pid != pid
    assert (collector.http_endpoint, collector.grpc_endpoint) == (http_endpoint, grpc_endpoint)

    ids = _emit_trace(
        HttpSpanExporter(endpoint=f"{http_endpoint}/v1/traces", timeout=10), "svc-restart", "after-restart"
    )
    _assert_trace_received(collector.sink, ids, "svc-restart", "after-restart")
    assert "Starting Rotel" in collector.log_path.read_text()


def test_stop_flushes_pending_batch(tmp_path):
    with OtlpSink() as sink:
        collector = Collector(tmp_path / "rotel", sink=sink, batch_timeout="60s")
        try:
            exporter = HttpSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=10)
            ids = _emit_trace(exporter, "svc-flush", "flush-on-stop")
            assert sink.spans() == []  # still batched inside rotel
        finally:
            collector.stop()
        assert not collector.is_running()
        _assert_trace_received(sink, ids, "svc-flush", "flush-on-stop")


def test_sink_decodes_gzip_and_plain_posts_directly():
    span = trace_pb2.Span(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name="direct",
        kind=trace_pb2.Span.SPAN_KIND_PRODUCER,
        attributes=[
            common_pb2.KeyValue(key="secret.probe", value=common_pb2.AnyValue(string_value="sk-XYZ")),
            common_pb2.KeyValue(
                key="nested",
                value=common_pb2.AnyValue(
                    kvlist_value=common_pb2.KeyValueList(
                        values=[common_pb2.KeyValue(key="n", value=common_pb2.AnyValue(int_value=1))]
                    )
                ),
            ),
        ],
    )
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=[span])])]
    )
    payload = request.SerializeToString()
    with OtlpSink() as sink:
        assert sink.url.startswith("http://127.0.0.1:")
        for body, headers in (
            (payload, {}),
            (gzip.compress(payload), {"Content-Encoding": "gzip"}),
        ):
            req = urllib.request.Request(
                f"{sink.url}/v1/traces",
                data=body,
                headers={"Content-Type": "application/x-protobuf", **headers},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 200
                assert resp.read() == b""  # empty ExportTraceServiceResponse
        spans = sink.spans()
        assert len(spans) == 2
        for s in spans:
            assert s["trace_id"] == bytes(range(16)).hex()
            assert s["span_id"] == bytes(range(8)).hex()
            assert s["parent_span_id"] is None
            assert s["kind"] == "PRODUCER"
            assert s["attributes"] == {"secret.probe": "sk-XYZ", "nested": {"n": 1}}
        assert sink.raw_bodies() == [payload, payload]
        assert any(b"sk-XYZ" in b for b in sink.raw_bodies())

        req = urllib.request.Request(
            f"{sink.url}/v1/logs", data=b"\x00", headers={"Content-Type": "application/x-protobuf"}
        )
        with pytest.raises(urllib.error.HTTPError):  # not a valid logs request
            urllib.request.urlopen(req, timeout=5)
        assert len(sink.raw_bodies()) == 3
        sink.clear()
        assert sink.spans() == [] and sink.raw_bodies() == []
        assert json.dumps(sink.spans()) == "[]"
