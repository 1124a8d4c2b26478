"""Egress: one CLIENT span around each logical ``nemo_gym.server_utils.request`` call.

``request`` is the only place Gym talks to another server (agent -> model, agent ->
resources, model -> the upstream OpenAI-compatible endpoint).  It retries internally on
disconnects and errors, so the span covers every attempt and records how many resends
there were (``http.request.resend_count``).  ``traceparent``/``tracestate`` are injected
once, inside the span, into a *copy* of the caller's headers.

Exactly one layer injects: when contrib's aiohttp-client instrumentation is loaded in the
process, the inner aiohttp call runs with HTTP instrumentation suppressed (the context
``suppress_http_instrumentation()`` sets), so it neither adds a second CLIENT span nor
re-parents the callee with its own span id; when it is not loaded, nothing is set.

A ``/run`` sent by Gym's collection driver while our ``gym.job`` is the current span is a
rollout: its CLIENT span starts a new trace linked to the job, and is counted on the job
(``advice/job.py`` decides; nothing changes for any other request).

``GYM_AUTOINSTR_CLIENT_SPANS=failures`` (opt-in; default ``all``), failures-only: a call
from inside a traced request to another Gym server of the fleet gets no CLIENT span (the
callee's SERVER span becomes the child of the caller's current span) unless it raises,
when one CLIENT span covering the whole call is recorded with ERROR.  Calls to anything
that is not a Gym server of the fleet, the collection driver's rollout ``/run`` calls and
calls made outside any traced request keep their CLIENT span.
"""

from __future__ import annotations

import enum
import functools
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.advice import coexistence, job, outcome, pool
from gym_autoinstr.advice.fleet_addresses import server_kind_for, server_name_for
from gym_autoinstr.fastpath import context_ops, w3c
from gym_autoinstr.fastpath.contract import SUPPRESS_HTTP_INSTRUMENTATION_KEY as _SUPPRESS_HTTP_INSTRUMENTATION_KEY
from gym_autoinstr.telemetry import groups, metrics, sampling
from gym_autoinstr.telemetry.redaction import redact_url
from gym_autoinstr.telemetry.spans import mark_error, tracer

CLIENT_SPANS_ENV = settings.CLIENT_SPANS.name


class ClientSpans(str, enum.Enum):
    """Which calls get a CLIENT span (``GYM_AUTOINSTR_CLIENT_SPANS``)."""

    ALL = "all"  # the default: every call
    FAILURES = "failures"  # failures-only: between Gym servers of the fleet, only a call that fails

    def __str__(self) -> str:
        return self.value


def client_spans_on_failure_only(environ: dict[str, str] | None = None) -> bool:
    """Whether ``GYM_AUTOINSTR_CLIENT_SPANS`` asks for the failures-only shape (``failures``)."""
    return ClientSpans(settings.CLIENT_SPANS.read(environ)) is ClientSpans.FAILURES


@dataclass(slots=True)
class _FailuresOnly:
    on: bool  # GYM_AUTOINSTR_CLIENT_SPANS=failures


# Read once, when Gym's process is instrumented.
_FAILURES_ONLY = _FailuresOnly(client_spans_on_failure_only())


def _copy_with(headers: Any, carrier: dict[str, str]) -> Any:
    """The caller's headers plus ``carrier``, in a new object of a compatible type."""
    if headers is None:
        return dict(carrier)
    if isinstance(headers, dict):
        merged = dict(headers)
        merged.update(carrier)
        return merged
    if isinstance(
        headers, (list, tuple)
    ):  # (name, value) pairs: httpx's multi_items(), as 0.7's sandbox transport sends
        names = {key.lower() for key in carrier}
        pairs = [pair for pair in headers if str(pair[0]).lower() not in names]
        pairs.extend(carrier.items())
        return pairs
    copy = getattr(headers, "copy", None)
    if callable(copy):  # multidict.CIMultiDict and friends
        merged = copy()
        for key, value in carrier.items():
            merged[key] = value
        return merged
    try:
        return {**dict(headers), **carrier}
    except Exception:
        return headers  # unknown shape: leave the request untouched rather than break it


def _bind(args: tuple, kwargs: dict) -> tuple[str, Any]:
    method = args[0] if len(args) > 0 else kwargs.get("method", "")
    url = args[1] if len(args) > 1 else kwargs.get("url", "")
    return str(method).upper(), url


