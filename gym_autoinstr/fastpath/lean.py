"""Lean spans for our own tracer, when the pipeline behind it is ours alone.

The SDK's span is built for any caller: a lock per span, an attribute map that validates
and copies every value, bounded lists for events and links, and a multi-processor
fan-out.  Our advice starts ~16 spans per rollout with attributes it built itself, on
Gym's request path, and in a real server that lifecycle was the largest single share of
our cost.  When the global provider is the SDK ``TracerProvider`` our configurator built
and its only span processors are ``batching.EncodingSpanProcessor`` (which reads a span
once, encodes it and lets it go), our tracer hands out ``LeanSpan`` instead: the same
API, sampler, id generator, resource, scope and limits, the same exported bytes, with
none of that machinery.

Anything else (another processor added to the provider, another provider, span limits
set through ``OTEL_*`` variables, the SDK's self-metrics, ``GYM_AUTOINSTR_LEAN_SPANS=0``)
gets the SDK's own tracer, unchanged.  Spans that other libraries start are always the
SDK's.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

from gym_autoinstr import settings
from gym_autoinstr._log import logger
from gym_autoinstr.fastpath import contract, wire
from gym_autoinstr.fastpath.context_ops import _SPAN_KEY, TRACE_FLAGS, current_context, span_context
from gym_autoinstr.fastpath.contract import CLEAN_ATTRIBUTE as _clean_key_value  # older APIs (None when absent)
from gym_autoinstr.fastpath.contract import CLEAN_ATTRIBUTE_VALUE as _clean_attribute_value  # None when absent

_CLEANS_BY_KEY = contract.ATTRIBUTES_CLEANED_BY_KEY
# An invalid key: counted as a dropped attribute by newer APIs, left out uncounted by older ones.
_INVALID_KEY_DROPS = 0 if _CLEANS_BY_KEY else 1

# The flags a span is started with, each the instance context_ops shares for its value
# (a TraceFlags is an int with an instance dict, an object the GC tracks, and every span
# holds one as long as it lives).
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", None)
_SAMPLED = TRACE_FLAGS[TraceFlags.SAMPLED]
_DEFAULT = TRACE_FLAGS[TraceFlags.DEFAULT]
_DEFAULT_RANDOM = TRACE_FLAGS[TraceFlags.DEFAULT | _RANDOM] if _RANDOM is not None else _DEFAULT
_SAMPLED_RANDOM = TRACE_FLAGS[TraceFlags.SAMPLED | _RANDOM] if _RANDOM is not None else _SAMPLED
_UNCHECKED = object()
_UNSET = Status(StatusCode.UNSET)
wire.known_unset(_UNSET)
_time_ns = time.time_ns


class LeanSpan(trace_api.Span):
    """A recording span of the API, readable by ``wire.span`` like an SDK ``ReadableSpan``."""

    __slots__ = (
        "name",
        "context",
        "parent",
        "kind",
        "start_time",
        "end_time",
        "attributes",
        "events",
        "links",
        "status",
        "dropped_attributes",
        "dropped_events",
        "_tracer",
        "gym_attempts",  # the attempts of a traced Gym request, when this is its CLIENT span (advice/pool.py)
    )

    dropped_links = 0

    def __init__(
        self,
        tracer: LeanTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict,
        links: tuple,
        start_time: int,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.links = links
        self.events: list | tuple = ()  # a list from the first event on
        self.status = _UNSET
        self.start_time = start_time
        self.end_time: int | None = None
        self.dropped_attributes = 0
        self.dropped_events = 0
        self._tracer = tracer
        self.gym_attempts: int | None = None

    # what the SDK's ReadableSpan also offers, for processors and exporters
    @property
    def resource(self) -> Any:
        return self._tracer.resource

    @property
    def instrumentation_scope(self) -> Any:
        return self._tracer.scope

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attributes(self, attributes: types.Attributes) -> None:
        for key, value in (attributes or {}).items():
            self.set_attribute(key, value)

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self.end_time is not None:
            logger.debug("setting attribute %r on an ended span", key)
            return
        if type(key) is not str or not key:
            logger.debug("invalid attribute key %r dropped", key)
            self.dropped_attributes += _INVALID_KEY_DROPS
            return
        if type(value) not in _PLAIN:
            value = _clean_value(key, value)
            if value is _DROP:
                return
        attributes = self.attributes
        if key in attributes:  # as the SDK's bounded map: a key set again moves to the end
            del attributes[key]
        elif len(attributes) >= self._tracer.max_attributes:  # the oldest makes room
            del attributes[next(iter(attributes))]
            self.dropped_attributes += 1
        attributes[key] = value

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.end_time is not None:
            return
        if len(self.events) >= self._tracer.max_events:
            self.dropped_events += 1
            return
        if type(self.events) is tuple:
            self.events = []
        self.events.append(self._tracer.event(name, attributes, timestamp or _time_ns()))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self.end_time is not None or context is None or not context.is_valid:
            return
        self.links = self.links + (trace_api.Link(context, attributes),)

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # The SDK's rules: OK is final, UNSET is never set.
        if self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self.status = status
        elif isinstance(status, StatusCode) and status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        # As the SDK records it (our advice never calls this: it records the type only).
        event = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(
                traceback.format_exception(type(exception), exception, exception.__traceback__)
            ),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            logger.debug("calling end() on an ended span")
            return
        self.end_time = end_time or _time_ns()
        for processor in self._tracer.processors:
            processor.on_end(self)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if exc_val is not None and self.end_time is None:
            self.record_exception(exc_val, escaped=True)
            self.set_status(Status(StatusCode.ERROR, f"{exc_type.__name__}: {exc_val}"))
        self.end()

    def __repr__(self) -> str:
        return f"LeanSpan(name={self.name!r}, context={self.context!r})"


class LeanTracer(trace_api.Tracer):
    """Starts ``LeanSpan``s with the SDK tracer's sampler, ids, resource, scope and limits."""

    def __init__(self, sdk_tracer: Any, processors: tuple) -> None:
        from opentelemetry.sdk.trace import Event

        self.sdk_tracer = sdk_tracer
        self.sampler = sdk_tracer.sampler
        self.id_generator = sdk_tracer.id_generator
        self.resource = sdk_tracer.resource
        self.scope = getattr(sdk_tracer, contract.TRACER_SCOPE)
        limits = getattr(sdk_tracer, contract.TRACER_SPAN_LIMITS)
        self.max_attributes = limits.max_span_attributes if limits.max_span_attributes is not None else 1 << 30
        self.max_events = limits.max_events if limits.max_events is not None else 1 << 30
        self.processors = processors
        self.event = Event
        random = getattr(self.id_generator, "is_trace_id_random", None)
        self._random_root = bool(_RANDOM is not None and random is not None and random())
        # how the sampler decides roots (samplers.root_decision), for the sampler it was worked out
        # for: its fields (a mask of None: the sampler decides every root itself)
        self._roots_of: Any = _UNCHECKED
        self._root_mask: int | None = None
        self._root_bound = 0
        self._root_kept: str | None = None
        # whether the sampler keeps every child of a sampled parent (keeps_under_sampled_parent)
        self._keeps_of: Any = _UNCHECKED
        self._keeps = False

    def start_span(
        self,
        name: str,
        context: Any = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace_api.Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        *,
        root_id: int | None = None,
    ) -> trace_api.Span:
        """As the SDK tracer's; ``root_id``: the trace id ``decide_root(name)`` gave a root it
        did not drop (a root is decided once, whoever asks first)."""
        links = links or ()
        if _SPAN_KEY is None:  # pragma: no cover (an API without the key)
            parent = trace_api.get_current_span(context).get_span_context()
        else:  # get_current_span(context), without its frames
            holder = (current_context() if context is None else context).get(_SPAN_KEY)
            parent = holder.get_span_context() if isinstance(holder, trace_api.Span) else None
        if parent is None or not parent.is_valid:
            parent = None
            random = self._random_root
            if root_id is None:
                root_id, dropped = self.decide_root(name)
                if dropped is not None:
                    return dropped
            trace_id = root_id
        else:
            trace_id = parent.trace_id
            random = _RANDOM is not None and bool(parent.trace_flags & _RANDOM)
            if parent.trace_flags & 0x01:
                if self.sampler is not self._keeps_of:
                    self._check_keeps()
                if self._keeps:  # what the sampler would answer: sampled, these attributes, the parent's state
                    flags = _SAMPLED_RANDOM if random else _SAMPLED
                    return self._recording(
                        name,
                        span_context(trace_id, self.id_generator.generate_span_id(), False, flags, parent.trace_state),
                        parent,
                        kind,
                        attributes,
                        links,
                        start_time,
                    )
        result = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
        decision = result.decision
        if decision.is_sampled():
            flags = _SAMPLED_RANDOM if random else _SAMPLED
        else:
            flags = _DEFAULT_RANDOM if random else _DEFAULT
        context_made = span_context(trace_id, self.id_generator.generate_span_id(), False, flags, result.trace_state)
        if not decision.is_recording():
            return trace_api.NonRecordingSpan(context_made)
        return self._recording(name, context_made, parent, kind, result.attributes, links, start_time)

    def _recording(
        self,
        name: str,
        context_made: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: Any,
        links: Any,
        start_time: int | None,
    ) -> LeanSpan:
        values, invalid = _cleaned(attributes)
        span = LeanSpan(self, name, context_made, parent, kind, values, tuple(links), start_time or _time_ns())
        span.dropped_attributes = invalid
        if len(values) > self.max_attributes:  # as the SDK's bounded map: the newest are kept
            excess = len(values) - self.max_attributes
            span.attributes = dict(list(values.items())[excess:])
            span.dropped_attributes += excess
        return span

    def decide_root(self, name: str) -> tuple[int, trace_api.NonRecordingSpan | None]:
        """A new root's trace id, and the span the sampler would give it when it drops it
        on the trace id alone (its decision rests on nothing else), without asking it.
        For a caller that can skip its own work on a dropped root before starting it; a
        root it goes on with is started with ``start_span(..., root_id=)``."""
        trace_id = self.id_generator.generate_trace_id()
        if self.sampler is not self._roots_of:
            self._check_roots()
        mask = self._root_mask
        if mask is not None and trace_id & mask >= self._root_bound and name != self._root_kept:
            return trace_id, trace_api.NonRecordingSpan(
                span_context(
                    trace_id,
                    self.id_generator.generate_span_id(),
                    False,
                    _DEFAULT_RANDOM if self._random_root else _DEFAULT,
                )
            )
        return trace_id, None

    def _check_keeps(self) -> None:
        from gym_autoinstr.fastpath.samplers import keeps_under_sampled_parent

        self._keeps_of, self._keeps = self.sampler, _asked(keeps_under_sampled_parent, self.sampler, False)

    def _check_roots(self) -> None:
        from gym_autoinstr.fastpath.samplers import root_decision

        decision = _asked(root_decision, self.sampler, None)
        if decision is None:
            self._root_mask, self._root_bound, self._root_kept = None, 0, None
        else:
            self._root_mask, self._root_bound, self._root_kept = decision.mask, decision.bound, decision.kept
        self._roots_of = self.sampler

    def start_as_current_span(
        self,
        name: str,
        context: Any = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace_api.Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        span = self.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        return trace_api.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        )


