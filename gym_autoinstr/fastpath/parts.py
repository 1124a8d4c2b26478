"""The fast parts, each checked when the pipeline is built, each able to fall back alone.

Every part that replaces SDK machinery (``contract.FAST_PARTS``) is used only when, on
the installed OpenTelemetry, the private names it reads resolve (its rows in
``contract.py``) and a small behavioural probe gives what the SDK gives: the wire
encoder's bytes for a probe span are the SDK encoder's, a lean span exports what an SDK
span exports, a fast histogram's point is the SDK histogram's, and so on.  A part whose
check fails is off for the process (``contract.part_on`` says so to the code that would
use it, which then uses the stock SDK), and says so once, naming the part, the reason and
the installed versions.  ``GYM_AUTOINSTR_FAST_PATH=off`` turns every part off without
probing anything.

``check()`` runs once per process, from the configurator, before it builds the tracer
and meter providers (the probes cost about a millisecond together); ``gym-autoinstr
doctor`` shows the result (``report()``).

The context part (``context_ops.py``'s direct ContextVar access) binds its functions when
``context_ops`` is imported, which is before any pipeline is built: its rows and its
layout check run then (``context_ops._span_layout``), and here its result is reported.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import contract
from gym_autoinstr.fastpath.contract import (
    CONTEXT,
    ENCODE_ON_END,
    FAST_PARTS,
    HISTOGRAMS,
    LEAN,
    SAMPLERS,
    W3C,
    WIRE,
    PartStatus,
)

DESCRIPTIONS = {
    CONTEXT: "current context and spans set in a context straight on the API's ContextVar",
    W3C: "traceparent/tracestate written and read without the propagator machinery",
    LEAN: "lean spans for our own tracer behind our own pipeline",
    WIRE: "spans written as OTLP protobuf bytes by our encoder",
    ENCODE_ON_END: "spans encoded when they end; bytes handed to the SDK's OTLP exporter",
    HISTOGRAMS: "request histograms aggregated by us, merged into the SDK's export",
    SAMPLERS: "stock samplers' decisions read off their objects instead of asked",
}
# a part used only behind another: off with it
NEEDS = {ENCODE_ON_END: (WIRE,), LEAN: (WIRE, ENCODE_ON_END)}

_lock = threading.Lock()


# -- the probe span ----------------------------------------------------------------------

_TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
_SPAN_ID = 0x00F067AA0BA902B7


class _FixedIds:
    """An id generator handing out the same ids: a lean span and an SDK span made with it
    must come out the same."""

    def generate_trace_id(self) -> int:
        return _TRACE_ID

    def generate_span_id(self) -> int:
        return _SPAN_ID

    def is_trace_id_random(self) -> bool:
        return True


def _kept() -> Any:
    """A span processor keeping what ends."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Kept(SpanProcessor):
        def __init__(self) -> None:
            self.spans: list = []

        def on_end(self, span: Any) -> None:
            self.spans.append(span)

    return Kept()


def _provider() -> tuple[Any, Any]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    from gym_autoinstr.fastpath.samplers import JobKeepingSampler

    kept = _kept()
    provider = TracerProvider(
        resource=Resource({"service.name": "gym-autoinstr-probe"}),
        sampler=JobKeepingSampler(ParentBased(ALWAYS_ON)),
        id_generator=_FixedIds(),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(kept)
    return provider, kept


def _probe_span(tracer: Any) -> Any:
    from opentelemetry import context as otel_context
    from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

    linked = SpanContext(0x1F, 0x2F, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    span = tracer.start_span(
        "gym.probe",
        context=otel_context.Context(),
        kind=SpanKind.CLIENT,
        attributes={"s": "x", "i": 7, "f": 0.5, "b": True, "l": [1, 2], "t": ("a", "b")},
        links=[Link(linked, {"link": 1})],
        start_time=1_000,
    )
    span.set_attribute("later", "y")
    span.add_event("e", {"n": 1}, timestamp=1_500)
    span.set_status(StatusCode.ERROR, "probe")
    span.end(end_time=2_000)
    return span


def _sdk_span() -> Any:
    provider, kept = _provider()
    _probe_span(provider.get_tracer("gym_autoinstr.probe", "1"))
    return kept.spans[0]


def _wire_request(span: Any) -> bytes:
    from gym_autoinstr.fastpath import wire

    scope = span.instrumentation_scope
    return wire.export_request(
        wire.resource(span.resource),
        span.resource.schema_url,
        [wire.scope_spans(wire.scope(scope), scope.schema_url, [wire.span(span)])],
    )


def _sdk_request(span: Any) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    except ImportError:
        return None
    return encode_spans([span])


# -- the probes: None when the part gives the SDK's result, else why not ---------------------


def _probe_context() -> str | None:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    from gym_autoinstr.fastpath import context_ops

    if context_ops._RUNTIME_VAR is None or not context_ops._span_layout():
        return "the API's context is not laid out as the fast functions assume (checked at import)"
    span = trace.NonRecordingSpan(trace.SpanContext(0x1F, 0x2F, is_remote=False))
    base = otel_context.Context({"k": 1})
    if context_ops.with_span(span, base) != trace.set_span_in_context(span, base):
        return "a span set in a context differs from the API's"
    previous = context_ops.enter(span)
    try:
        if trace.get_current_span() is not span:
            return "the span entered is not the API's current span"
    finally:
        context_ops.leave(previous)
    return None


def _probe_w3c() -> str | None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from gym_autoinstr.fastpath import w3c

    context = SpanContext(
        _TRACE_ID, _SPAN_ID, is_remote=False, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")])
    )
    carrier: dict = {}
    sdk = TraceContextTextMapPropagator()
    sdk.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(context)))
    if w3c.traceparent(context) != carrier.get("traceparent"):
        return f"traceparent {w3c.traceparent(context)!r} != the SDK's {carrier.get('traceparent')!r}"
    if w3c.w3c_default():
        read = trace.get_current_span(w3c.extract(dict(carrier))).get_span_context()
        expected = trace.get_current_span(sdk.extract(dict(carrier))).get_span_context()
        if (read.trace_id, read.span_id, read.trace_flags, read.is_remote, read.trace_state.to_header()) != (
            expected.trace_id,
            expected.span_id,
            expected.trace_flags,
            expected.is_remote,
            expected.trace_state.to_header(),
        ):
            return "a traceparent read back differs from the SDK's extract"
    return None


