"""Ingress: one SERVER span per request on every Gym server, and flushing at shutdown.

Gym builds each server's FastAPI app inside ``SimpleServer.run_webserver`` and hands it
to ``uvicorn.run``.  Starlette refuses new middleware once an app has started, so the
middleware goes in at the last moment we still hold the app unstarted:

* single process: when ``run_webserver`` calls ``uvicorn.run(app=<app>)``;
* ``num_workers > 1``: the main process passes ``"pkg.mod:app"`` instead; every worker
  re-imports the entrypoint, which re-enters ``run_webserver`` and gets the app back
  without serving it, so we instrument the returned app, and uvicorn serves it after.

The middleware is plain ASGI (no per-request ``http send/receive`` spans), switches off
FastAPI's built-in telemetry for the app (>= 0.142) so each request has exactly one
SERVER span, never records a query string, and leaves probes untraced.  It also sees
ASGI lifespan shutdown, which uvicorn runs on SIGINT and SIGTERM in the main process and
in every worker before re-raising the signal: the flush happens there, off the loop.
"""

from __future__ import annotations

import contextvars
import functools
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.advice import concurrency, startup
from gym_autoinstr.fastpath import context_ops, contract, w3c
from gym_autoinstr.setup import logs, wind_down
from gym_autoinstr.setup.flush import flush, flush_async
from gym_autoinstr.telemetry import groups, metrics, runtime, sampling
from gym_autoinstr.telemetry.spans import mark_error, mark_startup, tracer

# Set while `SimpleServer.run_webserver` runs, so that only Gym's own `uvicorn.run`
# call is touched (the head server and user apps use uvicorn too).
_in_run_webserver: contextvars.ContextVar[bool] = contextvars.ContextVar("gym_autoinstr_run_webserver", default=False)

APP_FLAG = "_gym_autoinstr_instrumented"


def excluded_paths() -> frozenset[str]:
    return frozenset(settings.EXCLUDED_PATHS.read())


def accept_inbound_baggage() -> bool:
    return settings.ACCEPT_BAGGAGE.read()


class _Propagation:
    """The inbound header names the global propagator reads, as ASGI (bytes) keys.

    ``baggage`` is left out unless ``GYM_AUTOINSTR_ACCEPT_BAGGAGE`` is set: whatever a
    caller from outside the fleet puts there would otherwise ride along on every hop,
    up to the model endpoint.  Baggage set inside the fleet still propagates.
    """

    textmap: object = None
    # A tuple, not a set: every header of every request is looked up in it, and a few
    # length-first bytes comparisons cost less than hashing each new header name.
    names: tuple[bytes, ...] = ()
    w3c = False  # the textmap is W3C's (w3c.w3c_default)

    @classmethod
    def header_names(cls) -> tuple[bytes, ...]:
        textmap = propagate.get_global_textmap()
        if textmap is not cls.textmap:
            names = {f.lower().encode("latin-1") for f in textmap.fields}
            if not accept_inbound_baggage():
                names.discard(b"baggage")
            cls.names = tuple(sorted(names))
            cls.w3c = w3c.w3c_default()
            cls.textmap = textmap
        return cls.names


def _caller(scope: dict) -> tuple[otel_context.Context, bool]:
    """The caller's context read from the request's headers, and whether the caller's span
    was dropped by the sampler (then this request records no span: telemetry/sampling.py).

    A dropped rollout's request runs under a span id of its own (W3C: the parent-id sent
    on is the current operation's), kept by the traceparent it came with: a lone
    traceparent seen before here (or this server's own dropped root's) skips parsing and
    the span checks; only the sampler is asked again."""
    textmap = propagate.get_global_textmap()  # header_names(), its answer kept
    names = _Propagation.names if textmap is _Propagation.textmap else _Propagation.header_names()
    raw = None
    for key, value in scope.get("headers") or ():
        if key in names:
            if key != b"traceparent" or raw is not None:  # tracestate, baggage, a repeat: the general way
                return _caller_from(_carrier(scope))
            raw = value
    if raw is None:
        return _NO_CALLER, False
    header = raw.decode("latin-1")
    # (header_names above looked at the global textmap: own_root holds while it is W3C's)
    if _Propagation.w3c:
        known = w3c.own_root(header)
        if known is not None:
            if sampling.dropping_sampler() is not None:
                return known, True
        else:  # the first request of a rollout here: read in the SDK's form, or the general way
            known = sampling.forwarded(header)
            if known is not None:
                return known, True
    return _caller_from({"traceparent": header})