def _asked(check: Any, sampler: Any, otherwise: Any) -> Any:
    """``check(sampler)``, or ``otherwise`` when it fails (the sampler is then asked as usual)."""
    try:
        return check(sampler)
    except Exception:
        return otherwise


_PLAIN = (str, int, float, bool)


_DROP = object()


def _cleaned(attributes: Any) -> tuple[dict, int]:
    """The attributes as the SDK would keep them (plain values as they are: our advice's
    own; anything else through the SDK's own validation), and how many it would drop."""
    values: dict = {}
    invalid = 0
    if not attributes:
        return values, invalid
    for key, value in attributes.items():
        if type(key) is not str or not key:
            invalid += _INVALID_KEY_DROPS
            continue
        if type(value) not in _PLAIN:
            value = _clean_value(key, value)
            if value is _DROP:
                continue
        values[key] = value
    return values, invalid


def _clean_value(key: str, value: Any) -> Any:
    """The value the installed SDK would store for ``key`` (its own validation), or _DROP."""
    if _CLEANS_BY_KEY and _clean_key_value is not None:  # older APIs (1.39) drop what they cannot keep
        cleaned = _clean_key_value(key, value, None)
        return _DROP if cleaned is None else cleaned
    if _clean_attribute_value is not None:  # newer: None is kept, odd types made str
        return _clean_attribute_value(value, None)
    return value


