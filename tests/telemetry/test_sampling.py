"""The sampler wrapper: a root ``gym.job`` is always kept, everything else is sampled as
``OTEL_TRACES_SAMPLER`` says (read by the real configurator from the environment)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link

from gym_autoinstr.fastpath import samplers
from gym_autoinstr.telemetry import sampling


def _provider(monkeypatch, sampler: str, arg: str):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampling.configured_sampler())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t"), exporter, provider


def test_job_roots_are_kept_at_ratio_zero_and_nothing_else_is(monkeypatch):
    tracer, exporter, provider = _provider(monkeypatch, "parentbased_traceidratio", "0")
    assert "TraceIdRatioBased{0.0}" in provider.sampler.get_description()
    with tracer.start_as_current_span("gym.job") as job:
        with tracer.start_as_current_span("HTTP POST"):  # a child of the kept job: parent-based, kept
            pass
    for _ in range(20):  # rollout roots linked to the job: the ratio decides, 0 keeps none
        with tracer.start_as_current_span(
            "HTTP POST", context=trace.set_span_in_context(trace.INVALID_SPAN), links=[Link(job.get_span_context())]
        ):
            pass
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["HTTP POST", "gym.job"]


def test_a_job_under_an_unsampled_parent_follows_the_parent(monkeypatch):
    tracer, exporter, _ = _provider(monkeypatch, "parentbased_traceidratio", "0")
    with tracer.start_as_current_span("train.step"):  # not sampled at ratio 0
        with tracer.start_as_current_span("gym.job"):
            pass
    assert exporter.get_finished_spans() == ()


def test_ratio_one_half_keeps_about_half_of_the_roots(monkeypatch):
    tracer, exporter, _ = _provider(monkeypatch, "parentbased_traceidratio", "0.5")
    for _ in range(400):
        with tracer.start_as_current_span("HTTP POST"):
            pass
    kept = len(exporter.get_finished_spans())
    assert 120 <= kept <= 280, kept  # Binomial(400, 0.5): outside is ~1e-16


@pytest.mark.parametrize("unit", ["rollout", "task"])
def test_sampling_by_task_keeps_or_drops_every_repeat_of_a_task_together(monkeypatch, unit):
    """``GYM_AUTOINSTR_SAMPLING_UNIT=task``: a collection job's rollout roots (job id and
    task index at their start) are decided on (job, task); by rollout, each on its own id.
    Both keep about half at 0.5; only by task is every task's group whole or absent.  Other
    roots, and the lean tracer's shortcut for roots decided on their id alone, by rollout
    only."""
    monkeypatch.setenv("GYM_AUTOINSTR_SAMPLING_UNIT", unit)
    tracer, exporter, provider = _provider(monkeypatch, "parentbased_traceidratio", "0.5")
    assert (samplers.root_decision(provider.sampler) is None) is (unit == "task")
    tasks, repeats = 200, 4
    for job in ("job-a", "job-b"):
        for task in range(tasks):
            for repeat in range(repeats):
                attributes = {"nemo.gym.job.id": job, "nemo.gym.task.index": task, "nemo.gym.rollout.index": repeat}
                with tracer.start_as_current_span("POST /run", attributes=attributes):
                    pass
    kept: dict = {}
    for span in exporter.get_finished_spans():
        key = (span.attributes["nemo.gym.job.id"], span.attributes["nemo.gym.task.index"])
        kept[key] = kept.get(key, 0) + 1
    groups_kept = len(kept)
    spans_kept = sum(kept.values())
    assert 0.35 * 2 * tasks * repeats <= spans_kept <= 0.65 * 2 * tasks * repeats
    if unit == "task":
        assert set(kept.values()) == {repeats}  # whole groups only
        assert 0.35 * 2 * tasks <= groups_kept <= 0.65 * 2 * tasks
        same_task_both_jobs = sum((("job-a", t) in kept) == (("job-b", t) in kept) for t in range(tasks))
        assert same_task_both_jobs < 0.7 * tasks  # each job decides its tasks afresh
    else:
        assert len(set(kept.values())) > 1  # groups split


def _under(span_context, call):
    from opentelemetry.trace import NonRecordingSpan

    with trace.use_span(NonRecordingSpan(span_context)):
        return call()


def _dropped_parent(context=None):
    """The span context of the span ``sampling.dropped_span`` finds dropped, or None."""
    span = sampling.dropped_span(context)
    return None if span is None else span.get_span_context()


def test_dropped_parent_only_for_an_unsampled_parent_under_a_parent_based_sampler(monkeypatch):
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
    from opentelemetry.trace import SpanContext, TraceFlags

    unsampled = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(0))
    sampled = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(1))
    invalid = SpanContext(0, 0, is_remote=False)

    class FakeTracer:
        sampler = None

    class KeepsErrors(ParentBased):  # a user's own rule on top of the parent's decision
        def should_sample(self, *args, **kwargs):
            return super().should_sample(*args, **kwargs)

    class Renamed(ParentBased):  # a subclass that only names itself: ParentBased decides
        def get_description(self):
            return "renamed"

    fake = FakeTracer()
    # the tracer the dropped path reads its sampler from: the one tracer() last handed out
    monkeypatch.setattr(sampling._spans, "_tracer", fake)
    for sampler, follows in [
        (KeepsErrors(ALWAYS_ON), False),  # its should_sample must be asked for every span
        (Renamed(ALWAYS_ON), True),
        (samplers.JobKeepingSampler(ParentBased(TraceIdRatioBased(0.0))), True),
        (ParentBased(ALWAYS_ON), True),
        (ALWAYS_ON, False),  # not parent-based: a new decision at every hop
        (TraceIdRatioBased(0.5), False),
        (ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON), False),
        (ParentBased(ALWAYS_ON, local_parent_not_sampled=ALWAYS_ON), False),
        (None, False),  # a tracer without a sampler (not the SDK's)
    ]:
        fake.sampler = sampler
        expected = unsampled if follows else None
        assert _under(unsampled, _dropped_parent) == expected, sampler
        assert _dropped_parent(trace.set_span_in_context(trace.NonRecordingSpan(unsampled))) == expected
        assert _under(sampled, _dropped_parent) is None
        assert _under(invalid, _dropped_parent) is None
    fake.sampler = ParentBased(ALWAYS_ON)
    monkeypatch.setenv(samplers.FAST_PATH_ENV, "0")  # the switch, read when the sampler is checked
    assert _under(unsampled, _dropped_parent) is None


def test_a_context_found_dropped_is_answered_from_memory_while_the_sampler_is_the_same(monkeypatch):
    from opentelemetry import propagate
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class FakeTracer:
        sampler = ParentBased(ALWAYS_ON)

    fake = FakeTracer()
    monkeypatch.setattr(sampling._spans, "_tracer", fake)
    monkeypatch.setattr(sampling, "_DROPPED_CONTEXTS_MAX", 3)
    sampling._dropped_contexts.clear()
    spans = [NonRecordingSpan(SpanContext(7, 9 + i, is_remote=True, trace_flags=TraceFlags(0))) for i in range(5)]
    contexts = [trace.set_span_in_context(span) for span in spans]
    assert [sampling.dropped_span(c) for c in contexts] == spans
    assert len(sampling._dropped_contexts) <= 3  # bounded
    span, context = spans[-1], contexts[-1]
    headers = {"traceparent": f"00-{7:032x}-{9 + 4:016x}-00"}
    assert sampling.dropped_call(context) == (span, headers)
    # From here on the span check itself answers "not dropped": what still says dropped
    # was answered from memory.
    monkeypatch.setattr(sampling, "unsampled_spans", {})
    monkeypatch.setattr(sampling, "unsampled_entry", lambda span: None)
    assert sampling.dropped_span(context) is span
    assert sampling.dropped_call(context) == (span, headers)
    with trace.use_span(span):  # the same span under a context of its own: worked out anew
        assert sampling.dropped_span() is None
    fake.sampler = ALWAYS_ON  # another sampler: worked out anew
    assert sampling.dropped_span(context) is None and sampling.dropped_call(context) is None
    monkeypatch.undo()
    monkeypatch.setattr(sampling._spans, "_tracer", fake)
    fake.sampler = ParentBased(ALWAYS_ON)
    assert sampling.dropped_call(context) == (span, headers)
    # another global propagator: the headers are made anew (here: by its rules, none)
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", TraceContextTextMapPropagator())
    assert sampling.dropped_call(context) == (span, headers)  # W3C's alone: the same headers
    from opentelemetry.propagators.textmap import TextMapPropagator

    class Other(TextMapPropagator):
        fields = {"x-other"}

        def extract(self, carrier, context=None, getter=None):
            return context

        def inject(self, carrier, context=None, setter=None):
            pass

    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", Other())
    assert sampling.dropped_call(context) == (span, None)  # not W3C's: injected the usual way


@pytest.mark.parametrize(
    "name,arg,decided",
    [
        ("parentbased_traceidratio", "0", True),
        ("parentbased_traceidratio", "0.25", True),
        ("parentbased_always_off", "", True),
        ("parentbased_always_on", "", False),
        ("traceidratio", "0", False),  # not parent-based: asked about every span
    ],
)
def test_roots_of_the_samplers_the_environment_configures_are_decided_on_their_ids(monkeypatch, name, arg, decided):
    """``OTEL_TRACES_SAMPLER`` makes the SDK's own classes (``parentbased_traceidratio`` a
    ``ParentBasedTraceIdRatio``, a subclass of ``ParentBased``): the root shortcut must
    know them, and decide as the sampler itself does."""
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.trace import SpanKind

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    sampler = sampling.configured_sampler()
    roots = samplers.root_decision(sampler)
    assert (roots is not None) == decided
    if roots is None:
        return
    mask, bound, kept = roots
    assert kept == "gym.job"
    import random

    rng = random.Random(3)
    for _ in range(400):
        trace_id = rng.getrandbits(128) or 1
        theirs = sampler.should_sample(None, trace_id, "POST", SpanKind.SERVER).decision
        assert (trace_id & mask < bound) == (theirs is Decision.RECORD_AND_SAMPLE)


@pytest.mark.parametrize("flags", ["00", "01", "02", "03"])
@pytest.mark.parametrize("tracestate", [None, "v=1"])
def test_a_requests_caller_is_dropped_exactly_when_the_dropped_parent_check_says_so(monkeypatch, flags, tracestate):
    """The ingress answers a sampled caller without the dropped-parent check; for every
    caller it answers what the check answers."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from gym_autoinstr.advice import ingress
    from gym_autoinstr.fastpath import w3c

    class FakeTracer:
        sampler = ParentBased(TraceIdRatioBased(0.0))

    monkeypatch.setattr(sampling._spans, "_tracer", FakeTracer())
    carrier = {"traceparent": f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"}
    if tracestate:
        carrier["tracestate"] = tracestate
    context, dropped = ingress._caller_from(carrier)
    sampled = bool(int(flags, 16) & 1)
    assert w3c.sampled_caller(context) is sampled
    assert dropped is (sampling.dropped_span(context) is not None) is (not sampled)
    read = trace.get_current_span(context).get_span_context()  # dropped: a span id of its own (W3C's parent-id)
    assert (read.span_id == 0xB7AD6B7169203331) is sampled and read.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
