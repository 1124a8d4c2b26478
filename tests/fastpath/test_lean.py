"""Lean spans: used only behind our own pipeline, and indistinguishable from the SDK's in
what they export (same fields, same limits and status rules), whatever the advice does."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import SpanLimits, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased  # noqa: E402
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: E402

from gym_autoinstr.fastpath import batching, lean, wire  # noqa: E402


class Capture:
    """Stands in for the OTLP exporter behind the encoding processor: keeps the bytes."""

    def __init__(self):
        self.payloads = []

    def export(self, batch):
        self.payloads.append(batch.payload)

        class Ok:
            name = "SUCCESS"

        return Ok

    def shutdown(self):
        pass


def _pipeline(**provider_args):
    capture = Capture()
    processor = batching.EncodingSpanProcessor(
        capture, max_queue_size=100, schedule_delay_millis=60_000, max_export_batch_size=100
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "lean"}), **provider_args)
    provider.add_span_processor(processor)
    return provider, processor


def _script(tracer):
    """What our advice does with spans, and a bit more."""
    parent_ctx = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    with tracer.start_as_current_span(
        "POST",
        context=trace.set_span_in_context(trace.NonRecordingSpan(parent_ctx)),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "n": 1},
    ) as server:
        server.update_name("POST /run")
        server.set_attribute("http.route", "/run")
        server.set_attributes({"list": ["a", "b"], "f": 0.5, "b": True})
        server.set_attribute("", "dropped: empty key")
        server.set_attribute("none", None)
        client = tracer.start_span("HTTP POST", kind=SpanKind.CLIENT, links=[Link(parent_ctx, {"why": "job"})])
        client.set_status(Status(StatusCode.ERROR, "builtins.ValueError"))
        client.set_status(StatusCode.UNSET)
        client.add_event("retry", {"attempt": 2})
        client.end()
        client.set_attribute("late", 1)  # after end: ignored
        ok = tracer.start_span("ok")
        ok.set_status(StatusCode.OK)
        ok.set_status(StatusCode.ERROR)  # OK is final
        ok.end()


def _decoded(payloads):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for payload in payloads:
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans


def _comparable(span: PbSpan):
    copy = PbSpan()
    copy.CopyFrom(span)
    for field in ("trace_id", "span_id", "parent_span_id", "start_time_unix_nano", "end_time_unix_nano"):
        copy.ClearField(field)
    for event in copy.events:
        event.time_unix_nano = 0
    return copy


def test_lean_spans_export_what_sdk_spans_export(monkeypatch):
    provider, processor = _pipeline()
    tracer = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr", "1"))
    assert isinstance(tracer, lean.LeanTracer)
    _script(tracer)
    processor.force_flush()
    ours = _decoded(processor._exporter.payloads)

    exporter = InMemorySpanExporter()
    sdk_provider = TracerProvider(resource=Resource.create({"service.name": "lean"}))
    sdk_provider.add_span_processor(SimpleSpanProcessor(exporter))
    _script(sdk_provider.get_tracer("gym_autoinstr", "1"))
    theirs = [PbSpan.FromString(wire.span(s)) for s in exporter.get_finished_spans()]

    assert [s.name for s in ours] == ["HTTP POST", "ok", "POST /run"]
    assert [_comparable(s) for s in ours] == [_comparable(s) for s in theirs]
    by_name = {s.name: s for s in ours}
    assert by_name["HTTP POST"].parent_span_id == by_name["POST /run"].span_id
    assert by_name["POST /run"].parent_span_id == (0xDEF).to_bytes(8, "big")
    assert by_name["POST /run"].trace_id == (0xABC).to_bytes(16, "big")


def test_attribute_limit_drops_the_oldest_like_the_sdk():
    provider, processor = _pipeline(span_limits=SpanLimits(max_span_attributes=3))
    tracer = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr"))
    assert tracer is not None
    span = tracer.start_span("s", attributes={"a": 1, "b": 2, "c": 3, "d": 4})
    span.set_attribute("e", 5)
    assert dict(span.attributes) == {"c": 3, "d": 4, "e": 5} and span.dropped_attributes == 2
    sdk_provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=3))
    sdk_span = sdk_provider.get_tracer("t").start_span("s", attributes={"a": 1, "b": 2, "c": 3, "d": 4})
    sdk_span.set_attribute("e", 5)
    assert dict(sdk_span.attributes) == dict(span.attributes) and sdk_span.dropped_attributes == 2


def test_unsampled_spans_are_not_recording():
    provider, processor = _pipeline(sampler=ALWAYS_OFF)
    tracer = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr"))
    span = tracer.start_span("s")
    assert not span.is_recording() and not span.get_span_context().trace_flags.sampled
    span.end()
    processor.force_flush()
    assert processor._exporter.payloads == []


def test_lean_only_behind_our_pipeline_alone(monkeypatch):
    provider, _ = _pipeline()
    assert lean.lean_tracer_for(provider, provider.get_tracer("t")) is not None
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))  # someone else listens too
    assert lean.lean_tracer_for(provider, provider.get_tracer("t")) is None
    plain = TracerProvider()
    plain.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert lean.lean_tracer_for(plain, plain.get_tracer("t")) is None
    limited, _ = _pipeline(span_limits=SpanLimits(max_span_attribute_length=10))
    assert lean.lean_tracer_for(limited, limited.get_tracer("t")) is None
    provider, _ = _pipeline()
    monkeypatch.setenv("GYM_AUTOINSTR_LEAN_SPANS", "0")
    assert lean.lean_tracer_for(provider, provider.get_tracer("t")) is None


class _Ids:
    """A deterministic id generator: the same ids for the lean and the SDK tracer."""

    def __init__(self):
        import random

        self._random = random.Random(7)

    def generate_trace_id(self):
        return self._random.getrandbits(128) or 1

    def generate_span_id(self):
        return self._random.getrandbits(64) or 1

    def is_trace_id_random(self):
        return True


@pytest.mark.parametrize("decided_first", [False, True], ids=["start_span", "decide_root first"])
@pytest.mark.parametrize(
    "sampler",
    ["ratio", "job-keeping ratio", "always off", "job-keeping always off", "always on", "ratio, not parent-based"],
)
def test_roots_are_decided_as_the_sdks_sampler_decides_them(sampler, decided_first):
    """Also when the ingress decides a root before starting it (``decide_root``, then
    ``start_span(root_id=)`` for one it keeps): each root is decided once, so a ratio keeps
    r of them, not r x r."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from gym_autoinstr.fastpath import samplers

    def make():
        base = {
            "ratio": ParentBased(TraceIdRatioBased(0.3)),
            "always off": ParentBased(ALWAYS_OFF),
            "always on": ParentBased(ALWAYS_ON),
            "ratio, not parent-based": TraceIdRatioBased(0.3),
        }
        name = sampler.removeprefix("job-keeping ")
        return samplers.JobKeepingSampler(base[name]) if sampler.startswith("job-keeping") else base[name]

    provider, _ = _pipeline(sampler=make(), id_generator=_Ids())
    ours = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr"))
    assert ours is not None
    theirs = TracerProvider(sampler=make(), id_generator=_Ids()).get_tracer("gym_autoinstr")
    decided = ours.sampler is not None and samplers.root_decision(ours.sampler) is not None
    assert decided == (sampler not in ("always on", "ratio, not parent-based"))
    asked = []
    ask = ours.sampler.should_sample
    ours.sampler.should_sample = lambda *args, **kwargs: asked.append(args[2]) or ask(*args, **kwargs)
    outcomes = []
    for i in range(400):
        name = "gym.job" if i % 7 == 0 else "POST"
        if decided_first:
            trace_id, a = ours.decide_root(name)
            if a is None:
                a = ours.start_span(name, kind=SpanKind.SERVER, root_id=trace_id)
        else:
            a = ours.start_span(name, kind=SpanKind.SERVER)
        b = theirs.start_span(name, kind=SpanKind.SERVER)
        assert a.is_recording() == b.is_recording()
        assert a.get_span_context() == b.get_span_context()  # ids, flags, trace state
        outcomes.append((name, a.is_recording()))
        a.end(), b.end()
    kept = [name for name, recording in outcomes if recording]
    if "ratio" in sampler:
        assert 0 < kept.count("POST") < 343  # some of each
    jobs = [recording for name, recording in outcomes if name == "gym.job"]
    assert all(jobs) == (sampler.startswith("job-keeping") or sampler == "always on")
    # where the decision rests on the trace id alone, the sampler is asked only about the
    # roots it keeps; otherwise about every root
    assert len(asked) == (len(kept) if decided else 400)


