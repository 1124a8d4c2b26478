"""A batch span processor that encodes each span to OTLP bytes when it ends.

The queue holds ``bytes``, never span objects; the export thread hands the joined request
to the SDK's own OTLP exporter through its wrapped ``encode_spans``.  Why, and when the
stock ``BatchSpanProcessor`` is used instead: docs/architecture.md, "What makes it cheap".
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import SpanProcessor

from gym_autoinstr import _footprint
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.fastpath import contract, span_facts, wire, wire_json
from gym_autoinstr.fastpath.contract import SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS_KEY
from gym_autoinstr.losses import LEDGER
from gym_autoinstr.settings import ENCODE_ON_END


def _fact(span: Any, kept: list[str]) -> str:
    """A span's facts; "" when they cannot be made (its batch then has none: the span is kept)."""
    try:
        return span_facts.fact(span, kept)
    except Exception as error:
        warn_once("span-facts", "a span's facts could not be written (%r); readers read its segment's spans", error)
        return ""


class EncodedBatch:
    """An export request already encoded (OTLP protobuf bytes, or OTLP-JSON text for the
    run directory's files), in place of the list of spans the exporter's ``export``
    receives.  ``len()`` is the span count (the exporter's self-metrics count it)."""

    __slots__ = ("payload", "count", "facts")

    def __init__(self, payload: bytes, count: int, facts: str | None = None) -> None:
        self.payload = payload
        self.count = count
        self.facts = facts  # the batch's spans' facts (``span_facts``), for the run directory's files

    def __len__(self) -> int:
        return self.count

    def __iter__(self):  # an exporter that iterates the batch sees no span objects
        return iter(())

    def SerializePartialToString(self) -> bytes:  # noqa: N802 - the protobuf message API
        return self.payload

    SerializeToString = SerializePartialToString


# -- the exporter side -------------------------------------------------------------------

_HOOKED: dict[str, bool] = {}


def _hook_module(module: Any, parse: bool) -> bool:
    """Wrap ``module.encode_spans`` so an ``EncodedBatch`` passes through."""
    if _HOOKED.get(module.__name__):
        return True
    original = getattr(module, "encode_spans", None)
    if not callable(original):
        return False
    if parse:  # gRPC hands the stub a message object: parse our bytes into one (in C)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        def encode_spans(spans: Any) -> Any:
            if type(spans) is EncodedBatch:
                return ExportTraceServiceRequest.FromString(spans.payload)
            return original(spans)
    else:

        def encode_spans(spans: Any) -> Any:
            if type(spans) is EncodedBatch:
                return spans
            return original(spans)

    encode_spans.__wrapped__ = original  # type: ignore[attr-defined]
    name = "otlp.grpc.encode_spans" if parse else "otlp.http.encode_spans"  # pointcuts.PROCESS_PATCHES
    _footprint.apply(
        name,
        module,
        "encode_spans",
        encode_spans,
        busy=_exporting,
        on_restore=lambda: _HOOKED.pop(module.__name__, None),
    )
    _HOOKED[module.__name__] = True
    return True


# Our encoding processors not shut down: while one lives, the exporter modules' hooks stay
# (a batch of bytes through the original encode_spans would export nothing).
_LIVE: weakref.WeakSet[EncodingSpanProcessor] = weakref.WeakSet()


def _exporting() -> bool:
    return any(not processor._shutdown for processor in list(_LIVE))


def _calls_encode_spans(function: Any) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and "encode_spans" in code.co_names


def accepts_encoded(exporter: Any) -> bool:
    """True when ``exporter`` is the SDK's OTLP span exporter (HTTP or gRPC) of a shape we
    know; its module's ``encode_spans`` is then wrapped (once per process)."""
    import sys

    cls = type(exporter)
    module = sys.modules.get(cls.__module__)
    if module is None or cls.__name__ != "OTLPSpanExporter":
        return False
    if cls.__module__ == "opentelemetry.exporter.otlp.proto.http.trace_exporter":
        if not _calls_encode_spans(getattr(cls, "export", None)):
            return False
        return _hook_module(module, parse=False)
    if cls.__module__ == "opentelemetry.exporter.otlp.proto.grpc.trace_exporter":
        if not _calls_encode_spans(getattr(cls, contract.GRPC_TRANSLATE, None)):
            return False
        return _hook_module(module, parse=True)
    return False


# -- the processor -----------------------------------------------------------------------


class _Scope:
    __slots__ = ("encoded", "schema_url")

    def __init__(self, encoded: bytes, schema_url: str | None) -> None:
        self.encoded = encoded
        self.schema_url = schema_url