def enabled() -> bool:
    if not settings.LEAN_SPANS.read() or not contract.part_on(contract.LEAN):
        return False
    if settings.PYTHON_SDK_INTERNAL_METRICS.read():
        return False
    return True


def lean_tracer_for(provider: Any, sdk_tracer: Any) -> LeanTracer | None:
    """A lean tracer when ``provider`` is an SDK provider whose only span processors are
    our encoding processors and whose limits are the defaults; else None."""
    from opentelemetry.sdk.trace import SpanLimits, Tracer

    from gym_autoinstr.fastpath.batching import EncodingSpanProcessor

    if not enabled() or type(sdk_tracer) is not Tracer:
        return None
    processors = processors_of(provider)
    if not processors or not all(type(p) is EncodingSpanProcessor for p in processors):
        return None
    limits = getattr(sdk_tracer, contract.TRACER_SPAN_LIMITS, None)
    defaults = SpanLimits()
    if (
        limits is None
        or limits.max_span_attribute_length is not None
        or limits.max_attribute_length is not None
        or limits.max_event_attributes != defaults.max_event_attributes
        or limits.max_link_attributes != defaults.max_link_attributes
    ):
        return None
    try:
        return LeanTracer(sdk_tracer, processors)
    except Exception as error:  # an SDK of another shape: its own tracer, then
        logger.debug("lean spans off: %r", error)
        return None


def processors_of(provider: Any) -> tuple:
    active = getattr(provider, contract.ACTIVE_SPAN_PROCESSOR, None)
    return tuple(getattr(active, contract.SPAN_PROCESSORS, ()) or ())
