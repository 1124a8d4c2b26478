"""Ingress requests the sampler drops (a caller's unsampled traceparent, or a root it decides
against): nothing exported, the context read once per header, the headers of the request's
own calls kept ready before any call is made, a server's call to itself under its dropped
root, and with the lean tracer each root decided once."""

from __future__ import annotations

import pytest

from tests.advice.ingress_helpers import PARENT_ID, TRACE_ID, _http_scope, _seeing_middleware, _served, _server_spans


def test_a_dropped_callers_header_seen_again_is_read_once_and_the_sampler_of_the_moment_decides(
    instrumented, spans, monkeypatch
):
    """Every request of a rollout the sampler dropped carries the same traceparent: the
    second one reuses the context read for the first (no span either time), a tracestate
    beside it is still read, and a sampler that records children of unsampled callers,
    once installed, is obeyed for the header seen before."""
    import asyncio

    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    from gym_autoinstr.telemetry.spans import tracer

    middleware, seen = _seeing_middleware("dropped_server")
    traceparent = (b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00".encode())

    def request(*headers):
        asyncio.run(_served(middleware, _http_scope("/verify", *headers)))
        return seen[-1]

    first, second = request(traceparent), request(traceparent)
    assert second is first  # the same context, read once
    assert format(first.trace_id, "032x") == TRACE_ID and first.span_id != int(PARENT_ID, 16)  # its own (W3C)
    assert not first.trace_flags.sampled
    with_state = request(traceparent, (b"tracestate", b"vendor=1"))
    assert with_state.span_id != int(PARENT_ID, 16) and dict(with_state.trace_state) == {"vendor": "1"}
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []

    monkeypatch.setattr(tracer(), "sampler", ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    request(traceparent)
    (span,) = _server_spans(spans)
    assert span.parent.span_id == int(PARENT_ID, 16) and format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent.is_remote and not span.parent.trace_flags.sampled


def test_a_root_the_sampler_drops_gets_a_valid_unsampled_span_and_leaves_the_context_as_it_was(
    instrumented, spans, monkeypatch
):
    """A request with no caller (an agent's ``/run``) that the sampler drops: the handler
    runs under the SDK's non-recording span (its ids go on to the next hops), nothing is
    exported, and the request's context is gone once it is served."""
    import asyncio

    from opentelemetry import context as otel_context
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from gym_autoinstr.telemetry.spans import tracer

    monkeypatch.setattr(tracer(), "sampler", ParentBased(TraceIdRatioBased(0.0)))
    middleware, seen = _seeing_middleware("root_server")
    sent: list = []

    async def send(message):
        sent.append(message.get("status"))

    scope = _http_scope("/run")

    async def caller():
        before = otel_context.get_current()
        await _served(middleware, scope, send)
        await _served(middleware, dict(scope), send)
        assert otel_context.get_current() is before

    asyncio.run(caller())
    first, second = seen
    assert first.is_valid and second.is_valid and not first.trace_flags.sampled and not first.is_remote
    assert first.trace_id != second.trace_id  # each request its own root, decided by the sampler
    assert sent == [200, None, 200, None]
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []


def _lean_tracer(monkeypatch, sampler):
    """A lean tracer (``lean.py``: what a process behind our own pipeline starts spans with)
    over its own provider with ``sampler``, made the package's tracer for this test; its
    spans are encoded and never sent."""
    from opentelemetry.sdk.trace import TracerProvider

    from gym_autoinstr.advice import ingress
    from gym_autoinstr.fastpath import batching, lean
    from gym_autoinstr.telemetry import spans

    class Discard:
        def export(self, batch):
            class Ok:
                name = "SUCCESS"

            return Ok

        def shutdown(self):
            pass

    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(
        batching.EncodingSpanProcessor(
            Discard(), max_queue_size=4096, schedule_delay_millis=60_000, max_export_batch_size=512
        )
    )
    lean_tracer = lean.lean_tracer_for(provider, provider.get_tracer("gym_autoinstr"))
    assert lean_tracer is not None
    monkeypatch.setattr(ingress, "tracer", lambda: lean_tracer)
    monkeypatch.setattr(spans, "_tracer", lean_tracer)  # what the dropped path reads its sampler from
    return lean_tracer


def _calls_seeing_middleware(monkeypatch, sampler, server_name: str, lean_tracer: bool = False, then=None):
    """Our middleware, with ``sampler`` installed (on a lean tracer when ``lean_tracer``),
    around a bare ASGI app that notes, before any call is made under it, what the dropped
    path has kept for its context, then what a call under it is sent with, and awaits
    ``then(scope, receive, send)`` (when given) before it responds: ``(middleware, seen)``."""
    from gym_autoinstr.advice.ingress import GymServerMiddleware
    from gym_autoinstr.fastpath import context_ops
    from gym_autoinstr.telemetry import sampling
    from gym_autoinstr.telemetry.spans import tracer

    if lean_tracer:
        _lean_tracer(monkeypatch, sampler)
    else:
        monkeypatch.setattr(tracer(), "sampler", sampler)
    seen: list = []

    async def app(scope, receive, send):
        context = context_ops.current_context()
        kept = sampling._dropped_contexts.get(id(context))
        seen.append((context, kept and kept[0] is context and kept[4], sampling.dropped_call(context)))
        if then is not None:
            await then(scope, receive, send)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return GymServerMiddleware(app, server_name=server_name), seen


def _what_the_sdk_sends_under(context) -> dict:
    from opentelemetry import propagate

    carrier: dict = {}
    propagate.inject(carrier, context=context)
    return carrier


def test_a_dropped_rollouts_first_request_leaves_the_headers_of_its_calls_ready(instrumented, spans, monkeypatch):
    """The first request of a dropped rollout at a server (a traceparent not seen before, in
    the SDK's unsampled form): its context is kept with the header its calls carry on
    before any call is made, and that header is the SDK's own for the context; a sampler
    that records the children of unsampled callers gets no such shortcut."""
    import asyncio

    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from gym_autoinstr.telemetry import sampling
    from gym_autoinstr.telemetry.spans import tracer

    middleware, seen = _calls_seeing_middleware(
        monkeypatch, ParentBased(TraceIdRatioBased(0.5)), "first_request_server"
    )

    def request(header: str):
        asyncio.run(_served(middleware, _http_scope("/verify", (b"traceparent", header.encode()))))
        return seen[-1]

    header = f"00-{'3' * 32}-{PARENT_ID}-00"
    context, kept, (span, headers) = request(header)
    assert kept == headers == _what_the_sdk_sends_under(context) and headers["traceparent"][:36] == header[:36]
    assert span is trace.get_current_span(context) and span.get_span_context().span_id != int(PARENT_ID, 16)
    again, kept_again, _ = request(header)  # the rollout's next request here: the same context
    assert again is context and kept_again == kept
    sampling._dropped_contexts.clear()  # worked out anew, the same answer
    assert sampling.dropped_call(context) == (span, kept)
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []

    monkeypatch.setattr(tracer(), "sampler", ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    other = f"00-{'4' * 32}-{PARENT_ID}-00"
    context, kept, dropped = request(other)
    assert not kept and dropped is None
    (server,) = _server_spans(spans)
    assert server.parent.span_id == int(PARENT_ID, 16) and format(server.context.trace_id, "032x") == "4" * 32


@pytest.mark.parametrize("lean_tracer", [False, True], ids=["sdk tracer", "lean tracer"])
def test_a_dropped_root_leaves_the_headers_of_its_calls_ready(instrumented, spans, monkeypatch, lean_tracer):
    """A root the sampler drops (an agent's /run): kept with the header its calls carry on
    before any call is made, the SDK's own for its context; a new one per request.  With
    the lean tracer the root is decided before its span is started (``_root``)."""
    import asyncio

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from gym_autoinstr.telemetry import sampling

    middleware, seen = _calls_seeing_middleware(
        monkeypatch, ParentBased(TraceIdRatioBased(0.0)), "root_server", lean_tracer
    )
    scope = _http_scope("/run")
    for _ in range(2):
        asyncio.run(_served(middleware, dict(scope)))
    for context, kept, (_span, headers) in seen:
        assert kept == headers == _what_the_sdk_sends_under(context)
        assert not int(headers["traceparent"][-2:], 16) & 0x01 and len(headers["traceparent"]) == 55  # unsampled
    assert seen[0][1] != seen[1][1]
    sampling._dropped_contexts.clear()  # worked out anew, the same answer
    assert sampling.dropped_call(seen[0][0])[1] == seen[0][1]
    assert [s.name for s in spans.get_finished_spans() if s.name != "gym.server.startup"] == []


def test_a_call_of_a_server_to_itself_runs_under_its_dropped_roots_context(instrumented, monkeypatch):
    """Gym's simple agent posts its own ``/v1/responses`` inside ``/run``.  Under a root the
    sampler dropped, that request runs under the root's own context (``w3c.own_root``),
    dropped too, its header not read anew; once the sampler would record the children of
    unsampled callers, the same header is read as usual: a remote parent, a sampled span."""
    import asyncio

    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from gym_autoinstr.fastpath import context_ops, w3c
    from gym_autoinstr.telemetry import sampling, spans

    def request(path, traceparent=None):
        return _http_scope(path, *([(b"traceparent", traceparent.encode())] if traceparent else []))

    async def call_itself(scope, receive, send):  # with what a call under /run carries
        if scope["path"] == "/run":
            carried = sampling.dropped_call(context_ops.current_context())[1]
            await middleware(request("/v1/responses", carried["traceparent"]), receive, send)

    middleware, seen = _calls_seeing_middleware(
        monkeypatch, ParentBased(TraceIdRatioBased(0.0)), "agent_server", lean_tracer=True, then=call_itself
    )
    asyncio.run(_served(middleware, request("/run")))
    (root, kept, (_, carried)), (inner, kept_inner, (_, carried_inner)) = seen
    header = carried["traceparent"]
    assert inner is root and kept == kept_inner == carried == carried_inner  # the root's context and headers
    assert w3c._extracted.get(header) is None  # (not read from the header)
    made = trace.get_current_span(root).get_span_context()
    assert made.is_valid and not made.trace_flags.sampled and not made.is_remote

    # A sampler that records the children of unsampled callers: the header is read as usual.
    monkeypatch.setattr(
        spans._tracer,
        "sampler",
        ParentBased(TraceIdRatioBased(0.0), remote_parent_not_sampled=ALWAYS_ON, local_parent_not_sampled=ALWAYS_ON),
    )
    asyncio.run(_served(middleware, request("/v1/responses", header)))
    read, kept_read, dropped_read = seen[-1]
    span = trace.get_current_span(read)
    assert read is not root and kept_read is None and dropped_read is None
    assert span.get_span_context().trace_flags.sampled and span.get_span_context().trace_id == made.trace_id
    assert span.parent.is_remote and span.parent.span_id == made.span_id


def test_with_the_lean_tracer_a_root_is_decided_once(instrumented, monkeypatch):
    """Decided before its span is made (``ingress._root``) and started with the trace id it
    was decided on: a ratio of 1/2 keeps about half of the roots (deciding twice would
    keep a quarter), each kept one recording under the id that kept it."""
    import asyncio

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    sampler = ParentBased(TraceIdRatioBased(0.5))
    lean_tracer = _lean_tracer(monkeypatch, sampler)
    asked: list = []
    decide = lean_tracer.decide_root
    monkeypatch.setattr(lean_tracer, "decide_root", lambda name: asked.append(name) or decide(name))
    middleware, seen = _seeing_middleware("root_server")
    scope = _http_scope("/run")

    async def serve():
        for _ in range(400):
            await _served(middleware, dict(scope))

    asyncio.run(serve())
    assert asked == ["POST"] * 400  # every root decided up front
    kept = [c for c in seen if c.trace_flags.sampled]
    assert 150 <= len(kept) <= 250, len(kept)  # Binomial(400, 1/2); a quarter would be ~100
    bound = sampler._root.bound
    assert all(c.trace_id & 0xFFFFFFFFFFFFFFFF < bound for c in kept)
    dropped = [c for c in seen if not c.trace_flags.sampled]
    assert all(c.is_valid and c.trace_id & 0xFFFFFFFFFFFFFFFF >= bound for c in dropped)
    assert len(set(c.trace_id for c in seen)) == 400