# What ``_caller`` answers for a request that came with no context: a root starts here.
_NO_CALLER = otel_context.Context()


def _root(scope: dict) -> tuple[otel_context.Context, bool, int | None]:
    """A root, decided before anything is made for it: when the lean tracer's sampler
    drops it on its trace id alone, the context of the span it would have made, kept as
    a dropped caller's is (``sampling.dropped_root``), and True; otherwise the trace id it
    drew, for ``start_span`` to use (a root is decided once: deciding twice would keep r x r
    of them)."""
    decide = getattr(tracer(), "decide_root", None)
    if decide is None:  # the SDK's tracer: start_span decides
        return _NO_CALLER, False, None
    trace_id, span = decide(scope.get("method", "HTTP"))
    if span is None:
        return _NO_CALLER, False, trace_id
    context = context_ops.context_of_span(span)
    try:
        sampling.dropped_root(context, span)
    except Exception as error:
        warn_once("ingress:dropped-root", "ingress: keeping a dropped root failed (%r); its calls ask as usual.", error)
    return context, True, None


def _caller_from(carrier: dict) -> tuple[otel_context.Context, bool]:
    if not carrier:
        return otel_context.Context(), False
    parent = w3c.extract(carrier)
    if w3c.sampled_caller(parent):  # (dropped_span's answer for it, without the checks)
        return parent, False
    span = sampling.dropped_span(parent)
    if span is None:
        return parent, False
    return context_ops.with_span(sampling.own_operation(span), parent), True


def _carrier(scope: dict) -> dict[str, str]:
    names = _Propagation.header_names()
    carrier: dict[str, str] = {}
    for key, value in scope.get("headers") or ():
        if key in names:
            name = key.decode("latin-1")
            # Repeated headers are joined the way HTTP folds them (two traceparents
            # then make an invalid one: the request starts a new trace, as W3C asks).
            carrier[name] = f"{carrier[name]},{value.decode('latin-1')}" if name in carrier else value.decode("latin-1")
    # (a long tracestate is truncated by whole members where it is read, as W3C asks:
    # w3c.parse_tracestate, which reads no more than 16 KiB of it)
    return carrier


ROLLOUT_PREFIX = "/ng-rollout/"


def _route_template(scope: dict) -> str | None:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    if scope.get("path", "").startswith(ROLLOUT_PREFIX):
        return _route_behind_rollout_prefix(scope)
    return None


def _route_behind_rollout_prefix(scope: dict) -> str | None:
    """Gym 0.5+ strips ``/ng-rollout/<id>`` in a *copy* of the scope before routing, so
    the matched route never reaches ours: match the stripped path against the app's
    routes here (only for such requests, only once the request is done)."""
    rest = scope["path"][len(ROLLOUT_PREFIX) :].partition("/")[2]
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None)
    if not rest or not routes:
        return None
    inner = {**scope, "path": "/" + rest}
    for route in routes:
        try:
            match, _ = route.matches(inner)
        except Exception:
            continue
        if getattr(match, "name", "") == "FULL" and isinstance(getattr(route, "path", None), str):
            return route.path
    return None