def current_rollout_id() -> str | None:
    module = sys.modules.get("nemo_gym.rollout_correlation")
    getter = getattr(module, "current_rollout_id", None) if module is not None else None
    if getter is None:
        return None
    try:
        value = getter()
    except Exception:
        return None
    return str(value) if value else None


def request_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Plain function returning an awaitable: when the group is off, or the sampler dropped
    # the caller's span, the caller awaits Gym's own coroutine directly (no extra
    # coroutine frame per request).
    if groups.HTTP_CLIENT not in groups.ENABLED or coexistence.NATIVE_LIVE:
        return wrapped(*args, **kwargs)
    try:
        context = context_ops.current_context()
        dropped = sampling.dropped_call(context)
        if dropped is not None:
            # job.dispatching(), with the current span at hand: a /run sent under a
            # dropped gym.job is a rollout of its own, sampled anew (traced below)
            state = job.current_job()
            if state is None or state.span is not dropped[0]:
                # No span: the caller's own context injected, so that the next hop learns
                # the decision (formatted once per span context, kept with the context).
                carrier = dropped[1]
                if carrier is None:
                    return wrapped(*args, **_with_context(dropped[0], kwargs, context))
                headers = kwargs.get("headers")
                return wrapped(
                    *args, **{**kwargs, "headers": {**carrier} if headers is None else _copy_with(headers, carrier)}
                )
    except Exception as error:
        warn_once("egress:sampling", "egress: the sampling fast path failed (%r); tracing as usual.", error)
    if _FAILURES_ONLY.on:
        try:
            parent = _failures_only_parent(args, kwargs)
        except Exception as error:
            parent = None
            warn_once("egress:failures-only", "egress: the failures-only check failed (%r); tracing as usual.", error)
        if parent is not None:
            return _failures_only_request(wrapped, args, kwargs, parent)
    return _traced_request(wrapped, args, kwargs)


def _failures_only_parent(args: tuple, kwargs: dict) -> Any:
    """Under ``GYM_AUTOINSTR_CLIENT_SPANS=failures``: the current span, when this call goes
    to a Gym server of the fleet from inside a recording span and is not a rollout the
    collection driver dispatches; else None (the call gets its CLIENT span)."""
    span = trace.get_current_span()
    if not span.is_recording() or job.dispatching():
        return None
    _, url = _bind(args, kwargs)
    _, host, port = _redacted(url)
    if server_name_for(host, port) is None:
        return None
    return span


async def _failures_only_request(wrapped: Any, args: tuple, kwargs: dict, parent: Any) -> Any:
    """A call between Gym servers without a CLIENT span: the current span's context goes
    on the wire; only a call that raises gets its CLIENT span, after the fact."""
    started = time.time_ns()
    try:
        return await wrapped(*args, **_with_context(parent, kwargs))
    except Exception as error:
        _guarded("recording the failed call", _failed_call_span, args, kwargs, started, error)
        raise


def _failed_call_span(args: tuple, kwargs: dict, started: int, error: BaseException) -> None:
    span, _, _ = _start_client_span(args, kwargs, start_time=started)
    mark_error(span, error)
    span.end()


# Gym calls a handful of URLs over and over: parse each once.  Bounded (cleared when full:
# per-rollout paths on 0.5+ would otherwise grow it without end).
_REDACTED: dict[str, tuple[str, str | None, int | None]] = {}
_REDACTED_MAX = 512


def _redacted(url: Any) -> tuple[str, str | None, int | None]:
    if type(url) is not str:
        return redact_url(url)
    hit = _REDACTED.get(url)
    if hit is None:
        if len(_REDACTED) >= _REDACTED_MAX:
            _REDACTED.clear()
        hit = _REDACTED[url] = redact_url(url)
    return hit


def _rollout_id_in_path(url: str) -> str | None:
    # Gym 0.5+ addresses a rollout's calls as <server>/ng-rollout/<id>/<route> where the
    # caller does not enter rollout_context itself (the agent's /v1/responses).
    at = url.find("/ng-rollout/")
    if at < 0:
        return None
    return url[at + len("/ng-rollout/") :].partition("/")[0] or None


ROLLOUT_PREFIX_TEMPLATE = "/ng-rollout/{rollout_id}"


