"""How a rollout ended, read from what Gym parses anyway: reward, tokens, identity, failure.

Gym's own telemetry leaves the outcome out; a trace without it says where a rollout's
time went, never how it ended.  Every value here is a scalar Gym already holds; nothing
is parsed a second time and no text is recorded (no prompt, completion, tool argument,
task or failure message):

* the answers Gym parses with ``server_utils.get_response_json`` (every release
  0.2-0.7: ``orjson.loads(await response.read())``): the collection driver's ``/run``
  answers, the agent's ``/verify`` and model answers.  Egress *holds* the CLIENT span of
  such a call (``hold``): it does not end when the body arrives but when Gym has parsed
  it (``get_response_json_advice`` reads the dict Gym made) or, when Gym never parses it,
  when the response is released; either way its end time is the body's arrival, as for
  any CLIENT span.  A body Gym never reads is not read here either.
* the return values of Gym's route handlers (``routes.py``'s ``gym.rollout`` and
  ``gym.verify`` seams, and the agent's SERVER span of ``/run``): pydantic objects whose
  attributes are read.
* the ``/run`` request's row, a dict, before Gym serializes it: its task and rollout
  (repeat) index, as Gym's collection driver assigned them.

Attributes (docs/spans-and-metrics.md): ``nemo.gym.reward``, ``nemo.gym.mask_sample``,
``nemo.gym.task.index``, ``nemo.gym.rollout.index``, ``nemo.gym.failure.stage``,
``error.type`` (a 0.7 failure record's kind), and the GenAI conventions' usage and
operation names (``gen_ai.usage.input_tokens`` ..., ``gen_ai.operation.name``).
"""

from __future__ import annotations

import json
import sys
import time
import weakref
from typing import Any

from opentelemetry.trace import Status, StatusCode

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import contract
from gym_autoinstr.setup import flush, logs

INVOKE_AGENT, EXECUTE_TOOL, CHAT = "invoke_agent", "execute_tool", "chat"

# Gym's row keys (global_config.TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME; 0.2.1+)
_TASK_KEY, _ROLLOUT_KEY = "_ng_task_index", "_ng_rollout_index"

# What a held call's answer is: a rollout (/run), a verification, a model call.
RUN, VERIFY, MODEL = "run", "verify", "model"

_AGENTS, _MODELS, _RESOURCES = "responses_api_agents", "responses_api_models", "resources_servers"
# Gym 0.7's environment servers take a rollout's /run and relay it to their agent
_RUNNERS = frozenset((_AGENTS, "environment_servers"))
_MODEL_ROUTES = frozenset(("/v1/responses", "/v1/chat/completions", "/v1/messages"))
# a resources server's routes that are Gym's plumbing, not tools the model calls
_NOT_TOOLS = frozenset(("/verify", "/seed_session", "/aggregate_metrics"))

_HELD = "_gym_autoinstr_outcome"  # the attribute a held call's response carries


def call_attributes(callee: str, kind: str | None, route: str, body: Any) -> tuple[str | None, dict[str, Any]]:
    """For a call to the fleet's server ``callee`` of ``kind`` at ``route``: what its answer
    says (RUN, VERIFY, MODEL, or None: nothing read from it) and the attributes its CLIENT
    span starts with (the GenAI operation, and a rollout's row identity from ``body``)."""
    if kind in _RUNNERS:
        if route != "/run":
            return None, {}
        attributes: dict[str, Any] = {attr.OPERATION: INVOKE_AGENT, attr.AGENT_NAME: callee}
        if type(body) is dict:
            _index(attributes, attr.TASK_INDEX, body.get(_TASK_KEY))
            _index(attributes, attr.ROLLOUT_INDEX, body.get(_ROLLOUT_KEY))
        backend_tags(attributes)
        return RUN, attributes
    if kind == _MODELS:
        if route not in _MODEL_ROUTES:
            return None, {}
        attributes = {attr.OPERATION: CHAT}
        model = body.get("model") if type(body) is dict else None
        if type(model) is str and model:
            attributes[attr.REQUEST_MODEL] = model
        return MODEL, attributes
    if kind == _RESOURCES:
        if route == "/verify":
            return VERIFY, {}
        if route not in _NOT_TOOLS:
            return None, {attr.OPERATION: EXECUTE_TOOL, attr.TOOL_NAME: route.lstrip("/")}
    return None, {}


