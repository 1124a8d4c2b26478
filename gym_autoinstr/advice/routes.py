"""Route seams: an INTERNAL span around the handler of each Gym route that does the work.

| server kind (class MRO)  | route                                   | span                    | group      |
|--------------------------|-----------------------------------------|-------------------------|------------|
| ``responses_api_agents`` | ``/run``                                | ``gym.rollout``         | rollout    |
| ``responses_api_agents`` | ``/v1/responses``, ``/ng-rollout/...``  | ``gym.agent.responses`` | agent      |
| ``responses_api_models`` | ``/v1/chat/completions``                | ``gym.model.chat_completions`` | model_call |
| ``responses_api_models`` | ``/v1/responses``, ``/v1/messages`` | ``gym.model.responses``/``.messages`` | model_call |
| ``resources_servers``    | ``/verify``                             | ``gym.verify``          | verify     |

Why registration time.  Gym registers routes as ``app.post(path)(handler)`` inside
``setup_webserver`` with bound methods or closures (0.5+: the agent's ``/run`` closure
that enters ``rollout_context``; resources' ``judge_failsafe(self.verify)``).  FastAPI
keeps that object, so patching a handler method afterwards changes nothing, and
``setup_webserver`` itself is overridden by subclasses, some without ``super()``.  The
one call every registration goes through is FastAPI's ``APIRouter.add_api_route``;
there we replace the endpoint with a wrapper before FastAPI analyses it.

Why a stack walk.  ``add_api_route`` serves every FastAPI app in the process (the head
server, user apps).  A route belongs to a Gym server when it is registered while a
``setup_webserver`` of a Gym server runs: the nearest ``setup_webserver`` frame on the
stack, whose ``self`` has one of the three Gym base classes in its MRO.  This costs a
short frame walk per route registration, nothing per request, and needs neither
``run_webserver`` (in-process users and tests call ``setup_webserver`` directly) nor a
patch of each subclass.

What FastAPI sees is unchanged: the wrapper is ``functools.wraps`` of the handler
(FastAPI follows ``__wrapped__`` for the signature, the body model, OpenAPI and the
names it resolves), and it has the handler's own shape: coroutine function (a plain
function marked as one, handing back the handler's coroutine or the seam's), plain
function, or (async) generator.  A returned streaming response ends the span when its body
iterator finishes.  Each request checks the span group first; a disabled group costs
one frozenset test and a plain call.

Rollout id (0.5+): the span starts with ``current_rollout_id()`` (or the
``{rollout_id}`` path parameter; for ``/run``, the id derived from the body the way the
agent derives it).  The agent's ``/run`` closure enters ``rollout_context`` *inside* our
wrapper, so ``rollout_context_advice`` also tags the open seam span when that happens.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.advice import coexistence, concurrency, genai, outcome
from gym_autoinstr.advice.egress import current_rollout_id
from gym_autoinstr.advice.guard import guarded_advice
from gym_autoinstr.fastpath import context_ops
from gym_autoinstr.telemetry import groups, metrics, sampling
from gym_autoinstr.telemetry.spans import mark_error, tracer

RESOURCES = "resources_servers"
AGENT = "responses_api_agents"
MODEL = "responses_api_models"

# The base class that marks each server kind, the same (module, name) in 0.2.0 - 0.7.x.
_KIND_MARKERS: tuple[tuple[str, str, str], ...] = (
    ("nemo_gym.base_resources_server", "BaseResourcesServer", RESOURCES),
    ("nemo_gym.base_responses_api_agent", "BaseResponsesAPIAgent", AGENT),
    ("nemo_gym.base_responses_api_model", "BaseResponsesAPIModel", MODEL),
)

_ROLLOUT_PREFIX = "/ng-rollout/"
_MODEL_ROUTES = {
    "/v1/chat/completions": "gym.model.chat_completions",
    "/v1/responses": "gym.model.responses",
    "/v1/messages": "gym.model.messages",
}
_MAX_FRAMES = 40
_SEAM_FLAG = "_gym_autoinstr_seam"


@dataclass(frozen=True)
class Seam:
    span_name: str
    group: str
    server: Any  # the Gym server instance whose setup_webserver registered the route
    server_name: str
    model_call: bool = False
    reward: metrics.RewardMetric | None = None  # an agent's /run: gym.rollout.reward's attributes
    evaluator: str | None = None  # an agent's /run: its resources server (the evaluation's name)


def server_kind(cls: type) -> str | None:
    """``resources_servers``, ``responses_api_agents``, ``responses_api_models`` or None."""
    for klass in getattr(cls, "__mro__", ()):
        for module, name, kind in _KIND_MARKERS:
            if klass.__name__ == name and klass.__module__ == module:
                return kind
    return None


def seam_for(kind: str, path: str) -> tuple[str, str] | None:
    """(span name, group) for a POST route of a server of ``kind``, or None."""
    if kind == AGENT:
        if path == "/run":
            return "gym.rollout", groups.ROLLOUT
        if path == "/v1/responses" or (path.startswith(_ROLLOUT_PREFIX) and path.endswith("/v1/responses")):
            return "gym.agent.responses", groups.AGENT
    elif kind == MODEL:
        name = _MODEL_ROUTES.get(path)
        if name:
            return name, groups.MODEL_CALL
    elif kind == RESOURCES and path == "/verify":
        return "gym.verify", groups.VERIFY
    return None


def _gym_server_setting_up() -> Any:
    """The Gym server whose ``setup_webserver`` is registering routes right now, if any."""
    frame = sys._getframe(2)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == "setup_webserver":
            server = frame.f_locals.get("self")
            return server if server is not None and server_kind(type(server)) else None
        frame = frame.f_back
    return None


def _server_name(server: Any) -> str:
    name = settings.GYM_CONFIG_PATH.raw()
    if name:
        return name
    configured = getattr(getattr(server, "config", None), "name", None)
    return configured if isinstance(configured, str) else ""


@guarded_advice("routes:register", "route seam skipped: %r")
def add_api_route_advice(instance: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Around ``fastapi.routing.APIRouter.add_api_route``: wrap a Gym seam's endpoint (on
    an error, the route is registered unwrapped, never lost)."""
    return _with_seam_endpoint(args, kwargs)


