"""The encoding span processor in front of the SDK's real OTLP exporters and a real
collector: every span arrives whole, grouped under its resource and scope, over HTTP and
gRPC; a full queue drops and counts; anything else gets the SDK's processor."""

from __future__ import annotations

import pytest

pytest.importorskip("rotel")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402

from gym_autoinstr.fastpath import batching  # noqa: E402
from gym_autoinstr.setup.flush import WatchedExporter  # noqa: E402

SETTINGS = {"max_queue_size": 1000, "schedule_delay_millis": 50, "max_export_batch_size": 64}


def _exporter(protocol: str, collector):
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_spans_reach_a_real_collector_whole(protocol, collector):
    processor = batching.make_processor(_exporter(protocol, collector), WatchedExporter, **SETTINGS)
    assert isinstance(processor, batching.EncodingSpanProcessor)
    provider = TracerProvider(resource=Resource.create({"service.name": f"wire-{protocol}"}))
    provider.add_span_processor(processor)
    ours = provider.get_tracer("gym_autoinstr", "9.9")
    theirs = provider.get_tracer("someone.else")
    expected = {}
    for n in range(150):  # more than two batches
        with ours.start_as_current_span(
            f"parent {n}", kind=SpanKind.SERVER, attributes={"n": n, "http.route": "/run"}
        ) as parent:
            with theirs.start_as_current_span("child", attributes={"ok": n % 2 == 0}) as child:
                if n == 7:
                    child.set_status(Status(StatusCode.ERROR, "builtins.KeyError"))
        expected[f"{parent.get_span_context().span_id:016x}"] = (n, f"{child.get_span_context().span_id:016x}")
    assert provider.force_flush()
    assert collector.sink.wait_for(lambda spans: len(spans) >= 300, timeout=20)
    got = collector.sink.spans()
    assert len(got) == 300
    by_id = {s["span_id"]: s for s in got}
    for parent_id, (n, child_id) in expected.items():
        parent, child = by_id[parent_id], by_id[child_id]
        assert (parent["name"], parent["kind"], parent["scope"]) == (f"parent {n}", "SERVER", "gym_autoinstr")
        assert parent["attributes"] == {"n": n, "http.route": "/run"}
        assert parent["parent_span_id"] is None
        assert (child["parent_span_id"], child["trace_id"]) == (parent_id, parent["trace_id"])
        assert child["scope"] == "someone.else" and child["attributes"] == {"ok": n % 2 == 0}
        assert child["status"] == ("ERROR" if n == 7 else "UNSET")
        assert parent["resource"]["service.name"] == f"wire-{protocol}"
        assert 0 < parent["start_ns"] <= child["start_ns"] <= child["end_ns"] <= parent["end_ns"]
    assert processor.dropped_spans == 0
    provider.shutdown()


def test_a_full_queue_drops_new_spans_and_counts_them(collector):
    settings = dict(SETTINGS, max_queue_size=10, schedule_delay_millis=60_000)
    processor = batching.make_processor(_exporter("http", collector), WatchedExporter, **settings)
    provider = TracerProvider(resource=Resource.create({"service.name": "full"}))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with processor._export_lock:  # the exporter is busy: nothing drains meanwhile
        for n in range(25):
            tracer.start_span(f"s{n}").end()
    assert processor.dropped_spans == 15
    assert provider.force_flush()
    assert collector.sink.wait_for(lambda spans: len(spans) >= 10, timeout=20)
    got = collector.sink.spans()
    assert sorted(s["name"] for s in got) == sorted(f"s{n}" for n in range(10))
    provider.shutdown()


def test_a_waiting_span_is_bytes_the_garbage_collector_does_not_track(collector):
    """Spans of the first (scope, resource) pair wait as their bytes alone; a span of any
    other pair waits with its own, and the export still files each under its own."""
    import gc

    settings = dict(SETTINGS, schedule_delay_millis=60_000)
    processor = batching.make_processor(_exporter("http", collector), WatchedExporter, **settings)
    provider = TracerProvider(resource=Resource.create({"service.name": "usual"}))
    provider.add_span_processor(processor)
    ours, theirs = provider.get_tracer("gym_autoinstr", "9.9"), provider.get_tracer("someone.else")
    with processor._export_lock:  # nothing drains meanwhile
        for n in range(3):
            ours.start_span(f"ours {n}").end()
            theirs.start_span(f"theirs {n}").end()
        queued = list(processor._queue)
    assert [type(item) for item in queued] == [bytes, tuple] * 3
    assert not any(gc.is_tracked(item) for item in queued[::2])
    assert all(item[0].name == "someone.else" for item in queued[1::2])
    assert provider.force_flush()
    assert collector.sink.wait_for(lambda spans: len(spans) >= 6, timeout=20)
    got = {s["name"]: (s["scope"], s["resource"]["service.name"]) for s in collector.sink.spans()}
    assert got == {
        **{f"ours {n}": ("gym_autoinstr", "usual") for n in range(3)},
        **{f"theirs {n}": ("someone.else", "usual") for n in range(3)},
    }
    provider.shutdown()


def test_unsampled_spans_are_not_queued(collector):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    processor = batching.make_processor(_exporter("http", collector), WatchedExporter, **SETTINGS)
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span("dropped").end()
    assert len(processor._queue) == 0
    provider.shutdown()


def test_other_exporters_get_the_sdk_processor(monkeypatch, collector):
    assert isinstance(batching.make_processor(ConsoleSpanExporter(), WatchedExporter, **SETTINGS), BatchSpanProcessor)
    monkeypatch.setenv("GYM_AUTOINSTR_ENCODE_ON_END", "0")
    processor = batching.make_processor(_exporter("http", collector), WatchedExporter, **SETTINGS)
    assert isinstance(processor, BatchSpanProcessor)
    processor.shutdown()


def test_the_exporter_still_encodes_span_lists_itself(collector):
    """The hook passes our bytes through and leaves every other caller of the exporter
    (a user's own BatchSpanProcessor in the same process) as it was."""
    exporter = _exporter("http", collector)
    assert batching.accepts_encoded(exporter)
    provider = TracerProvider(resource=Resource.create({"service.name": "plain"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    provider.get_tracer("t").start_span("plain span", attributes={"k": "v"}).end()
    assert provider.force_flush()
    assert collector.sink.wait_for(lambda spans: len(spans) >= 1, timeout=20)
    got = collector.sink.spans()
    assert [(s["name"], s["attributes"], s["resource"]["service.name"]) for s in got] == [
        ("plain span", {"k": "v"}, "plain")
    ]
    provider.shutdown()