def _index(attributes: dict[str, Any], key: str, value: Any) -> None:
    if type(value) is int:
        attributes[key] = value


# -- a backend's own dialect -------------------------------------------------------------

# MLflow (3.x) lists a trace with its root's inputs and outputs (``mlflow.spanInputs``,
# ``mlflow.spanOutputs``: its list's Input and Output columns) and its tags, which its OTLP
# receiver takes from the root's ``mlflow.traceTag.<key>`` attributes (strings), filterable:
# GYM_AUTOINSTR_TRACE_TAGS=mlflow.  No content: the numbers below only.
_MLFLOW_TAG = "mlflow.traceTag."
_TAGGED = (attr.REWARD, attr.MASK_SAMPLE, attr.TASK_INDEX, attr.ROLLOUT_INDEX, attr.ERROR_TYPE)
_SHOWN_IN = {attr.TASK_INDEX: "task", attr.ROLLOUT_INDEX: "repeat"}
_SHOWN_OUT = {attr.REWARD: "reward", attr.MASK_SAMPLE: "mask_sample", attr.ERROR_TYPE: "error.type"}
MLFLOW_TAGS = settings.TRACE_TAGS.read() == "mlflow"


def backend_tags(attributes: dict[str, Any]) -> None:
    """When MLflow's dialect is asked for: each outcome attribute in ``attributes`` again as
    a tag, and the rollout's identity and outcome as its inputs and outputs (on whatever
    span may be its root: MLflow reads them off the root alone)."""
    if MLFLOW_TAGS:
        for key in _TAGGED:
            value = attributes.get(key)
            if value is not None:
                attributes[_MLFLOW_TAG + key] = str(value).lower() if type(value) is bool else str(value)
        for shown, name in ((_SHOWN_IN, "mlflow.spanInputs"), (_SHOWN_OUT, "mlflow.spanOutputs")):
            values = {label: attributes[key] for key, label in shown.items() if key in attributes}
            if values:
                attributes[name] = json.dumps(values)


# -- reading Gym's values ----------------------------------------------------------------


_pydantic_model: Any = None  # pydantic.BaseModel, once a process has imported pydantic
_ABSENT = object()


def is_model(obj: Any) -> bool:
    """Whether ``obj`` is a pydantic model (Gym's request and response objects)."""
    global _pydantic_model
    base = _pydantic_model
    if base is None:
        module = sys.modules.get("pydantic")
        base = getattr(module, "BaseModel", None) if module is not None else None
        if base is None:
            return False
        _pydantic_model = base
    return isinstance(obj, base)


def field(obj: Any, key: str) -> Any:
    """``obj[key]`` of a dict, a pydantic model's field (declared or extra), else the
    attribute; None when absent.  (A model's missing attribute is an AttributeError raised
    inside pydantic's ``__getattr__``, about 1.8 us; its field dict answers a miss in 0.06.)"""
    if type(obj) is dict:
        return obj.get(key)
    if is_model(obj):
        value = obj.__dict__.get(key, _ABSENT)
        if value is not _ABSENT:
            return value
        extra = getattr(obj, "__pydantic_extra__", None)  # (unset on a model_construct()ed one)
        return extra.get(key) if extra else None
    return getattr(obj, key, None)


def _number(value: Any) -> float | None:
    if type(value) is float or type(value) is int:
        return float(value)
    return None


def verdict_attributes(verdict: Any, attributes: dict[str, Any]) -> None:
    """A verify response's reward and (0.7) mask_sample, from the dict or the object."""
    reward = _number(field(verdict, "reward"))
    if reward is not None:
        attributes[attr.REWARD] = reward
    masked = field(verdict, "mask_sample")
    if type(masked) is bool:
        attributes[attr.MASK_SAMPLE] = masked