def _route(full: str) -> tuple[str, str] | None:
    """The route of a redacted URL to a Gym server and its ``url.template``: ``/verify``
    twice, or for 0.5+'s per-rollout paths ``/v1/responses`` and
    ``/ng-rollout/{rollout_id}/v1/responses`` (low-cardinality both, never the id)."""
    scheme_end = full.find("://")
    at = full.find("/", scheme_end + 3 if scheme_end >= 0 else 0)
    if at < 0:
        return None
    path = full[at:]
    if path.startswith("/ng-rollout/"):
        path = "/" + path[len("/ng-rollout/") :].partition("/")[2]
        return path, ROLLOUT_PREFIX_TEMPLATE + path
    return path, path


def _start_client_span(
    args: tuple, kwargs: dict, start_time: int | None = None
) -> tuple[Any, job.JobState | None, str | None]:
    """The call's CLIENT span, the job it dispatches a rollout for (or None), and what its
    answer says (``outcome.RUN``, ``VERIFY``, ``MODEL``: read when Gym parses it; or None)."""
    method, url = _bind(args, kwargs)
    full, host, port = _redacted(url)
    attributes: dict[str, Any] = {attr.HTTP_REQUEST_METHOD: method, attr.URL_FULL: full}
    if host:
        attributes[attr.SERVER_ADDRESS] = host
    if port is not None:
        attributes[attr.SERVER_PORT] = port
    # Named `{method} {url.template}` (HTTP semantic conventions) where the template is
    # known: a call to a server of this fleet, whose routes are Gym's own; any other URL
    # (the model server's upstream, say) may carry ids in its path: `{method}` alone.
    name = method
    answer = None
    callee = server_name_for(host, port)
    if callee:
        attributes[attr.DESTINATION] = callee
        routed = _route(full)
        if routed:
            route, template = routed
            attributes[attr.DESTINATION_ROUTE] = route
            attributes[attr.URL_TEMPLATE] = template
            name = f"{method} {template}"
            # the call in GenAI terms (an agent invocation, a tool, a model call), and
            # whether its answer says how a rollout went (advice/outcome.py)
            answer, genai = outcome.call_attributes(callee, server_kind_for(host, port), route, kwargs.get("json"))
            if genai:
                attributes.update(genai)
    rollout_id = current_rollout_id() or _rollout_id_in_path(full)
    if rollout_id:
        attributes[attr.ROLLOUT_ID] = rollout_id
    # A rollout dispatched by the collection driver under our gym.job: its own root trace,
    # linked to the job (advice/job.py).
    dispatch = job.rollout_dispatch(full)
    if dispatch is None:
        span = tracer().start_span(name, kind=SpanKind.CLIENT, attributes=attributes, start_time=start_time)
        return span, None, answer
    attributes[attr.JOB_ID] = dispatch.job_id
    options = job.rollout_span_options(dispatch)
    return tracer().start_span(name, kind=SpanKind.CLIENT, attributes=attributes, **options), dispatch, answer


def _guarded(step: str, action: Any, *args: Any) -> None:
    """Telemetry bookkeeping that must never turn into an error of Gym's request."""
    try:
        action(*args)
    except Exception as error:
        warn_once(f"egress:{step}", "egress tracing: %s failed (%r); the request is unaffected.", step, error)


def _suppress_http_key() -> object | None:
    """The context key that silences HTTP client instrumentations, when one that could
    see Gym's aiohttp call (contrib's aiohttp-client instrumentation) is loaded in this
    process; None when nothing could double-inject (then nothing is set)."""
    if "opentelemetry.instrumentation.aiohttp_client" not in sys.modules:
        return None
    return _SUPPRESS_HTTP_INSTRUMENTATION_KEY