class EncodingSpanProcessor(SpanProcessor):
    """``encoding``: ``wire`` (OTLP protobuf, for the SDK's OTLP exporters) or
    ``wire_json`` (OTLP-JSON, for the run directory's files).  ``label`` names the
    exporter in the loss counts (``losses.py``)."""

    def __init__(
        self,
        exporter: Any,
        *,
        max_queue_size: int,
        schedule_delay_millis: float,
        max_export_batch_size: int,
        encoding: Any = wire,
        label: str = "otlp",
        facts: bool = False,
    ) -> None:
        self._exporter = exporter
        self._encoding = encoding
        # each span's facts (``span_facts``) after its text, past a NUL (JSON text holds none)
        self._facts = facts
        self._facts_resource: tuple[Any, str] | None = None
        self._label = label
        self._max_queue_size = max_queue_size
        self._delay = schedule_delay_millis / 1000
        self._batch_size = max(1, min(max_export_batch_size, max_queue_size))
        # Encoded spans: the bytes alone for a span of the usual (scope, resource) pair,
        # a (scope, resource, bytes) tuple for any other.  A deque's append and popleft
        # are atomic.  (A queued tuple is an object the garbage collector tracks, and at
        # a busy server's rate a batch waits long enough for it to be carried into the
        # oldest generation, whose collections walk it.)
        self._queue: collections.deque = collections.deque()
        self._usual: tuple[Any, Any] | None = None  # the first (scope, resource) seen, then fixed
        self._usual_lock = threading.Lock()
        self._scopes: dict[int, tuple[Any, _Scope]] = {}
        self._resource: tuple[Any, bytes] | None = None
        self._dropped = 0
        self._encode_failures = 0
        self._ended = 0  # sampled spans handed to this processor
        self._inflight = 0  # spans of the batch being exported now
        self._shutdown = False
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        _LIVE.add(self)
        LEDGER.add_source(label, self.counts)
        self._start_thread()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (ref() or (lambda: None))())

    # counters for `doctor`, tests and the benchmarks' probe
    @property
    def dropped_spans(self) -> int:
        return self._dropped

    def counts(self) -> tuple[int, int]:
        """(spans ended here, spans not yet exported: queued or in the running export)."""
        return self._ended, len(self._queue) + self._inflight

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._run, name="gym-autoinstr-export", daemon=True)
        thread.start()
        self._thread = thread

    def _after_fork(self) -> None:
        # The child starts with what the parent had queued (the parent exports it) and
        # no export thread: both are made anew.
        self._queue = collections.deque()
        self._ended = self._inflight = 0
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._start_thread()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if not span.context.trace_flags & 0x01:  # (not sampled)
            return
        self._ended += 1
        if self._shutdown:
            LEDGER.lose(self._label, "already_shutdown")
            return
        queue = self._queue
        if len(queue) >= self._max_queue_size:
            self._dropped += 1
            LEDGER.lose(self._label, "queue_full")
            warn_once(
                "bsp-queue-full",
                "span queue full (%d spans): new spans are dropped until the exporter catches up; "
                "raise OTEL_BSP_MAX_QUEUE_SIZE or check the collector.",
                self._max_queue_size,
            )
            return
        try:
            if self._facts:
                kept: list[str] = []
                encoded = self._encoding.span(span, None, kept)
                encoded = encoded + "\x00" + _fact(span, kept)
            else:
                encoded = self._encoding.span(span)
        except Exception as error:  # never Gym's problem: this span is lost, and says so once
            self._encode_failures += 1
            LEDGER.lose(self._label, "encode_failed")
            warn_once("wire-encode", "a span could not be encoded and is not exported: %r", error)
            return
        scope, resource = span.instrumentation_scope, span.resource
        usual = self._usual
        if usual is None:
            usual = self._first_pair(scope, resource)
        if scope is usual[0] and resource is usual[1]:
            queue.append(encoded)
        else:
            queue.append((scope, resource, encoded))
        if len(queue) >= self._batch_size and not self._wake.is_set():
            self._wake.set()

    def _first_pair(self, scope: Any, resource: Any) -> tuple[Any, Any]:
        with self._usual_lock:  # two threads ending their first spans at once agree on one
            if self._usual is None:
                self._usual = (scope, resource)
            return self._usual

    # -- export thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self._delay)
            self._wake.clear()
            if self._shutdown:
                break
            try:
                self._export_queued(until_empty=False)
            except Exception as error:  # the loop must survive anything an exporter does
                warn_once("export-loop", "span export failed: %r", error)

    def _scope(self, scope: Any) -> _Scope:
        hit = self._scopes.get(id(scope))
        if hit is None or hit[0] is not scope:
            encoded = _Scope(self._encoding.scope(scope), getattr(scope, "schema_url", None) if scope else None)
            hit = self._scopes[id(scope)] = (scope, encoded)
        return hit[1]

    def _scope_spans(self, scope: Any, spans: list) -> bytes:
        known = self._scope(scope)
        return self._encoding.scope_spans(known.encoded, known.schema_url, spans)

    def _resource_bytes(self, resource: Any) -> bytes:
        known = self._resource
        if known is None or known[0] is not resource:
            known = self._resource = (resource, self._encoding.resource(resource))
        return known[1]

    def _facts_text(self, by_resource: dict, facts: dict[int, list[str]] | None) -> str | None:
        """The batch's facts, a group per resource (``span_facts.group``); None without them,
        or when a span's are missing (readers then read the segment's spans)."""
        if not facts or any(not fact for spans in facts.values() for fact in spans):
            return None
        groups = []
        for key, (resource, _scopes) in by_resource.items():
            known = self._facts_resource
            if known is None or known[0] is not resource:
                known = self._facts_resource = (resource, span_facts.resource(resource))
            groups.append(span_facts.group(known[1], facts.get(key, [])))
        return ",".join(groups)

    def _export_queued(self, until_empty: bool) -> bool:
        """Export what is queued, one batch at a time; True if every export succeeded."""
        ok = True
        with self._export_lock:
            while True:
                batch = self._take()
                if not batch:
                    return ok
                ok = self._export(batch) and ok
                if not until_empty and len(self._queue) < self._batch_size:
                    return ok

    def _take(self) -> list:
        queue = self._queue
        batch = []
        popleft = queue.popleft
        for _ in range(min(len(queue), self._batch_size)):
            try:
                batch.append(popleft())
            except IndexError:
                break
        return batch

    def _export(self, batch: list) -> bool:
        # Group by resource, then by scope, keeping first-seen order.
        by_resource: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        facts: dict[int, list[str]] | None = {} if self._facts else None
        usual = self._usual
        for item in batch:
            if type(item) is not tuple:
                (scope, resource), encoded = usual, item
            else:
                scope, resource, encoded = item
            entry = by_resource.get(id(resource))
            if entry is None:
                entry = by_resource[id(resource)] = (resource, {})
            scopes = entry[1]
            spans = scopes.get(id(scope))
            if spans is None:
                spans = scopes[id(scope)] = (scope, [])
            if facts is not None:
                encoded, _nul, fact = encoded.partition("\x00")
                facts.setdefault(id(resource), []).append(fact)
            spans[1].append(encoded)
        encoding = self._encoding
        payload = encoding.request(
            [
                encoding.export_request(
                    self._resource_bytes(resource),
                    getattr(resource, "schema_url", None),
                    [self._scope_spans(scope, spans) for scope, spans in scopes.values()],
                )
                for resource, scopes in by_resource.values()
            ]
        )
        token = otel_context.attach(otel_context.set_value(_SUPPRESS_KEY, True))
        self._inflight = len(batch)
        try:
            result = self._exporter.export(EncodedBatch(payload, len(batch), self._facts_text(by_resource, facts)))
            return getattr(result, "name", None) == "SUCCESS"
        except Exception as error:  # (the exporter wrapper counts the batch as lost)
            warn_once("export-error", "span export raised %r; this batch is lost.", error)
            return False
        finally:
            self._inflight = 0
            otel_context.detach(token)

    # -- flush and shutdown ----------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now, on the calling thread (``flush.py`` calls this
        from its own thread and bounds the wait)."""
        if self._shutdown:
            return True
        return self._export_queued(until_empty=True)

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._export_queued(until_empty=True)
        self._shutdown = True
        self._wake.set()
        try:
            self._exporter.shutdown()
        except Exception as error:
            logger.debug("span exporter shutdown failed: %r", error)
        _footprint.restore_pending()  # an encode_spans hook uninstrument left for us


def make_processor(exporter: Any, wrap: Callable[[Any], Any], label: str = "otlp", **settings: Any) -> SpanProcessor:
    """Our encoding processor in front of a known OTLP exporter or the run directory's
    files (``accepts_json``), the SDK's ``BatchSpanProcessor`` in front of anything else."""
    try:
        fast = ENCODE_ON_END.read() and contract.part_on(contract.ENCODE_ON_END) and contract.part_on(contract.WIRE)
        if fast and getattr(exporter, "accepts_json", False) is True:
            return EncodingSpanProcessor(wrap(exporter), encoding=wire_json, label=label, facts=True, **settings)
        if fast and accepts_encoded(exporter):
            return EncodingSpanProcessor(wrap(exporter), label=label, **settings)
    except Exception as error:
        warn_once("encoding-processor", "the encoding span processor is off (%r); using the SDK's.", error)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(wrap(exporter), **settings)