_INPUT_KEYS, _OUTPUT_KEYS = ("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")
_CALL_USAGE = ((attr.INPUT_TOKENS, _INPUT_KEYS), (attr.OUTPUT_TOKENS, _OUTPUT_KEYS))
_ROLLOUT_USAGE = ((attr.ROLLOUT_INPUT_TOKENS, _INPUT_KEYS), (attr.ROLLOUT_OUTPUT_TOKENS, _OUTPUT_KEYS))


def usage_attributes(usage: Any, attributes: dict[str, Any], names: tuple = _CALL_USAGE) -> None:
    """Token counts in either dialect (Responses/Messages: input/output, Chat Completions:
    prompt/completion), as one model call's (``gen_ai.usage.*``) unless ``names`` says."""
    if usage is None:
        return
    for name, keys in names:
        for key in keys:
            value = field(usage, key)
            if type(value) is int:
                attributes[name] = value
                break


def rollout_attributes(answer: Any, attributes: dict[str, Any]) -> str | None:
    """What a ``/run`` answer says: reward, mask_sample, the rollout's total tokens (the
    agent's final response's usage); for Gym 0.7's episode answers the result's, or the
    failure's kind and stage.  Returns the failure kind when the answer is a failure."""
    result = field(answer, "result")
    failure = field(answer, "failure")
    if failure is not None and result is None and field(answer, "episode_id") is not None:
        kind = field(failure, "failure_kind")
        stage = field(failure, "stage")
        if type(stage) is str and stage:
            attributes[attr.FAILURE_STAGE] = stage
        return kind if type(kind) is str and kind else "episode_failure"
    if result is not None and field(answer, "episode_id") is not None:
        answer = result
    verdict_attributes(answer, attributes)
    usage_attributes(field(field(answer, "response"), "usage"), attributes, _ROLLOUT_USAGE)
    return None


def model_attributes(answer: Any, attributes: dict[str, Any]) -> None:
    model = field(answer, "model")
    if type(model) is str and model:
        attributes[attr.RESPONSE_MODEL] = model
    usage_attributes(field(answer, "usage"), attributes)


# -- the evaluation result ---------------------------------------------------------------

EVALUATION_EVENT = "gen_ai.evaluation.result"


def evaluation(span: Any, attributes: dict[str, Any], evaluator: str | None) -> None:
    """A rollout's reward as the GenAI evaluation result of its agent invocation ``span``
    (``gym.rollout``), named after the ``evaluator`` (the agent's resources server): an
    event through the Logs API, parented to the span, where this process exports logs;
    else an event on the span itself."""
    reward = attributes.get(attr.REWARD)
    if reward is None:
        return
    event: dict[str, Any] = {"gen_ai.evaluation.name": evaluator or "reward", "gen_ai.evaluation.score.value": reward}
    if attributes.get(attr.MASK_SAMPLE) is True:
        event["gen_ai.evaluation.score.label"] = "masked"
    if logs.exported():
        try:
            from opentelemetry import trace

            logs_api = contract.load(contract.LOGS_API)
            logs_api.get_logger("gym_autoinstr").emit(
                logs_api.LogRecord(
                    timestamp=time.time_ns(),
                    context=trace.set_span_in_context(span),
                    attributes=event,
                    event_name=EVALUATION_EVENT,
                )
            )
            return
        except Exception as error:  # an API without event records: the span event instead
            warn_once("outcome:evaluation", "the evaluation result goes on the span (%r)", error)
    span.add_event(EVALUATION_EVENT, event)


# -- held CLIENT spans -------------------------------------------------------------------


def _released(held: _Held) -> None:
    held.end()  # the response is gone before anyone parsed it