class _DropsNamed(ParentBased):
    """A parent-based sampler with its own ``should_sample``: must be asked every time."""

    def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult

        if name == "drop me":
            return SamplingResult(Decision.DROP)
        return super().should_sample(parent_context, trace_id, name, *args, **kwargs)


@pytest.mark.parametrize(
    "sampler",
    [
        "always on",
        "ratio",
        "job-keeping ratio",
        "remote sampled parents dropped",
        "own should_sample",
        "always on, not parent-based",
    ],
)
def test_children_of_sampled_parents_are_started_as_the_sdks_sampler_starts_them(sampler):
    """The lean tracer answers for a sampler that keeps every child of a sampled parent
    (the stock ``ParentBased`` with the SDK's defaults for such parents) without asking
    it; what it starts is what the SDK's tracer starts: ids, flags (the random-trace-id
    flag kept), trace state, attributes.  Any other sampler is asked about every span."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, StaticSampler, TraceIdRatioBased
    from opentelemetry.trace import TraceState

    from gym_autoinstr.fastpath import samplers

    def make():
        base = {
            "always on": lambda: ParentBased(ALWAYS_ON),
            "ratio": lambda: ParentBased(TraceIdRatioBased(0.3)),
            "remote sampled parents dropped": lambda: ParentBased(ALWAYS_ON, remote_parent_sampled=ALWAYS_OFF),
            "own should_sample": lambda: _DropsNamed(ALWAYS_ON),
            "always on, not parent-based": lambda: StaticSampler(Decision.RECORD_AND_SAMPLE),
        }
        name = sampler.removeprefix("job-keeping ")
        return samplers.JobKeepingSampler(base[name]()) if sampler.startswith("job-keeping") else base[name]()

    provider, _ = _pipeline(sampler=make(), id_generator=_Ids())
    ours = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr"))
    theirs = TracerProvider(sampler=make(), id_generator=_Ids()).get_tracer("gym_autoinstr")
    asked = []
    ask = ours.sampler.should_sample
    ours.sampler.should_sample = lambda *args, **kwargs: asked.append(args[2]) or ask(*args, **kwargs)
    state = TraceState([("vendor", "x1")])
    parents = [
        SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=state),
        SpanContext(0xABD, 0xDF0, is_remote=False, trace_flags=TraceFlags(3)),
        SpanContext(0xABE, 0xDF1, is_remote=True, trace_flags=TraceFlags(3), trace_state=state),
    ]
    names = ["gym.verify", "drop me", "gym.job"]
    started = 0
    for parent in parents:
        for name in names:
            for current in (False, True):  # the parent passed as context=, or the current one
                context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
                token = otel_context.attach(context) if current else None
                try:
                    attributes = {"gym.server.name": "s", "n": 1}
                    a = ours.start_span(
                        name, None if current else context, kind=SpanKind.INTERNAL, attributes=attributes
                    )
                    b = theirs.start_span(
                        name, None if current else context, kind=SpanKind.INTERNAL, attributes=dict(attributes)
                    )
                finally:
                    if token is not None:
                        otel_context.detach(token)
                started += 1
                assert a.get_span_context() == b.get_span_context()  # ids, flags, trace state
                assert a.get_span_context().trace_state == b.get_span_context().trace_state
                assert a.is_recording() == b.is_recording()
                if b.is_recording():
                    assert dict(a.attributes) == dict(b.attributes) == {"gym.server.name": "s", "n": 1}
                    assert a.parent == b.parent == parent
                a.end(), b.end()
    keeps = sampler in ("always on", "ratio", "job-keeping ratio")
    assert samplers.keeps_under_sampled_parent(ours.sampler) == keeps
    assert len(asked) == (0 if keeps else started)