def _with_seam_endpoint(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    path = args[0] if args else kwargs.get("path")
    endpoint = args[1] if len(args) > 1 else kwargs.get("endpoint")
    methods = kwargs.get("methods")
    if not isinstance(path, str) or endpoint is None or getattr(endpoint, _SEAM_FLAG, False):
        return args, kwargs
    if not methods or "POST" not in {str(m).upper() for m in methods}:
        return args, kwargs
    server = _gym_server_setting_up()
    if server is None:
        return args, kwargs
    found = seam_for(server_kind(type(server)) or "", path)
    if found is None:
        return args, kwargs
    span_name, group = found
    name = _server_name(server)
    evaluator = _resources_server_of(server) if group == groups.ROLLOUT else None
    reward = metrics.RewardMetric(name, evaluator) if group == groups.ROLLOUT else None
    model_call = span_name.startswith("gym.model.")
    seam = Seam(span_name, group, server, name, model_call=model_call, reward=reward, evaluator=evaluator)
    traced = wrap_handler(endpoint, seam)
    setattr(traced, metrics.SEAM_ATTRIBUTE, seam_metric(span_name, seam.server_name))
    if len(args) > 1:
        args = (args[0], traced, *args[2:])
    else:
        kwargs = {**kwargs, "endpoint": traced}
    return args, kwargs


def _resources_server_of(agent: Any) -> str | None:
    """The resources server an agent's config names (``resources_server.name``), if any."""
    name = getattr(getattr(getattr(agent, "config", None), "resources_server", None), "name", None)
    return name if isinstance(name, str) and name else None


_SEAM_METRIC_KINDS = {"gym.rollout": "rollout", "gym.verify": "verify"}


def seam_metric(span_name: str, server_name: str) -> metrics.SeamMetric | None:
    """What the ingress records for requests to this seam (``gym.rollout.duration_ms``, ...)."""
    if span_name.startswith("gym.model."):
        return metrics.SeamMetric("model", server_name, span_name[len("gym.model.") :])
    kind = _SEAM_METRIC_KINDS.get(span_name)
    return metrics.SeamMetric(kind, server_name) if kind else None


# -- the per-request wrappers ---------------------------------------------------------


def _start(seam: Seam, args: tuple, kwargs: dict) -> trace.Span | None:
    """The seam's span, or None: the sampler dropped the request's span (the handler then
    runs as it is), or starting it failed."""
    try:
        if sampling.dropped_span() is not None:
            return None
        attributes: dict[str, Any] = {attr.SERVER_NAME: seam.server_name}
        rollout_id = current_rollout_id()
        if not rollout_id:
            rollout_id = _rollout_id_from_path(args, kwargs)
        if not rollout_id and seam.group == groups.ROLLOUT:
            rollout_id = _rollout_id_from_run_body(args, kwargs)
        if rollout_id:
            attributes[attr.ROLLOUT_ID] = rollout_id
        if seam.model_call:
            attributes.update(genai.request_attributes(args, kwargs, seam.server))
        elif seam.group == groups.ROLLOUT:
            attributes[attr.OPERATION] = outcome.INVOKE_AGENT
            attributes[attr.AGENT_NAME] = seam.server_name
            _row_identity(args, kwargs, attributes)
        return tracer().start_span(seam.span_name, kind=SpanKind.INTERNAL, attributes=attributes)
    except Exception as error:
        warn_once(f"routes:start:{seam.span_name}", "%s span skipped: %r", seam.span_name, error)
        return None


def _rollout_id_from_path(args: tuple, kwargs: dict) -> str | None:
    """``{rollout_id}`` of an ``/ng-rollout/{rollout_id}/...`` route: a declared parameter,
    or the path parameters of the handler's ``Request``."""
    value = kwargs.get("rollout_id")
    if not isinstance(value, str):
        value = None
        for candidate in (*kwargs.values(), *args):
            path_params = outcome.field(candidate, "path_params")  # (a body model: None, no raise)
            if isinstance(path_params, dict):
                value = path_params.get("rollout_id")
                break
    return value if isinstance(value, str) and value else None


def _run_body(args: tuple, kwargs: dict) -> Any:
    """The ``/run`` handler's body model: its ``body`` argument, else the first pydantic one."""
    body = kwargs.get("body")
    return body if body is not None else next((a for a in args if outcome.is_model(a)), None)


def _rollout_id_from_run_body(args: tuple, kwargs: dict) -> str | None:
    """The id Gym's rollout collection stamps into a ``/run`` body (task and rollout index).

    Gym itself enters ``rollout_context`` with it only when model-call capture is on;
    the id is a pair of indices, content-free, so ``gym.rollout`` carries it either way.
    """
    module = sys.modules.get("nemo_gym.rollout_correlation")
    derive = getattr(module, "maybe_rollout_id_from_run_body", None)
    if derive is None:
        return None
    body = _run_body(args, kwargs)
    try:
        rollout_id = derive(body)
    except Exception:
        return None
    return str(rollout_id) if rollout_id else None


def _row_identity(args: tuple, kwargs: dict, attributes: dict[str, Any]) -> None:
    """The task and rollout index Gym's collection driver put in a ``/run`` body (extra
    fields of its pydantic model)."""
    extra = getattr(_run_body(args, kwargs), "__pydantic_extra__", None)
    if type(extra) is dict:
        found = outcome.call_attributes("", AGENT, "/run", extra)[1]  # read as egress reads the row
        for key in (attr.TASK_INDEX, attr.ROLLOUT_INDEX):
            if key in found:
                attributes[key] = found[key]


def _fail(span: trace.Span, error: BaseException) -> None:
    # Cancellation and exits are not errors of the work: end without ERROR.
    if isinstance(error, Exception):
        mark_error(span, error)
    span.end()


def _finish(span: trace.Span, seam: Seam, result: Any) -> Any:
    """Annotate and end the span, or hand it to a streaming body to end."""
    try:
        if seam.model_call:
            span.set_attributes(genai.response_attributes(result))
        elif seam.group == groups.ROLLOUT or seam.group == groups.VERIFY:
            _verdict(span, seam, result)
        # a streaming response's body iterator (a pydantic answer, the usual, has none)
        body = outcome.field(result, "body_iterator")
        if body is not None and hasattr(body, "__aiter__"):
            result.body_iterator = _ending_stream(body, span)
            return result
    except Exception as error:
        warn_once(f"routes:finish:{seam.span_name}", "%s: response not annotated: %r", seam.span_name, error)
    span.end()
    return result


def _verdict(span: trace.Span, seam: Seam, result: Any) -> None:
    """The reward (and 0.7's mask_sample) a ``/verify`` or ``/run`` handler returned, on its
    seam; for ``/run`` also the rollout's total tokens, on the seam and, when the request's
    SERVER span is the rollout's root (its caller is not traced), on that span too.  (A
    traced caller's CLIENT span gets them from the answer: advice/outcome.py.)"""
    attributes: dict[str, Any] = {}
    if seam.group == groups.VERIFY:
        outcome.verdict_attributes(result, attributes)
    else:
        outcome.rollout_attributes(result, attributes)
        _record_reward(seam, attributes)
        outcome.evaluation(span, attributes, seam.evaluator)
        server_span = trace.get_current_span()  # the seam's context is left: the SERVER span
        if (
            attributes
            and server_span is not span
            and getattr(server_span, "parent", True) is None  # the trace's root
            and server_span.is_recording()
        ):
            # the rollout's root when its caller is not traced: what a GenAI UI lists it as
            root = {attr.OPERATION: outcome.INVOKE_AGENT, attr.AGENT_NAME: seam.server_name, **attributes}
            outcome.backend_tags(root)
            server_span.set_attributes(root)
    if attributes:
        span.set_attributes(attributes)


def _record_reward(seam: Seam, attributes: dict[str, Any]) -> None:
    reward = attributes.get(attr.REWARD)
    if reward is not None and seam.reward is not None and metrics.LIVE:
        metrics.record_reward(reward, attributes.get(attr.MASK_SAMPLE) is True, seam.reward)


async def _rewarded(running: Any, seam: Seam) -> Any:
    """A rollout whose seam records no span (its group off, its request not sampled): its
    reward still goes to ``gym.rollout.reward``."""
    result = await running
    try:
        attributes: dict[str, Any] = {}
        outcome.rollout_attributes(result, attributes)
        _record_reward(seam, attributes)
    except Exception as error:
        warn_once("routes:reward", "a rollout's reward not recorded: %r", error)
    return result


async def _ending_stream(body: Any, span: trace.Span) -> Any:
    try:
        async for chunk in body:
            yield chunk
    except Exception as error:
        mark_error(span, error)
        raise
    finally:
        span.end()


def _enabled(seam: Seam) -> bool:
    return seam.group in groups.ENABLED and not coexistence.NATIVE_LIVE


def _is(kind_test: Callable[[Any], bool], handler: Any) -> bool:
    # The same test FastAPI applies: the handler, or what it wraps.
    return kind_test(handler) or kind_test(inspect.unwrap(handler))


def wrap_handler(handler: Callable, seam: Seam) -> Callable:
    """A handler of the same shape as ``handler`` that runs it inside ``seam``'s span."""
    if _is(inspect.isasyncgenfunction, handler):
        wrapper = _async_generator_wrapper(handler, seam)
    elif _is(inspect.isgeneratorfunction, handler):
        wrapper = _generator_wrapper(handler, seam)
    elif _is(inspect.iscoroutinefunction, handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (its __call__ method, not whether it is callable)
    ):
        wrapper = _coroutine_wrapper(handler, seam)
    else:
        wrapper = _function_wrapper(handler, seam)
    setattr(wrapper, _SEAM_FLAG, True)
    return wrapper


def _dispatching(handler: Callable, seam: Seam, in_seam: Callable) -> Callable:
    """A wrapper that calls ``handler`` as it is when the seam records nothing for this
    request (its group off, or the request's span dropped by the sampler), and else hands
    it to ``in_seam``, which runs it inside the seam's span."""

    rewarded = seam.reward is not None and in_seam is _in_seam  # an agent's /run (a coroutine)

    @functools.wraps(handler)
    def seam_handler(*args: Any, **kwargs: Any) -> Any:
        span = _start(seam, args, kwargs) if _enabled(seam) else None
        if span is not None:
            return in_seam(handler, seam, span, args, kwargs)
        if rewarded and metrics.LIVE:
            return _rewarded(handler(*args, **kwargs), seam)
        return handler(*args, **kwargs)

    return seam_handler


def _coroutine_wrapper(handler: Callable, seam: Seam) -> Callable:
    """A plain function marked as a coroutine function (FastAPI awaits what it returns):
    the handler's own coroutine when the seam records nothing, so that no coroutine of
    ours joins the request's chain, which every resumption of the request walks through;
    else ``_in_seam``'s."""
    wrapper = _dispatching(handler, seam, _in_seam)
    concurrency.mark_coroutine_function(wrapper)
    return wrapper


def _function_wrapper(handler: Callable, seam: Seam) -> Callable:
    return _dispatching(handler, seam, _in_seam_now)


# The two below are one body, awaiting the handler or calling it.


async def _in_seam(handler: Callable, seam: Seam, span: trace.Span, args: tuple, kwargs: dict) -> Any:
    entered = context_ops.enter_seam(span)
    try:
        try:
            result = await handler(*args, **kwargs)
        finally:
            context_ops.leave(entered)
    except BaseException as error:
        _fail(span, error)
        raise
    return _finish(span, seam, result)


def _in_seam_now(handler: Callable, seam: Seam, span: trace.Span, args: tuple, kwargs: dict) -> Any:
    entered = context_ops.enter_seam(span)
    try:
        try:
            result = handler(*args, **kwargs)
        finally:
            context_ops.leave(entered)
    except BaseException as error:
        _fail(span, error)
        raise
    return _finish(span, seam, result)


def _async_generator_wrapper(handler: Callable, seam: Seam) -> Callable:
    @functools.wraps(handler)
    async def seam_handler(*args: Any, **kwargs: Any) -> Any:
        if not _enabled(seam):
            async for item in handler(*args, **kwargs):
                yield item
            return
        span = _start(seam, args, kwargs)
        try:
            async for item in handler(*args, **kwargs):
                yield item
        except BaseException as error:
            if span is not None:
                _fail(span, error)
            raise
        if span is not None:
            span.end()

    return seam_handler


def _generator_wrapper(handler: Callable, seam: Seam) -> Callable:
    @functools.wraps(handler)
    def seam_handler(*args: Any, **kwargs: Any) -> Any:
        if not _enabled(seam):
            yield from handler(*args, **kwargs)
            return
        span = _start(seam, args, kwargs)
        try:
            yield from handler(*args, **kwargs)
        except BaseException as error:
            if span is not None:
                _fail(span, error)
            raise
        if span is not None:
            span.end()

    return seam_handler


# -- rollout id -----------------------------------------------------------------------


def rollout_context_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``nemo_gym.rollout_correlation.rollout_context``: tag the open seam span."""
    span = context_ops.current_context().get(context_ops.SEAM_KEY)
    if span is not None:
        try:
            rollout_id = args[0] if args else kwargs.get("rollout_id")
            if rollout_id:
                span.set_attribute(attr.ROLLOUT_ID, str(rollout_id))
        except Exception as error:
            warn_once("routes:rollout-id", "rollout id not recorded: %r", error)
    return wrapped(*args, **kwargs)
