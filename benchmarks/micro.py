"""In-process micro-benchmarks (run inside the Gym venv that has gym-autoinstr).

Per call, with ``timeit``, variants interleaved in every repetition:

* egress: ``nemo_gym.server_utils.request``'s shape (an async function) unwrapped, and
  wrapped exactly as the egress pointcut wraps it (``patching.wrap``: a wrapt
  ``FunctionWrapper`` around ``egress.request_advice``) with the ``http_client`` group off and on;
* route seam: an async handler unwrapped, and ``routes.wrap_handler`` around it (the
  ``gym.verify`` seam) with its group off and on;
* ingress: a trivial ASGI app bare, and behind ``GymServerMiddleware`` with the
  ``server`` group off and on, each also with metrics live (``+metrics``: in-flight
  count, ``http.server.request.duration`` and the seam's ``gym.verify.duration_ms``, on
  the real SDK meter provider: two histogram records per request);
* "dropped" (egress, seam, ingress): "on", for a caller whose span the sampler dropped
  (``traceparent`` flags ``02``, unsampled with a random trace id, as every root our
  tracer makes from the SDK's random ids is written; under the default parent-based sampler nothing is
  recorded, and ``telemetry/sampling.py`` lets our advice skip the span altogether);
  "root-dropped+metrics" (ingress): a request with no caller context that a ratio
  sampler of 0 (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, as configured) drops
  at its root, as the agent's ``POST /run`` of a rollout left out;
  "dropped-first+metrics" (ingress): "dropped+metrics" with a ``traceparent`` not seen
  before (every rollout is a trace of its own: each server reads one per rollout);
* hop: a request whose handler makes one call (the egress) before it answers, bare, and
  for a dropped rollout's first request at a server ("dropped-first+metrics") and at its
  root ("root-dropped+metrics"): the work a dropped rollout costs a server once, with the
  first call made under the request's context;
* answered: a call whose answer Gym parses (``request``, then ``get_response_json``'s
  shape: ``orjson.loads(await response.read())``) on a response of aiohttp's shape, bare,
  wrapped as egress and the ``outcome`` pointcut wrap them with every group on ("on": a
  callee Gym's config does not name, whose CLIENT span ends as before issue #53), and to a
  resources server's ``/verify`` ("on+outcome": the span held for Gym's parse, the reward
  read off the parsed answer, then ended): the difference is what reading a rollout's
  outcome costs a call;
* semaphore: a free ``asyncio.Semaphore`` acquired and released, as Gym's servers do
  around their limited work, bare and once ``advice/concurrency.py`` observes it
  (``off+metrics``: its class swapped for the timing subclass; a free acquire takes the
  base path after one ``locked()`` test);
* job rollout: one rollout awaitable of ``run_examples`` (a coroutine that returns at
  once) awaited bare, and as the ``job.examples`` advice yields it (``on``: wrapped to be
  awaited inside the job, tracked until settled or dropped); once per rollout, in the
  orchestrator;
* ray submit: a method of ``RemoteFunction._remote``'s shape, called as ``.remote()``
  calls it (``self._remote(args=..., kwargs=..., **options)``), unwrapped and wrapped as
  the ``ray.task`` pointcut wraps it with the ``ray`` group off (what a ``.remote()``
  call costs more than untraced; "on" needs a Ray cluster: ``tests/advice/test_realgym_ray.py``).

"on" runs the real SDK pipeline of our configurator (``TracerProvider`` with our encoding
span processor at our defaults, so our tracer hands out lean spans and each span is
encoded to OTLP bytes as it ends, on the calling thread: that cost is counted here) in
front of an exporter that discards the encoded batches.
Coroutines are driven with ``send(None)`` (none of them suspends), so no event loop
cost is counted.  Time is the calling thread's CPU time (``time.thread_time``): on a
shared machine, wall time mostly measures the neighbours.  The headline is the best
repetition of each variant (what the code costs when nothing interferes); the median
of the per-repetition differences is reported beside it.  Prints one JSON object.
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import sys
import time
import timeit

# When a list: the server's ``send`` appends how many objects the GC's young generation
# holds each time it runs (``instructions.py --objects``: what is alive while a response
# starts).
ALIVE: list[int] | None = None
# The same, appended by the wrapped call itself (``request``, ``verify``): what is alive
# while Gym's call or handler runs inside our egress or seam.
ALIVE_IN_CALL: list[int] | None = None


VERIFY_URL = "http://127.0.0.1:8001/verify"  # a resources server's, per the pool's names (answered)


def _drive(coro):
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("benchmark coroutine suspended")


class Bench:
    """The call sites and their variants, set up once in this process (see the module
    doc): ``cases[site][variant]`` is a no-argument callable making one call; run it
    inside ``with bench.variant(name):``, which switches the span groups and metrics
    and makes a dropped span current as the variant asks."""

    def __init__(self, cases: dict, enabled: dict, dropped_context, provider, spans_exported) -> None:
        self.cases = cases
        self.spans_exported = spans_exported  # () -> spans the discarding exporter took
        self.enabled = enabled
        self.dropped_context = dropped_context
        self.provider = provider

    @contextlib.contextmanager
    def variant(self, name: str):
        from opentelemetry import context as otel_context

        from gym_autoinstr.telemetry import groups, metrics

        groups.ENABLED = self.enabled[name]
        metrics.LIVE = name.endswith("+metrics")
        # "dropped": the caller's span is one the sampler dropped (the current span here;
        # for the ingress, the request's traceparent says so)
        token = otel_context.attach(self.dropped_context) if name.startswith("dropped") else None
        # "root-dropped": no caller context at all, and the sampler drops the root (what a
        # ratio sampler does at the agent's POST /run to a rollout it leaves out)
        tracer, sampler = None, None
        if name.startswith("root-dropped"):
            from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

            from gym_autoinstr.fastpath import samplers
            from gym_autoinstr.telemetry import spans

            tracer = spans.tracer()
            # what OTEL_TRACES_SAMPLER=parentbased_traceidratio, _ARG=0 makes (configured_sampler)
            sampler, tracer.sampler = tracer.sampler, samplers.JobKeepingSampler(ParentBasedTraceIdRatio(0))
        try:
            yield
        finally:
            if token is not None:
                otel_context.detach(token)
            if tracer is not None:
                tracer.sampler = sampler


def build() -> Bench:
    import wrapt
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from gym_autoinstr.advice import egress, ray_tasks, routes
    from gym_autoinstr.advice.ingress import GymServerMiddleware
    from gym_autoinstr.fastpath.batching import EncodingSpanProcessor
    from gym_autoinstr.setup.configurator import BATCH_DEFAULTS
    from gym_autoinstr.telemetry import groups, metrics

    class Discard(SpanExporter):
        """Takes the encoded batches the OTLP exporter would send."""

        exported = 0

        def export(self, batch):
            Discard.exported += len(batch)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(
        EncodingSpanProcessor(
            Discard(),
            max_queue_size=BATCH_DEFAULTS["OTEL_BSP_MAX_QUEUE_SIZE"],
            schedule_delay_millis=BATCH_DEFAULTS["OTEL_BSP_SCHEDULE_DELAY"],
            max_export_batch_size=BATCH_DEFAULTS["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"],
        )
    )
    trace.set_tracer_provider(provider)
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, PeriodicExportingMetricReader

    from gym_autoinstr.fastpath import histograms

    class DiscardMetrics(MetricExporter):
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis=10_000):
            return True

        def shutdown(self, timeout_millis=30_000, **kwargs):
            pass

    # as our configurator builds it: no exemplars unless OTEL_METRICS_EXEMPLAR_FILTER says
    # so, and the request histograms aggregated by histograms.py (GYM_AUTOINSTR_FAST_HISTOGRAMS=0:
    # the SDK's)
    exporter = DiscardMetrics()
    if histograms.qualifies(exporter):
        exporter = histograms.MergingExporter(exporter)
    metric_reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    meter_provider = MeterProvider(metric_readers=[metric_reader], exemplar_filter=AlwaysOffExemplarFilter())
    otel_metrics.set_meter_provider(meter_provider)
    histograms.bind(meter_provider, [metric_reader])
    metrics.activate()

    class Response:
        status = 200

    async def request(method, url, **kwargs):  # nemo_gym.server_utils.request's shape
        if ALIVE_IN_CALL is not None:  # (instructions.py --objects)
            ALIVE_IN_CALL.append(len(gc.get_objects(generation=0)))
        return Response

    try:  # as the egress pointcut wraps it (older trees, for --code: a bare FunctionWrapper)
        from gym_autoinstr.patching import wrap
    except ImportError:

        def wrap(original, advice, module_level):
            return wrapt.FunctionWrapper(original, advice)

    wrapped_request = wrap(request, egress.request_advice, module_level=True)

    class Body:
        pass

    body = Body()

    async def verify(body):
        if ALIVE_IN_CALL is not None:
            ALIVE_IN_CALL.append(len(gc.get_objects(generation=0)))
        return body

    seam = routes.Seam("gym.verify", groups.VERIFY, server=None, server_name="example_single_tool_call")
    wrapped_verify = routes.wrap_handler(verify, seam)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = GymServerMiddleware(app, server_name="example_single_tool_call")

    def calling_app(call):
        async def app(scope, receive, send):  # a handler that calls another server first
            await call("POST", url, json=None)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        return app

    bare_hop = calling_app(request)
    hop = GymServerMiddleware(calling_app(wrapped_request), server_name="example_single_tool_call")

    class Route:  # what Starlette leaves in the scope: the matched route, our marked endpoint
        path = "/verify"
        endpoint = wrapped_verify

    setattr(wrapped_verify, metrics.SEAM_ATTRIBUTE, routes.seam_metric("gym.verify", "example_single_tool_call"))
    scope = {
        "route": Route(),
        "type": "http",
        "method": "POST",
        "path": "/verify",
        "scheme": "http",
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"content-type", b"application/json"),
            (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ],
    }

    # The same request from a caller whose span the sampler dropped (flags 00).
    dropped_scope = {
        **scope,
        "headers": [
            (b"content-type", b"application/json"),
            (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-02"),
        ],
    }
    # The same request with no caller context (a rollout's root at the agent).
    root_scope = {**scope, "headers": [(b"content-type", b"application/json")]}
    # Dropped callers' requests, each of a rollout not seen before (more than the caches hold)
    import itertools
    import random

    ids = random.Random(5)
    first_scopes = itertools.cycle(
        [
            {
                **scope,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"traceparent", f"00-{ids.getrandbits(128) | 1:032x}-{ids.getrandbits(64) | 1:016x}-02".encode()),
                ],
            }
            for _ in range(4096)
        ]
    )
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    dropped_context = trace.set_span_in_context(
        NonRecordingSpan(
            SpanContext(
                0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True, trace_flags=TraceFlags(0)
            )
        )
    )

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    async def send(message):
        if ALIVE is not None:  # (instructions.py --objects)
            ALIVE.append(len(gc.get_objects(generation=0)))
        return None

    class RemoteFunction:  # the shape of ray.remote_function.RemoteFunction._remote
        def _remote(self, args=None, kwargs=None, **task_options):
            return None

    class TracedRemoteFunction(RemoteFunction):
        pass

    TracedRemoteFunction._remote = wrapt.FunctionWrapper(RemoteFunction._remote, ray_tasks.remote_function_advice)
    plain_function, traced_function = RemoteFunction(), TracedRemoteFunction()
    call_args, call_kwargs = (1, 2), {"k": 3}

    # -- semaphore (advice/concurrency.py) --
    import asyncio

    from gym_autoinstr.advice import concurrency

    class SemaphoreServer:  # a Gym server object holding its limit
        pass

    bare_semaphore, observed_server = asyncio.Semaphore(4), SemaphoreServer()
    observed_server._semaphore = asyncio.Semaphore(4)
    concurrency.watch_server(observed_server, "benchmark")
    observed_semaphore = observed_server._semaphore

    def acquire_release(semaphore):
        _drive(semaphore.acquire())
        semaphore.release()

    # -- a call whose answer Gym parses (advice/outcome.py) --
    import orjson

    from gym_autoinstr.advice import fleet_addresses, outcome

    class Content:  # aiohttp's StreamReader, as hold() asks it: the body is in
        def is_eof(self):
            return True

        def on_eof(self, callback):
            callback()

    class Answered:  # aiohttp's ClientResponse, as egress and hold() use it
        status = 200
        content = Content()

        async def read(self):
            return b'{"reward": 1.0, "response": {"usage": {"input_tokens": 7, "output_tokens": 3}}}'

    async def answered_request(method, url, **kwargs):
        return Answered()

    async def get_response_json(response):  # server_utils.get_response_json, every release
        return orjson.loads(await response.read())

    wrapped_answered = wrap(answered_request, egress.request_advice, module_level=True)
    wrapped_parse = wrap(get_response_json, outcome.get_response_json_advice, module_level=True)
    fleet_addresses._state.names = {"127.0.0.1:8001": "example_single_tool_call"}  # as Gym's config names it
    fleet_addresses._state.kinds = {"127.0.0.1:8001": "resources_servers"}

    async def answered(call, parse, to):
        return await parse(await call("POST", to, json=None))

    # -- job rollout (advice/job.py) --
    from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan

    from gym_autoinstr.advice import job

    examples_job = job._ExamplesJob(
        job.JobState(span=NonRecordingSpan(INVALID_SPAN_CONTEXT), job_id="bench", reroot=False)
    )

    async def one_rollout():
        return None

    url = "http://127.0.0.1:8000/verify"
    cases = {
        "request": {
            "unwrapped": lambda: _drive(request("POST", url, json=None)),
            "off": lambda: _drive(wrapped_request("POST", url, json=None)),
            "on": lambda: _drive(wrapped_request("POST", url, json=None)),
            "dropped": lambda: _drive(wrapped_request("POST", url, json=None)),
        },
        "handler": {
            "unwrapped": lambda: _drive(verify(body)),
            "off": lambda: _drive(wrapped_verify(body)),
            "on": lambda: _drive(wrapped_verify(body)),
            "dropped": lambda: _drive(wrapped_verify(body)),
        },
        "ingress": {
            "unwrapped": lambda: _drive(app(scope, receive, send)),
            "off": lambda: _drive(middleware(scope, receive, send)),
            "on": lambda: _drive(middleware(scope, receive, send)),
            "off+metrics": lambda: _drive(middleware(scope, receive, send)),
            "on+metrics": lambda: _drive(middleware(scope, receive, send)),
            "dropped": lambda: _drive(middleware(dropped_scope, receive, send)),
            "dropped+metrics": lambda: _drive(middleware(dropped_scope, receive, send)),
            "root-dropped+metrics": lambda: _drive(middleware(root_scope, receive, send)),
            "dropped-first+metrics": lambda: _drive(middleware(next(first_scopes), receive, send)),
        },
        "hop": {
            "unwrapped": lambda: _drive(bare_hop(next(first_scopes), receive, send)),
            "dropped-first+metrics": lambda: _drive(hop(next(first_scopes), receive, send)),
            "root-dropped+metrics": lambda: _drive(hop(root_scope, receive, send)),
        },
        "answered": {
            "unwrapped": lambda: _drive(answered(answered_request, get_response_json, VERIFY_URL)),
            "on": lambda: _drive(answered(wrapped_answered, wrapped_parse, "http://127.0.0.1:8002/verify")),
            "on+outcome": lambda: _drive(answered(wrapped_answered, wrapped_parse, VERIFY_URL)),
        },
        "semaphore": {
            "unwrapped": lambda: acquire_release(bare_semaphore),
            "off+metrics": lambda: acquire_release(observed_semaphore),
        },
        "job_rollout": {
            "unwrapped": lambda: _drive(one_rollout()),
            "on": lambda: _drive(examples_job._awaited_in_job(one_rollout())),
        },
        "ray_submit": {
            "unwrapped": lambda: plain_function._remote(args=call_args, kwargs=call_kwargs, num_returns=1),
            "off": lambda: traced_function._remote(args=call_args, kwargs=call_kwargs, num_returns=1),
        },
    }
    enabled = {
        "unwrapped": groups.ALL_GROUPS,
        "off": frozenset(),
        "on": groups.ALL_GROUPS,
        "on+outcome": groups.ALL_GROUPS,
        "off+metrics": frozenset(),
        "on+metrics": groups.ALL_GROUPS,
        "dropped": groups.ALL_GROUPS,
        "dropped+metrics": groups.ALL_GROUPS,
        "root-dropped+metrics": groups.ALL_GROUPS,
        "dropped-first+metrics": groups.ALL_GROUPS,
    }
    return Bench(cases, enabled, dropped_context, provider, lambda: Discard.exported)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    number = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    bench = build()
    samples: dict = {site: {v: [] for v in variants} for site, variants in bench.cases.items()}
    for rep in range(reps):
        for site, variants in bench.cases.items():
            order = list(variants)
            order = order[rep % len(order) :] + order[: rep % len(order)]
            for variant in order:
                n = number if not variant.startswith("on") else max(1000, number // 10)
                fn = variants[variant]
                with bench.variant(variant):
                    fn()
                    seconds = timeit.timeit(fn, number=n, timer=time.thread_time)
                samples[site][variant].append(seconds / n * 1e9)
    bench.provider.force_flush()
    out = {"reps": reps, "number": number, "python": sys.version.split()[0], "sites": {}}
    for site, variants in samples.items():
        base = variants["unwrapped"]
        row = {}
        for variant, values in variants.items():
            row[variant] = {"ns_median": statistics.median(values), "ns_min": min(values), "ns_max": max(values)}
            if variant != "unwrapped":
                row[variant]["delta_ns_best"] = min(values) - min(base)
                deltas = [v - b for v, b in zip(values, base)]
                row[variant]["delta_ns_median"] = statistics.median(deltas)
                row[variant]["delta_ns_min"] = min(deltas)
                row[variant]["delta_ns_max"] = max(deltas)
        out["sites"][site] = row
    out["spans_exported"] = bench.spans_exported()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