def _probe_wire() -> str | None:
    span = _sdk_span()
    expected = _sdk_request(span)
    if expected is None:
        return "the SDK's OTLP encoder (opentelemetry-exporter-otlp-proto-common) is not installed to compare with"
    if _wire_request(span) != expected.SerializeToString():
        return "the bytes written for a probe span differ from the SDK encoder's"
    return None


def _probe_encode_on_end() -> str | None:
    import importlib

    from gym_autoinstr.fastpath import batching

    try:
        http = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError:
        http = None
    if http is not None and not (
        callable(getattr(http, "encode_spans", None)) and batching._calls_encode_spans(http.OTLPSpanExporter.export)
    ):
        return "the OTLP/HTTP span exporter no longer encodes through its module's encode_spans"
    span = _sdk_span()
    expected = _sdk_request(span)
    if expected is None:
        return "the SDK's OTLP encoder (opentelemetry-exporter-otlp-proto-common) is not installed"
    batch = batching.EncodedBatch(_wire_request(span), 1)
    if type(expected).FromString(batch.SerializeToString()) != expected or len(batch) != 1:
        return "an encoded batch does not read back as the SDK's export request"
    return None


def _probe_lean() -> str | None:
    from gym_autoinstr.fastpath import lean, wire

    provider, kept = _provider()
    sdk_tracer = provider.get_tracer("gym_autoinstr.probe", "1")
    if lean.processors_of(provider) != (kept,):
        return "the provider's span processors cannot be read"
    expected = wire.span(_probe_span(sdk_tracer))
    made = _probe_span(lean.LeanTracer(sdk_tracer, (kept,)))
    if type(made) is not lean.LeanSpan or kept.spans[-1] is not made:
        return "the lean tracer did not make and end a lean span"
    if wire.span(made) != expected or made.resource is not kept.spans[0].resource:
        return "a lean span exports other content than the SDK's span"
    return None


def _probe_histograms() -> str | None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from gym_autoinstr.fastpath import histograms

    bounds, values, attributes = (0.0, 5.0, 10.0), (1.0, 7.0, 20.0, 7.0, 0.0), {"a": "b"}
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource({}), shutdown_on_exit=False)
    try:
        sdk = provider.get_meter("gym_autoinstr.probe").create_histogram(
            "probe", unit="ms", description="d", explicit_bucket_boundaries_advisory=list(bounds)
        )
        fast = histograms.FastHistogram("probe", "ms", "d", bounds)
        for value in values:
            sdk.record(value, attributes)
            fast.record(value, attributes)
        data = reader.get_metrics_data()
        expected = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    finally:
        provider.shutdown()

    def fields(point: Any) -> tuple:
        return (
            dict(point.attributes),
            point.count,
            point.sum,
            point.min,
            point.max,
            list(point.bucket_counts),
            list(point.explicit_bounds),
        )

    got, want = fields(fast.metric(0).data.data_points[0]), fields(expected)
    if got != want:
        return f"a fast histogram's point {got} differs from the SDK's {want}"
    return None


