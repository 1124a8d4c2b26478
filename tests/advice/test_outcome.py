"""A rollout's outcome read from what Gym parses, on Gym's real ``server_utils.request`` and
``get_response_json`` against a real local HTTP server (advice/outcome.py)."""

from __future__ import annotations

import gc
import json
import time

import pytest
from fastapi import FastAPI
from opentelemetry.trace import SpanKind, StatusCode

from gym_autoinstr.advice import outcome
from tests.harness.servers import run_async, serve

pytest.importorskip("nemo_gym")

RUN_ANSWER = {
    "reward": 0.5,
    "mask_sample": True,
    "response": {"model": "policy", "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}},
}
FAILED_EPISODE = {
    "episode_id": {"rollout_id": "3-1", "attempt": 0},
    "task_id": "t3",
    "failure": {
        "failure_reason": "SECRET-REASON in the task",
        "terminal": True,
        "failure_kind": "agent_run_error",
        "stage": "agent",
    },
}
EPISODE_RESULT = {
    "episode_id": {"rollout_id": "2-0", "attempt": 0},
    "task_id": "t2",
    "result": {"reward": 1, "response": {}},
}


def _fleet_app() -> FastAPI:
    app = FastAPI()
    app.state.answers = {}

    @app.post("/run")
    async def run():
        return app.state.answers.get("/run", RUN_ANSWER)

    @app.post("/verify")
    async def verify():
        return {"reward": 0.0, "mask_sample": False}

    @app.post("/get_weather")
    async def get_weather():
        return {"city": "x", "weather_description": "cold"}

    @app.post("/v1/chat/completions")
    async def chat():
        return {"model": "served-model", "usage": {"prompt_tokens": 5, "completion_tokens": 2}}

    return app


@pytest.fixture
def fleet(monkeypatch):
    """A served app that Gym's config (as fleet_addresses reads it) names as each kind of server."""
    from gym_autoinstr.advice import fleet_addresses

    names: dict[str, str] = {}
    kinds: dict[str, str] = {}
    monkeypatch.setattr(fleet_addresses._state, "names", names)
    monkeypatch.setattr(fleet_addresses._state, "kinds", kinds)
    app = _fleet_app()
    with serve(app) as base:

        def as_server(name: str, kind: str) -> str:
            names[base[len("http://") :]] = name
            kinds[base[len("http://") :]] = kind
            return base

        yield app, as_server


def _parsed(url: str, json: dict, parse: bool = True):
    """Gym's request and, when ``parse``, Gym's own parse of its answer."""
    from nemo_gym import server_utils

    async def go():
        response = await server_utils.request("POST", url, json=json)
        if parse:
            return await server_utils.get_response_json(response)
        return response

    return run_async(go())


def _client(spans):
    return [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]


def _assert_has(span, expected: dict) -> None:
    assert {key: span.attributes.get(key) for key in expected} == expected


def _count_parses(monkeypatch) -> list:
    """Every JSON decode in Gym's server_utils and in ours (orjson and json)."""
    import json

    import orjson
    from nemo_gym import server_utils

    calls = []
    real_orjson, real_json = orjson.loads, json.loads
    monkeypatch.setattr(server_utils.orjson, "loads", lambda *a, **k: calls.append("orjson") or real_orjson(*a, **k))
    monkeypatch.setattr(json, "loads", lambda *a, **k: calls.append("json") or real_json(*a, **k))
    return calls


def test_a_run_answer_gives_its_client_span_reward_tokens_and_the_rows_identity(
    instrumented, spans, fleet, monkeypatch
):
    _, as_server = fleet
    base = as_server("my_agent", "responses_api_agents")
    parses = _count_parses(monkeypatch)
    before = time.time_ns()
    answer = _parsed(f"{base}/run", {"_ng_task_index": 3, "_ng_rollout_index": 1, "responses_create_params": {}})
    parsed_at = time.time_ns()
    assert answer == RUN_ANSWER and parses == ["orjson"]  # Gym's one parse, none of ours
    (span,) = _client(spans)
    _assert_has(
        span,
        {
            "nemo.gym.reward": 0.5,
            "nemo.gym.mask_sample": True,
            "nemo.gym.rollout.usage.input_tokens": 7,
            "nemo.gym.rollout.usage.output_tokens": 3,
            "nemo.gym.task.index": 3,
            "nemo.gym.rollout.index": 1,
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "my_agent",
        },
    )
    assert isinstance(span.attributes["nemo.gym.reward"], float)
    assert before <= span.start_time <= span.end_time <= parsed_at  # ended at the body's arrival
    assert span.status.status_code is StatusCode.UNSET


def test_answers_of_other_shapes_and_rows_without_indexes(instrumented, spans, fleet):
    app, as_server = fleet
    base = as_server("env", "environment_servers")  # 0.7's environment server relays /run
    app.state.answers["/run"] = EPISODE_RESULT
    _parsed(f"{base}/run", {"_ng_task_index": True, "task": {}})  # a bool is no index
    (span,) = _client(spans)
    assert span.attributes["nemo.gym.reward"] == 1.0
    assert "nemo.gym.task.index" not in span.attributes and "nemo.gym.rollout.index" not in span.attributes
    assert "nemo.gym.rollout.usage.input_tokens" not in span.attributes  # no usage in the answer: none invented
    assert "gen_ai.usage.input_tokens" not in span.attributes  # a rollout's total is never a call's


def test_a_failed_episode_says_its_kind_and_stage_never_its_reason(instrumented, spans, fleet):
    app, as_server = fleet
    base = as_server("env", "environment_servers")
    app.state.answers["/run"] = FAILED_EPISODE
    _parsed(f"{base}/run", {})
    (span,) = _client(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "agent_run_error"
    assert span.attributes["nemo.gym.failure.stage"] == "agent"
    assert "nemo.gym.reward" not in span.attributes
    recorded = [str(v) for v in span.attributes.values()] + [span.status.description or ""]
    assert not any("SECRET" in value for value in recorded)


def test_mlflow_trace_tags_repeat_the_roots_outcome_as_strings(instrumented, spans, fleet, monkeypatch):
    """GYM_AUTOINSTR_TRACE_TAGS=mlflow: what MLflow's receiver makes trace tags, on the
    rollout's root; nothing of the kind without it, nor on a call that is no rollout."""
    app, as_server = fleet
    base = as_server("my_agent", "responses_api_agents")
    _parsed(f"{base}/run", {"_ng_task_index": 3, "_ng_rollout_index": 1})
    _parsed(f"{base}/verify", {})
    monkeypatch.setattr(outcome, "MLFLOW_TAGS", True)
    _parsed(f"{base}/run", {"_ng_task_index": 4, "_ng_rollout_index": 0})
    app.state.answers["/run"] = FAILED_EPISODE
    _parsed(f"{base}/run", {"_ng_task_index": 5})
    plain, verify, tagged, failed = _client(spans)
    for span in (plain, verify):
        assert not [key for key in span.attributes if key.startswith("mlflow.")], span.attributes
    _assert_has(
        tagged,
        {
            "mlflow.traceTag.nemo.gym.reward": "0.5",
            "mlflow.traceTag.nemo.gym.mask_sample": "true",
            "mlflow.traceTag.nemo.gym.task.index": "4",
            "mlflow.traceTag.nemo.gym.rollout.index": "0",
            "nemo.gym.reward": 0.5,
        },
    )
    # the list's Input and Output columns: the row's identity and the outcome, numbers only
    assert json.loads(tagged.attributes["mlflow.spanInputs"]) == {"task": 4, "repeat": 0}
    assert json.loads(tagged.attributes["mlflow.spanOutputs"]) == {"reward": 0.5, "mask_sample": True}
    _assert_has(failed, {"mlflow.traceTag.error.type": "agent_run_error", "mlflow.traceTag.nemo.gym.task.index": "5"})
    assert json.loads(failed.attributes["mlflow.spanOutputs"]) == {"error.type": "agent_run_error"}
    assert "mlflow.traceTag.nemo.gym.reward" not in failed.attributes


def test_model_tool_and_verify_calls_in_genai_terms(instrumented, spans, fleet):
    _, as_server = fleet
    base = as_server("policy_model", "responses_api_models")
    _parsed(f"{base}/v1/chat/completions", {"model": "asked-model", "messages": [{"role": "user", "content": "hi"}]})
    base = as_server("my_resources", "resources_servers")
    _parsed(f"{base}/get_weather", {"city": "x"})
    _parsed(f"{base}/verify", {"response": {}})
    chat, tool, verify = _client(spans)
    _assert_has(
        chat,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "asked-model",
            "gen_ai.response.model": "served-model",
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.output_tokens": 2,
        },
    )
    _assert_has(tool, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather"})
    assert "nemo.gym.reward" not in tool.attributes
    assert verify.attributes["nemo.gym.reward"] == 0.0 and verify.attributes["nemo.gym.mask_sample"] is False
    assert "gen_ai.operation.name" not in verify.attributes
    for span in (chat, tool, verify):
        assert "hi" not in [str(v) for v in span.attributes.values()]


def test_a_body_gym_never_parses_is_not_read_and_its_span_ends_at_release(instrumented, spans, fleet):
    _, as_server = fleet
    base = as_server("my_agent", "responses_api_agents")
    response = _parsed(f"{base}/run", {"_ng_task_index": 0}, parse=False)
    assert not _client(spans)  # held, waiting for a parse that never comes
    assert response._body is None  # nobody read the body
    del response
    gc.collect()
    (span,) = _client(spans)
    assert "nemo.gym.reward" not in span.attributes
    assert span.attributes["nemo.gym.task.index"] == 0  # what the request said is kept


def test_unsampled_and_untraced_calls_hold_nothing(instrumented, spans, fleet, monkeypatch):
    """Outside the fleet (no known server) nothing is held or read: Gym's parse runs as is."""
    _, _ = fleet
    app = _fleet_app()
    with serve(app) as base:
        assert _parsed(f"{base}/run", {}) == RUN_ANSWER
    (span,) = _client(spans)
    assert "nemo.gym.reward" not in span.attributes and "gen_ai.operation.name" not in span.attributes


@pytest.mark.parametrize(
    "kind, route, expected",
    [
        ("responses_api_agents", "/run", outcome.RUN),
        ("environment_servers", "/run", outcome.RUN),
        ("responses_api_agents", "/v1/responses", None),  # the agent's own loop: not a rollout
        ("responses_api_models", "/v1/responses", outcome.MODEL),
        ("responses_api_models", "/v1/messages", outcome.MODEL),
        ("responses_api_models", "/health", None),
        ("resources_servers", "/verify", outcome.VERIFY),
        ("resources_servers", "/seed_session", None),
        ("resources_servers", "/aggregate_metrics", None),
        (None, "/run", None),
    ],
)
def test_which_answers_are_read(kind, route, expected):
    assert outcome.call_attributes("s", kind, route, {})[0] == expected


def test_no_openinference_attribute_phoenix_reads_the_genai_ones(instrumented, spans, fleet):
    _, as_server = fleet
    base = as_server("policy_model", "responses_api_models")
    _parsed(f"{base}/v1/chat/completions", {"model": "asked-model"})
    (chat,) = _client(spans)
    assert not [key for key in chat.attributes if key.startswith(("openinference.", "llm.", "tool."))]


def test_an_answer_read_as_bytes_ends_its_span_as_the_read_returns(instrumented, spans, fleet):
    """A caller that reads the body as bytes and never parses it (0.7's relay, which keeps
    the response): the span ends as that read returns, without an outcome."""
    _, as_server = fleet
    base = as_server("my_agent", "responses_api_agents")
    kept = []

    async def go():
        from nemo_gym import server_utils

        response = await server_utils.request("POST", f"{base}/run", json={})
        assert not _client(spans)  # held
        body = await response.read()  # read as bytes, as a relay does: no parse
        kept.append(response)
        return body, time.time_ns()

    body, read_at = run_async(go())
    (span,) = _client(spans)
    assert span.end_time <= read_at
    assert "nemo.gym.reward" not in span.attributes
    assert json.loads(body) == RUN_ANSWER  # the caller got its bytes


def test_a_flush_ends_the_spans_still_held(instrumented, spans, fleet):
    """A server's shutdown flush (or the process's last) while a response is still held:
    the held span ends first, so it is in the flush."""
    from gym_autoinstr.setup import flush

    _, as_server = fleet
    base = as_server("my_agent", "responses_api_agents")
    response = _parsed(f"{base}/run", {}, parse=False)
    assert not _client(spans)
    flush.flush(timeout=2)
    (span,) = _client(spans)
    assert "nemo.gym.reward" not in span.attributes
    del response


def test_a_models_fields_are_read_without_pydantics_missing_attribute_path(monkeypatch):
    """Gym's answers are pydantic models; asking one for a field it lacks (``mask_sample``
    before 0.7, ``result`` of a plain answer) must not go through pydantic's ``__getattr__``
    (an AttributeError raised and caught per miss, several times per rollout)."""
    import pydantic

    class Verdict(pydantic.BaseModel, extra="allow"):
        reward: float
        response: dict | None = None

    verdict = Verdict(reward=0.25, response={"usage": {"input_tokens": 4, "output_tokens": 2}}, note="x")
    missed = []
    original = pydantic.BaseModel.__getattr__

    def counting(self, name):
        missed.append(name)
        return original(self, name)

    monkeypatch.setattr(pydantic.BaseModel, "__getattr__", counting)
    attributes: dict = {}
    assert outcome.rollout_attributes(verdict, attributes) is None
    assert attributes == {
        "nemo.gym.reward": 0.25,
        "nemo.gym.rollout.usage.input_tokens": 4,
        "nemo.gym.rollout.usage.output_tokens": 2,
    }
    assert outcome.field(verdict, "note") == "x"  # an extra field
    assert outcome.field(verdict, "mask_sample") is None
    assert outcome.field({"a": 1}, "a") == 1 and outcome.field(object(), "a") is None
    assert missed == []


def test_a_model_construct_ed_answer_without_extras_reads_a_missing_field_as_none():
    """``model_construct()`` (no validation) of a model without ``extra="allow"`` leaves it
    no extras (``__pydantic_extra__`` None): a field it lacks is None, not an error."""
    import pydantic

    class Verdict(pydantic.BaseModel):
        reward: float

    verdict = Verdict.model_construct(reward=0.5)
    assert outcome.field(verdict, "reward") == 0.5
    assert outcome.field(verdict, "mask_sample") is None