async def _traced_request(wrapped: Any, args: tuple, kwargs: dict) -> Any:
    span = dispatch = answer = None
    try:
        span, dispatch, answer = _start_client_span(args, kwargs)
        if type(span) is not NonRecordingSpan:
            try:
                span.gym_attempts = 0  # Gym's session counts this call's attempts on its span (pool.count_attempts)
            except AttributeError:  # a span of another tracer, without room for it: resends not counted
                pass
        # One context for the call: our span current, and other HTTP client layers
        # silenced when one is loaded (one attach instead of two).
        suppress = _suppress_http_key()
        if suppress is None:
            entered = context_ops.enter(span)
        else:
            entered = context_ops.swap(otel_context.set_value(suppress, True, trace.set_span_in_context(span)))
    except Exception as error:
        # Our half failed before the request: make it untraced, exactly as Gym would.
        if span is not None:
            _guarded("ending the span", span.end)
        warn_once("egress:start", "egress tracing skipped (%r); the request is unaffected.", error)
        return await wrapped(*args, **kwargs)
    response = None
    try:
        call = wrapped(*args, **_with_context(span, kwargs))
        # Gym's coroutine holds its own copy of the arguments: no dict of them is kept
        # here for as long as the call runs.
        kwargs = None
        response = await call
    except BaseException as error:
        if isinstance(error, Exception):  # cancellation ends the span without ERROR
            _guarded("recording the error", mark_error, span, error)
            if dispatch is not None:
                _guarded("counting a failed rollout", job.rollout_failed, dispatch)
        raise
    else:
        try:
            status = response.status
            if type(status) is int:
                span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
                if dispatch is not None and status >= 400:
                    job.rollout_failed(dispatch)
        except Exception as error:
            warn_once(
                "egress:status", "egress tracing: recording the status failed (%r); the request is unaffected.", error
            )
        return response
    finally:
        try:
            attempts = getattr(span, "gym_attempts", None)
            if attempts is not None and attempts > 1:
                span.set_attribute("http.request.resend_count", attempts - 1)
            if response is None:
                span.end()
            elif answer is not None and type(span) is not NonRecordingSpan:
                # ends once Gym has parsed the answer, which says how the rollout went
                failed = None if dispatch is None else functools.partial(job.rollout_failed, dispatch)
                if not outcome.hold(span, answer, response, failed):
                    span.end()
            elif not _end_with_the_body(span, response):
                span.end()
        except Exception as error:
            warn_once("egress:end", "egress tracing: ending the span failed (%r); the request is unaffected.", error)
        _guarded("restoring the context", context_ops.leave, entered)


def _end_with_the_body(span: Any, response: Any) -> bool:
    """End ``span`` when the whole response has arrived, not when its headers did (what
    Gym's request returns on): the callee's SERVER span ends as its last body message is
    sent, so a CLIENT span that ended at the headers could end before it.  The body is
    neither read nor parsed here: aiohttp's payload says when its last byte came in
    (``on_eof``), whether Gym reads it or not.  True when the end is left to that (or, a
    payload that fails or is dropped before its end, to the response's release by Gym);
    False when the body is in already (end now)."""
    if type(span) is NonRecordingSpan:
        return False
    try:
        content = response.content
        if content.is_eof():
            return False
        # One end, whichever comes first: the payload's eof, or the response's release (a
        # payload that breaks clears its eof callbacks); a finalizer runs once.
        content.on_eof(weakref.finalize(response, span.end))
        return True
    except Exception:  # not aiohttp's response, or another aiohttp: end at the headers
        return False


def _with_context(span: Any, kwargs: dict, context: otel_context.Context | None = None) -> dict:
    """``kwargs`` with ``span``'s context (and ``context``'s baggage, default the current
    one) injected into a copy of the caller's headers (the caller's own ``kwargs`` if
    nothing was injected or injecting failed)."""
    try:
        carrier: dict[str, str] = {}
        w3c.inject_span(span, carrier, context)
        if carrier:
            headers = kwargs.get("headers")
            # no headers of the caller's (Gym's usual call): the carrier, ours, is the copy
            return {**kwargs, "headers": carrier if headers is None else _copy_with(headers, carrier)}
    except Exception as error:
        warn_once("egress:inject", "trace context not injected (%r); the request is unaffected.", error)
    return kwargs


# -- connection pool -------------------------------------------------------------------


def global_client_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``server_utils.set_global_aiohttp_client``: count the attempts of traced
    requests on Gym's one client session (``http.request.resend_count``), and time waits
    for a pool slot on it (``gym.http.connection_pool.queue_duration_ms``)."""
    session = wrapped(*args, **kwargs)
    try:
        pool.count_attempts(session)
    except Exception as error:
        warn_once("egress:attempts", "resends are not counted (%r); requests are unaffected.", error)
    if metrics.LIVE:
        try:
            pool.attach(session)
        except Exception as error:
            warn_once("egress:pool", "connection-pool metrics are off (%r); requests are unaffected.", error)
    return session