def _probe_samplers() -> str | None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from gym_autoinstr.fastpath import samplers

    ratio = ParentBased(TraceIdRatioBased(0.5))
    decision = samplers.root_decision(ratio)
    if settings.DROPPED_FAST_PATH.read() and decision is None:
        return "a parentbased_traceidratio sampler's root decision cannot be read"
    if decision is not None:
        for trace_id in (1, _TRACE_ID, (1 << 128) - 1, 1 << 63, (1 << 63) - 1):
            dropped = trace_id & decision.mask >= decision.bound
            if dropped == ratio.should_sample(None, trace_id, "x").decision.is_sampled():
                return "a root decision read off the sampler differs from its answer"
    always = ParentBased(ALWAYS_ON)
    if not samplers.keeps_under_sampled_parent(always):
        return "ParentBased's delegates for sampled parents cannot be read"
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(trace.SpanContext(_TRACE_ID, _SPAN_ID, is_remote=True, trace_flags=trace.TraceFlags(1)))
    )
    if not always.should_sample(parent, _TRACE_ID, "x").decision.is_sampled():
        return "ParentBased does not keep a child of a sampled parent"
    return None


PROBES: dict[str, Callable[[], str | None]] = {
    CONTEXT: _probe_context,
    W3C: _probe_w3c,
    WIRE: _probe_wire,
    ENCODE_ON_END: _probe_encode_on_end,
    LEAN: _probe_lean,
    HISTOGRAMS: _probe_histograms,
    SAMPLERS: _probe_samplers,
}


# -- the check ----------------------------------------------------------------------------


def versions() -> str:
    from importlib import metadata

    found = []
    for package in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def _verdict(part: str) -> str | None:
    """None when ``part`` may be used, else why not."""
    missing = contract.missing(part)
    if missing:
        return f"private OpenTelemetry name(s) missing: {', '.join(missing)}"
    try:
        return PROBES[part]()
    except Exception as error:
        return f"its probe failed: {error!r}"


# A part is probed once what it works with is loaded in this process (until then it is in
# no use, and its probe would only import what this process does not need).
_LOADED_BY = {
    WIRE: "opentelemetry.exporter.otlp.proto.common.trace_encoder",  # (an OTLP span exporter imports it)
    ENCODE_ON_END: "opentelemetry.exporter.otlp.proto.common.trace_encoder",
    LEAN: "opentelemetry.exporter.otlp.proto.common.trace_encoder",
    HISTOGRAMS: "opentelemetry.sdk.metrics",
}


def check(*, warn: bool = True, everything: bool = False) -> dict[str, PartStatus]:
    """Decide the fast parts not decided yet whose machinery is loaded (``everything``:
    every part); each is decided once per process (``reset()`` to decide again), and one
    that fails says so once (``warn``).  Returns the parts decided so far."""
    with _lock:
        status = contract.STATUS
        if not contract.switch_on():
            reason = f"{settings.FAST_PATH.name} is off"
            status.update({part: PartStatus(False, reason) for part in FAST_PARTS if part not in status})
        for part in FAST_PARTS:
            if part in status:
                continue
            needs = NEEDS.get(part, ())
            if any(n not in status for n in needs):
                continue
            needed = [n for n in needs if not status[n].on]
            if needed:
                verb = "is" if len(needed) == 1 else "are"
                status[part] = PartStatus(False, f"needs {', '.join(needed)}, which {verb} off")
                continue
            if not everything and _LOADED_BY.get(part, "") not in sys.modules and part in _LOADED_BY:
                continue
            reason = _verdict(part)
            status[part] = PartStatus(reason is None, reason or "")
            if reason is not None and warn:
                warn_once(
                    f"fast-path:{part}",
                    "fast path part %s is off, the stock OpenTelemetry SDK does its work: %s (%s)",
                    part,
                    reason,
                    versions(),
                )
        _forget_decisions()
        return dict(status)


def _forget_decisions() -> None:
    """What the parts worked out before their status was known is worked out again."""
    from gym_autoinstr.fastpath import w3c

    w3c._known.textmap = None


def reset() -> None:
    """Tests: decide every part again at the next ``check()``."""
    with _lock:
        contract.STATUS.clear()
        _forget_decisions()


def report() -> dict[str, Any]:
    """The fast path as ``gym-autoinstr doctor`` shows it (checked here when the pipeline
    was not built in this process)."""
    status = check(warn=False, everything=True)
    return {
        "variable": settings.FAST_PATH.name,
        "switch": contract.switch_on(),
        "parts": [
            {
                "name": part,
                "on": status[part].on,
                "reason": status[part].reason,
                "what": DESCRIPTIONS[part],
                "rows": [row.name for row in contract.ROWS if row.part == part],
            }
            for part in FAST_PARTS
        ],
    }