class _Held(weakref.ref):
    """A CLIENT span whose end waits for Gym to parse its answer: a weak reference to the
    response, whose release (nobody read it) ends the span, as the next flush does.  When
    Gym reads the body as bytes instead (0.7's legacy_agent relay passes them on), it ends
    as that read returns.  (A weak reference with a plain function for its callback: no
    ``weakref.finalize`` registry, no cycle for the collector; the response holds it.)"""

    __slots__ = ("span", "what", "arrived_ns", "on_failure", "parsing")

    def __new__(cls, response: Any, span: Any, what: str, on_failure: Any) -> _Held:
        return super().__new__(cls, response, _released)

    def __init__(self, response: Any, span: Any, what: str, on_failure: Any) -> None:
        super().__init__(response, _released)
        self.span = span
        self.what = what
        self.arrived_ns: int | None = None
        self.on_failure = on_failure
        self.parsing = False

    def arrived(self) -> None:
        if self.arrived_ns is None:
            self.arrived_ns = time.time_ns()

    async def read_body(self) -> bytes:
        """The response's ``read`` while held: aiohttp's own; a read outside Gym's parse
        (``get_response_json``) is the body taken as bytes, and the span ends with it."""
        response = self()
        body = await type(response).read(response)
        if not self.parsing:
            self.arrived()
            self.end()
        return body

    def read(self, answer: Any) -> None:
        attributes: dict[str, Any] = {}
        failure = None
        if self.what == RUN:
            failure = rollout_attributes(answer, attributes)
            if failure is not None:
                attributes[attr.ERROR_TYPE] = failure
            backend_tags(attributes)
        elif self.what == VERIFY:
            verdict_attributes(answer, attributes)
        else:
            model_attributes(answer, attributes)
        span = self.span
        if span is None:
            return
        if attributes:
            span.set_attributes(attributes)
        if failure is not None:
            span.set_status(Status(StatusCode.ERROR, failure))
            if self.on_failure is not None:
                self.on_failure()

    def end(self) -> None:
        """Once: the first caller (Gym's parse, a read, the release, a flush) ends the span."""
        span, self.span = self.span, None
        _OUTSTANDING.pop(id(self), None)
        if span is not None:
            span.end(end_time=self.arrived_ns)


# Held spans not ended yet (by id): a flush (a server's or the process's last) ends them
# first, so that a shutdown while a response is still held loses none (flush.before_flush).
_OUTSTANDING: dict[int, _Held] = {}


def end_outstanding() -> None:
    for _ in range(3):  # the dict may change under us (the loop's thread ends one meanwhile)
        try:
            held = list(_OUTSTANDING.values())
            break
        except RuntimeError:
            continue
    else:
        return
    for one in held:
        one.end()


flush.before_flush(end_outstanding)


def hold(span: Any, what: str, response: Any, on_failure: Any = None) -> bool:
    """Leave ``span``'s end to Gym's parse of ``response`` (``get_response_json``), or to the
    response's release when Gym never parses it; True when held (the caller ends nothing)."""
    try:
        content = response.content
        held = _Held(response, span, what, on_failure)
        setattr(response, _HELD, held)
        response.read = held.read_body
        _OUTSTANDING[id(held)] = held
        if content.is_eof():
            held.arrived()
        else:
            content.on_eof(held.arrived)
        return True
    except Exception:  # not aiohttp's response, or one without room: the span ends as any other
        return False


def get_response_json_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Gym's parse of a response it got from ``request``: when the response carries a held
    span, the parsed answer's scalars go on it and it ends.  Plain function: a response
    without one costs an attribute lookup and Gym's own coroutine."""
    response = args[0] if args else kwargs.get("response")
    held = getattr(response, _HELD, None)
    if held is None:
        return wrapped(*args, **kwargs)
    return _parse_and_end(wrapped, args, kwargs, held)


async def _parse_and_end(wrapped: Any, args: tuple, kwargs: dict, held: _Held) -> Any:
    held.parsing = True
    answer = await wrapped(*args, **kwargs)  # Gym's parse: its errors are Gym's
    try:
        held.read(answer)
        if held.arrived_ns is None:  # the body is in once parsed, whatever its eof callback said
            held.arrived_ns = time.time_ns()
        held.end()
    except Exception as error:
        warn_once("outcome:read", "reading a rollout's outcome failed (%r); Gym's answer is unaffected.", error)
    return answer