class GymServerMiddleware:
    """ASGI middleware: SERVER span per HTTP request, flush at lifespan shutdown."""

    def __init__(self, app: Any, server_name: str = "", server_spans: bool = True) -> None:
        self.app = app
        self.server_name = server_name
        self.server_spans = server_spans
        self.excluded = excluded_paths()
        self.in_flight = metrics.in_flight_cell(server_name or "")

    def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        """The awaitable the server awaits for this scope.  A plain method: the request's
        own coroutine (``_traced``, ``_measured``, ``_dropped``) is the only frame of ours
        in the task's chain, which every resumption of the request walks through."""
        kind = scope.get("type")
        if kind == "http":
            if scope.get("path") not in self.excluded:
                if self.server_spans and groups.SERVER in groups.ENABLED:
                    return self._http(scope, receive, send)
                if metrics.LIVE:
                    return self._measured(scope, receive, send, None)
        elif kind == "lifespan":
            return self._lifespan(scope, receive, send)
        return self.app(scope, receive, send)

    def _http(self, scope: dict, receive: Any, send: Any) -> Any:
        try:
            parent, dropped = _caller(scope)
            root_id = None
            if parent is _NO_CALLER:
                parent, dropped, root_id = _root(scope)
            if dropped:
                # The caller's span was dropped by the sampler (telemetry/sampling.py): no
                # span, only its context, so that this server's own calls carry the
                # decision on (attached and detached inside the request's coroutine).
                if metrics.LIVE:
                    return self._measured(scope, receive, send, parent)
                return self._dropped(scope, receive, send, parent)
        except Exception as error:  # our half failed: serve the request untraced
            warn_once("ingress:start", "ingress tracing skipped (%r); requests are served as usual.", error)
            return self.app(scope, receive, send)
        return self._traced(scope, receive, send, parent, root_id)

    async def _lifespan(self, scope: dict, receive: Any, send: Any) -> None:
        runtime.watch_running_loop()
        logs.attach_to_uvicorn()
        await self.app(scope, receive, self._flushing_send(send))

    async def _dropped(self, scope: dict, receive: Any, send: Any, parent: otel_context.Context) -> None:
        previous = context_ops.current_context()
        context_ops.attach(parent)
        try:
            await self.app(scope, receive, send)
        finally:
            context_ops.leave(previous)

    async def _measured(self, scope: dict, receive: Any, send: Any, parent: otel_context.Context | None) -> None:
        """Metrics without a SERVER span: the ``server`` group off, or the caller's span
        dropped (then ``parent``, its context, is current while the request runs)."""
        previous = None
        if parent is not None:
            previous = context_ops.current_context()
            context_ops.attach(parent)
        in_flight = self.in_flight
        in_flight[0] += 1
        started = time.perf_counter()
        response = _ResponseStart(send, True)
        try:
            await self.app(scope, receive, response.forward)
        finally:
            in_flight[0] -= 1
            try:
                _record(scope, response, started)
            except Exception as error:
                warn_once("ingress:metrics", "request metrics skipped (%r); the response is unaffected.", error)
            if previous is not None:
                context_ops.leave(previous)

    def _flushing_send(self, send: Any) -> Any:
        async def lifespan_send(message: dict) -> None:
            if message.get("type") == "lifespan.startup.complete":
                startup.report_server_startup(self.server_name)
            if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                try:
                    await flush_async(reason="server shutdown")
                except Exception as error:
                    warn_once("lifespan-flush", "flush at server shutdown failed: %s", error)
            await send(message)

        return lifespan_send

    async def _traced(
        self, scope: dict, receive: Any, send: Any, parent: otel_context.Context, root_id: int | None = None
    ) -> None:
        try:
            span, previous = self._start(scope, parent, root_id)
        except Exception as error:  # our half failed: serve the request untraced
            warn_once("ingress:start", "ingress tracing skipped (%r); requests are served as usual.", error)
            await self.app(scope, receive, send)
            return
        # The caller's context (a Context holding a NonRecordingSpan) is not needed past the
        # start: let it go now rather than hold it for as long as the request runs.
        parent = None
        started = time.perf_counter()
        live = metrics.LIVE
        if live:
            self.in_flight[0] += 1
        response = _ResponseStart(send, live)
        failed = None  # the span's status when the app raised before a response started
        try:
            await self.app(scope, receive, response.forward)
        except Exception as error:
            try:
                mark_error(span, error)
            except Exception:
                pass
            failed = 500
            raise
        finally:
            if live:
                self.in_flight[0] -= 1
            try:
                facts = _route_facts(scope)  # once for the span and the metrics
                if type(span) is not NonRecordingSpan:  # (a root the sampler dropped: nothing to end)
                    status = response.status
                    self._finish(scope, span, failed if status is None else status, facts[0], response.sent_ns)
                if live:
                    _record(scope, response, started, facts)
            except Exception as error:
                warn_once(
                    "ingress:finish", "ingress tracing: ending a span failed (%r); the response is unaffected.", error
                )
            finally:
                context_ops.leave(previous)

    @staticmethod
    def _start(scope: dict, parent: otel_context.Context, root_id: int | None = None) -> tuple[Any, object]:
        method = scope.get("method", "HTTP")
        attributes: dict[str, Any] = {
            attr.HTTP_REQUEST_METHOD: method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        server = scope.get("server")
        if server:
            attributes[attr.SERVER_ADDRESS] = server[0]
            if server[1] is not None:
                attributes[attr.SERVER_PORT] = server[1]
        version = scope.get("http_version")
        if version:
            attributes["network.protocol.version"] = version
        start = tracer().start_span
        if root_id is not None:  # a root _root drew the trace id of (the lean tracer's)
            start = functools.partial(start, root_id=root_id)
        span = start(method, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        context = context_ops.with_span(span, parent)
        if type(span) is NonRecordingSpan:  # a root the sampler dropped: every call under it says so
            try:
                sampling.dropped_root(context, span)
            except Exception as error:
                warn_once(
                    "ingress:dropped-root",
                    "ingress: keeping a dropped root failed (%r); its calls ask as usual.",
                    error,
                )
        previous = context_ops.current_context()
        context_ops.attach(context)
        return span, previous

    @staticmethod
    def _finish(scope: dict, span: Any, status: int | None, route: str | None, end_ns: int | None = None) -> None:
        method = scope.get("method", "HTTP")
        if route:
            span.update_name(f"{method} {route}")
            span.set_attribute(attr.HTTP_ROUTE, route)
        if status:
            span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.end(end_ns)


# To anyone asking (a server choosing between ASGI 2 and 3, a wrapper), still an async callable.
concurrency.mark_coroutine_function(GymServerMiddleware.__call__)


class _ResponseStart:
    """``forward`` is the ``send`` the app is given: notes the status of
    ``http.response.start`` (and, ``timed``, when it passed) on its way to the server's
    own ``send``, whose awaitable it hands back (ASGI only asks that ``send(message)`` be
    awaitable: no coroutine of ours per message), and when the response's last byte
    passed (``sent_ns``, wall clock: the last body message with bytes, or the closing one
    when none had any): the SERVER span ends there, not when the app returns, so neither
    the app's own after-work (background tasks, middleware) nor ours makes a server look
    slower than the caller saw it.  (A response relayed by Starlette's ``BaseHTTPMiddleware``,
    as Gym's session middleware is, ends with an empty message that may follow its bytes by
    milliseconds on a busy loop: by then the caller, whose CLIENT span ends when the last
    byte is in, has its answer.)  Two objects per request (this one and
    the bound method) where a closure over the server's ``send`` and a list took five;
    they live as long as the request, long enough for Gym's servers under load to carry
    them into the older GC generations, whose collections walk them.  (A ``__call__`` of
    its own would be one object, at ~600 instructions more per message.)"""

    __slots__ = ("send", "timed", "status", "at", "sent_ns", "sent", "bytes_ns", "bytes_at")

    def __init__(self, send: Any, timed: bool) -> None:
        self.send = send
        self.timed = timed
        self.status: int | None = None
        self.at = 0.0
        self.sent_ns: int | None = None  # the response's last byte passed (wall clock)
        self.sent = 0.0  # the same, perf_counter (timed)
        self.bytes_ns = 0  # the last body message with bytes passed
        self.bytes_at = 0.0

    def forward(self, message: dict) -> Any:
        if self.status is None:
            if message.get("type") == "http.response.start":
                if self.timed:
                    self.at = time.perf_counter()
                self.status = message.get("status", 0)
        elif self.sent_ns is None:  # after the start only body messages come (trailers after the last)
            if message.get("body"):
                self.bytes_ns = time.time_ns()
                if self.timed:
                    self.bytes_at = time.perf_counter()
            if not message.get("more_body", False):
                self.sent_ns = self.bytes_ns or time.time_ns()
                if self.timed:
                    self.sent = self.bytes_at or time.perf_counter()
        return self.send(message)


def _record(scope: dict, response: _ResponseStart, started: float, facts: tuple[str | None, Any] | None = None) -> None:
    """Request metrics: duration by route and status, and the seam's own metric when the
    route is one ``routes.py`` marked (``/run``, ``/verify``, the model dialects).

    ``response`` saw the response start, or not (no response: an exception, counted as a
    failure); ``facts`` is ``_route_facts(scope)`` when the caller has it already."""
    ended = response.sent or time.perf_counter()  # the response out, or the app done (no response)
    template, seam = facts if facts is not None else _route_facts(scope)
    status = response.status
    metrics.record_request(
        scope.get("method", "HTTP"),
        template,
        status,
        ended - started,
        None if status is None else response.at - started,
        seam,
    )


# A matched route's template and seam metric, by the route object Starlette leaves in the
# scope: looked up once per route (the seam is an attribute most endpoints lack, and a
# missing attribute is an exception inside getattr).  Bounded; cleared when full.
_ROUTE_FACTS: dict[int, tuple[Any, str | None, Any]] = {}
_ROUTE_FACTS_MAX = 1024


def _route_facts(scope: dict) -> tuple[str | None, Any]:
    route = scope.get("route")
    if route is None:
        return _route_template(scope), None
    known = _ROUTE_FACTS.get(id(route))
    if known is None or known[0] is not route:  # (an entry keeps its route alive: ids stay unique)
        if len(_ROUTE_FACTS) >= _ROUTE_FACTS_MAX:
            _ROUTE_FACTS.clear()
        path = getattr(route, "path", None)
        known = _ROUTE_FACTS[id(route)] = (
            route,
            path if isinstance(path, str) else None,
            getattr(getattr(route, "endpoint", None), metrics.SEAM_ATTRIBUTE, None),
        )
    if known[1] is None:  # not a template (a route of another kind): as before
        return _route_template(scope), known[2]
    return known[1], known[2]


def _silence_fastapi_builtin_telemetry(app: Any) -> None:
    # FastAPI >= 0.142 emits its own SERVER span, metrics and exception logs whenever a
    # real provider is set; it reads one config dict per app at request time.
    native = getattr(app, "_native_telemetry", None)
    config = getattr(native, "config", None)
    if config is None:
        config = getattr(app, "_telemetry", None)
    if isinstance(config, dict):
        for key in ("tracing", "metrics", "logs", "operation_spans"):
            if key in config:
                config[key] = False


def instrument_app(app: Any, server_name: str = "") -> bool:
    """Add the Gym ingress to an unstarted Starlette/FastAPI app; True if it was added."""
    if getattr(app, APP_FLAG, False):
        return False
    if not hasattr(app, "add_middleware"):
        warn_once(
            f"ingress-not-app:{type(app).__name__}", "not instrumenting %r: not a Starlette app", type(app).__name__
        )
        return False
    if getattr(app, "middleware_stack", None) is not None:
        warn_once(
            "ingress-started",
            "server %s: its app had already started before gym-autoinstr could add ingress "
            "tracing; this server emits no SERVER spans.",
            server_name or "?",
        )
        return False
    from gym_autoinstr.advice import coexistence

    if coexistence.native_telemetry_live():
        logger.info("Gym's own telemetry is live in this process; gym-autoinstr leaves ingress to it")
        setattr(app, APP_FLAG, True)
        return False
    _silence_fastapi_builtin_telemetry(app)
    # Another OpenTelemetry FastAPI instrumentation already gives the app SERVER spans:
    # keep exactly one per request, but still flush at shutdown.
    contrib = bool(getattr(app, contract.INSTRUMENTED_APP, False))
    if contrib:
        warn_once(
            "ingress-contrib",
            "opentelemetry-instrumentation-fastapi already instruments %s; gym-autoinstr keeps its "
            "SERVER spans and adds none of its own. Set OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi "
            "to get gym-autoinstr's leaner ingress instead.",
            server_name or "this server",
        )
    app.add_middleware(GymServerMiddleware, server_name=server_name, server_spans=not contrib)
    setattr(app, APP_FLAG, True)
    return True


def _server_name_of(cls: Any) -> str:
    return settings.GYM_CONFIG_PATH.raw() or getattr(cls, "__name__", "")


def run_webserver_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``SimpleServer.run_webserver``: scope our ``uvicorn.run`` advice to it, and
    instrument the app it returns unserved (multi-worker workers)."""
    mark_startup("run_webserver")
    token = _in_run_webserver.set(True)
    try:
        app = wrapped(*args, **kwargs)
    finally:
        _in_run_webserver.reset(token)
    if app is not None:
        try:
            instrument_app(app, _server_name_of(instance))
        except Exception as error:
            warn_once("ingress-returned-app", "ingress tracing skipped for the returned app: %s", error)
    return app


def uvicorn_run_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``uvicorn.run`` when called from ``run_webserver``: instrument, serve, flush."""
    if not _in_run_webserver.get():
        return wrapped(*args, **kwargs)
    app = kwargs.get("app", args[0] if args else None)
    if app is not None and not isinstance(app, str):
        try:
            instrument_app(app, settings.GYM_CONFIG_PATH.raw() or "")
        except Exception as error:
            warn_once("ingress-app", "ingress tracing skipped: %s", error)
    try:
        return wrapped(*args, **kwargs)
    finally:
        flush(reason="uvicorn exit")
        wind_down.server_exited()


def server_limits_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``SimpleServer.set_ulimit``, which ``run_webserver`` calls on the server it
    built, before serving, in every release and in every uvicorn worker: observe the
    server's semaphores (``advice/concurrency.py``) where it will serve."""
    result = wrapped(*args, **kwargs)
    if metrics.LIVE:
        try:
            if _serves_here(instance):
                concurrency.watch_server(instance, settings.GYM_CONFIG_PATH.raw() or type(instance).__name__)
        except Exception as error:
            warn_once("ingress-concurrency", "Gym's concurrency limits are not observed: %r", error)
    return result


def _serves_here(server: Any) -> bool:
    """False in the main process of a ``num_workers > 1`` server: it only supervises the
    uvicorn workers, each of which builds (and watches) a server of its own."""
    workers = getattr(getattr(server, "config", None), "num_workers", None)
    if not isinstance(workers, int) or workers <= 1:
        return True
    return settings.GYM_FASTAPI_WORKER.raw() == "1"  # Gym's worker flag (0.2.0+)


def head_server_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``HeadServer.setup_webserver``: no FastAPI built-in spans for the head server."""
    app = wrapped(*args, **kwargs)
    try:
        _silence_fastapi_builtin_telemetry(app)
    except Exception as error:
        warn_once("head-server", "could not quiet the head server's FastAPI telemetry: %s", error)
    return app
