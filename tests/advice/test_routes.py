"""Route seams on real Gym server classes (the runner's Gym) served by real uvicorn."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from omegaconf import OmegaConf
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from gym_autoinstr.advice.ingress import instrument_app
from gym_autoinstr.telemetry import groups
from tests.harness.servers import run_async, serve

SECRET = "SECRET_PROMPT_TEXT"


class Ask(BaseModel):
    question: str
    model: str | None = None


def _client():
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient

    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create({})
    )


def _config(config_cls, name: str):
    return config_cls(host="127.0.0.1", port=1, entrypoint="app.py", name=name)


def _resources_classes():
    from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer

    class Resources(SimpleResourcesServer):
        async def verify(self, body: Ask) -> dict:
            if body.question == "boom":
                raise ValueError(f"judge saw {SECRET}")
            if body.question == "slow":
                await asyncio.sleep(30)
            return {"reward": 1.0}

    class ResourcesWithoutSuper(Resources):
        """Overrides setup_webserver without super(), with a sync handler."""

        def setup_webserver(self) -> FastAPI:
            app = FastAPI()
            app.post("/verify")(self.verify_sync)
            app.post("/other")(self.verify_sync)
            return app

        def verify_sync(self, body: Ask) -> dict:
            return {"reward": 0.5, "thread": threading.current_thread().name}

    return Resources, ResourcesWithoutSuper, BaseResourcesServerConfig


def _resources(cls=None, name: str = "my_resources"):
    Resources, _, config_cls = _resources_classes()
    return (cls or Resources)(config=_config(config_cls, name), server_client=_client())


def _model(name: str = "my_model"):
    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel

    class Model(SimpleResponsesAPIModel):
        async def chat_completions(self, body: Ask) -> dict:
            return {
                "model": "served-chat",
                "choices": [{"message": {"content": SECRET}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }

        async def responses(self, body: Ask):
            if body.question == "stream":

                async def chunks():
                    Model.stream_started_at = time.time_ns()
                    for i in range(3):
                        await asyncio.sleep(0.05)
                        yield f"data: {i}\n\n"
                    Model.stream_finished_at = time.time_ns()

                return StreamingResponse(chunks(), media_type="text/event-stream")
            return {
                "model": "served-responses",
                "output": [{"text": SECRET}],
                "usage": {"input_tokens": 5, "output_tokens": 3},
            }

    return Model(config=_config(BaseResponsesAPIModelConfig, name), server_client=_client()), Model


def _agent(name: str = "my_agent"):
    from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent

    class Agent(SimpleResponsesAPIAgent):
        async def responses(self, body: Ask) -> dict:
            return {"id": "r"}

        async def run(self, body: Ask) -> dict:
            return {"reward": 1.0}

    return Agent(config=_config(BaseResponsesAPIAgentConfig, name), server_client=_client())


def _post(url: str, body, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _named(spans, prefix: str = "gym."):
    # seam spans (a server's one-off start-up span is not one)
    return [s for s in spans.get_finished_spans() if s.name.startswith(prefix) and s.name != "gym.server.startup"]


def _route(app: FastAPI, path: str):
    return next(r for r in app.router.routes if getattr(r, "path", None) == path)


@pytest.mark.parametrize(
    "build,path,body,span_name",
    [
        (lambda: _resources(), "/verify", {"question": "q"}, "gym.verify"),
        (lambda: _agent(), "/run", {"question": "q"}, "gym.rollout"),
        (lambda: _agent(), "/v1/responses", {"question": "q"}, "gym.agent.responses"),
        (lambda: _model()[0], "/v1/chat/completions", {"question": "q"}, "gym.model.chat_completions"),
        (lambda: _model()[0], "/v1/responses", {"question": "q"}, "gym.model.responses"),
    ],
)
def test_each_seam_is_an_internal_span_under_the_server_span(instrumented, spans, build, path, body, span_name):
    server = build()
    app = server.setup_webserver()
    instrument_app(app, server.config.name)
    with serve(app) as base:
        status, _ = _post(base + path, body)
    assert status == 200
    (seam,) = _named(spans)
    (server_span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert seam.name == span_name
    assert seam.kind == SpanKind.INTERNAL
    assert seam.parent.span_id == server_span.context.span_id
    assert seam.attributes["nemo.gym.server.name"] == server.config.name
    assert seam.status.status_code == StatusCode.UNSET


def test_rollout_context_tags_the_open_seam_from_inside_a_child_span(instrumented, spans):
    """``rollout_context`` (Gym 0.5+) entered in a seam handler, here under a span of the
    handler's own: the rollout id goes on the seam span (kept in the context the seam made
    current), not on the child; outside any seam nothing is tagged."""
    from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
    from opentelemetry import trace

    from gym_autoinstr.advice import routes

    entered: list[str] = []

    def rollout_context(rollout_id):  # stands in for nemo_gym.rollout_correlation.rollout_context
        entered.append(rollout_id)
        return rollout_id

    class Agent(SimpleResponsesAPIAgent):
        async def responses(self, body: Ask) -> dict:
            return {"id": "r"}

        async def run(self, body: Ask) -> dict:
            with trace.get_tracer("test").start_as_current_span("handler's own"):
                routes.rollout_context_advice(rollout_context, None, ("rollout-7",), {})
            return {"reward": 1.0}

    server = Agent(config=_config(BaseResponsesAPIAgentConfig, "my_agent"), server_client=_client())
    app = server.setup_webserver()
    instrument_app(app, server.config.name)
    with serve(app) as base:
        status, _ = _post(base + "/run", {"question": "q"})
    assert status == 200 and entered == ["rollout-7"]
    (seam,) = _named(spans)
    (child,) = [s for s in spans.get_finished_spans() if s.name == "handler's own"]
    assert seam.name == "gym.rollout" and child.parent.span_id == seam.context.span_id
    assert seam.attributes["nemo.gym.rollout.id"] == "rollout-7"
    assert "nemo.gym.rollout.id" not in child.attributes
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("no seam"):
        routes.rollout_context_advice(rollout_context, None, ("rollout-8",), {})
    (outside,) = spans.get_finished_spans()
    assert entered == ["rollout-7", "rollout-8"] and "nemo.gym.rollout.id" not in outside.attributes


def test_other_routes_of_a_gym_server_get_no_seam(instrumented, spans):
    app = _resources().setup_webserver()
    assert not hasattr(_route(app, "/seed_session").endpoint, "_gym_autoinstr_seam")
    with serve(app) as base:
        assert _post(base + "/seed_session", {})[0] == 200
    assert _named(spans) == []


def test_model_calls_carry_genai_metadata_and_no_content(instrumented, spans):
    server, _ = _model()
    app = server.setup_webserver()
    with serve(app) as base:
        _post(base + "/v1/chat/completions", {"question": SECRET, "model": "asked-model"})
        _post(base + "/v1/responses", {"question": SECRET})
    chat, responses = sorted(_named(spans), key=lambda s: s.name)
    assert chat.name == "gym.model.chat_completions"
    assert dict(chat.attributes) == {
        "nemo.gym.server.name": "my_model",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "asked-model",
        "gen_ai.response.model": "served-chat",
    }  # no token counts: the caller's CLIENT span of the call has them (counted once)
    assert "gen_ai.usage.input_tokens" not in responses.attributes
    assert responses.attributes["gen_ai.response.model"] == "served-responses"
    assert "gen_ai.request.model" not in responses.attributes  # neither the body nor the config names one
    for span in (chat, responses):
        assert SECRET not in repr(dict(span.attributes)) + repr(span.events)


def test_wrapped_route_keeps_request_model_openapi_and_422(instrumented, spans):
    server = _resources()
    app = server.setup_webserver()
    endpoint = _route(app, "/verify").endpoint
    assert endpoint.__wrapped__ == server.verify  # wrapped, and FastAPI can see through it
    assert inspect.iscoroutinefunction(endpoint)
    # the same handler registered on a plain app, untouched, gives the same OpenAPI operation
    plain = FastAPI()
    plain.post("/verify")(server.verify)
    assert _route(plain, "/verify").endpoint == server.verify
    assert app.openapi()["paths"]["/verify"] == plain.openapi()["paths"]["/verify"]
    assert "requestBody" in app.openapi()["paths"]["/verify"]["post"]
    assert app.openapi()["components"]["schemas"]["Ask"] == plain.openapi()["components"]["schemas"]["Ask"]
    with serve(app) as base:
        status, body = _post(base + "/verify", {"not_a_question": 1})
    assert status == 422
    assert json.loads(body)["detail"][0]["loc"] == ["body", "question"]
    assert _named(spans) == []  # validation failed before the handler ran


def test_subclass_without_super_and_a_sync_handler(instrumented, spans):
    _, WithoutSuper, _ = _resources_classes()
    server = _resources(WithoutSuper, "no_super")
    app = server.setup_webserver()
    endpoint = _route(app, "/verify").endpoint
    assert not inspect.iscoroutinefunction(endpoint)  # FastAPI still runs it in its threadpool
    assert _route(app, "/other").endpoint == server.verify_sync
    with serve(app) as base:
        status, body = _post(base + "/verify", {"question": "q"})
        _post(base + "/other", {"question": "q"})
    assert status == 200
    assert json.loads(body)["thread"] != threading.main_thread().name
    (seam,) = _named(spans)
    assert (seam.name, seam.attributes["nemo.gym.server.name"]) == ("gym.verify", "no_super")


def test_a_streaming_response_ends_the_span_when_the_stream_ends(instrumented, spans):
    server, Model = _model()
    app = server.setup_webserver()
    with serve(app) as base:
        status, body = _post(base + "/v1/responses", {"question": "stream"})
    assert status == 200 and body.count(b"data:") == 3
    deadline = time.monotonic() + 5  # the server finishes the body just after the client has it
    while not _named(spans) and time.monotonic() < deadline:
        time.sleep(0.01)
    (seam,) = _named(spans)
    assert seam.name == "gym.model.responses"
    # the span covers the whole stream: opened before the first chunk, ended after the last
    assert seam.start_time <= Model.stream_started_at < Model.stream_finished_at <= seam.end_time


def test_an_exception_is_recorded_by_type_and_reraised(instrumented, spans):
    app = _resources().setup_webserver()
    with serve(app) as base:
        status, _ = _post(base + "/verify", {"question": "boom"})
    assert status == 500
    (seam,) = _named(spans)
    assert seam.status.status_code == StatusCode.ERROR
    assert seam.attributes["error.type"] == "ValueError"
    assert SECRET not in repr(dict(seam.attributes)) + repr(seam.events) + str(seam.status.description)


def test_cancellation_ends_the_span_without_error(instrumented, spans):
    app = _resources().setup_webserver()
    endpoint = _route(app, "/verify").endpoint

    async def cancel_midway():
        task = asyncio.ensure_future(endpoint(body=Ask(question="slow")))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_async(cancel_midway())
    (seam,) = _named(spans)
    assert seam.end_time is not None
    assert seam.status.status_code == StatusCode.UNSET
    assert "error.type" not in seam.attributes


def test_disabled_groups_mean_zero_seam_spans(instrumented, spans, monkeypatch):
    resources_app = _resources().setup_webserver()
    model_app = _model()[0].setup_webserver()
    # only the model_call group on: no gym.verify
    monkeypatch.setattr(groups, "ENABLED", frozenset({groups.MODEL_CALL}))
    with serve(resources_app) as resources, serve(model_app) as model:
        assert _post(resources + "/verify", {"question": "q"})[0] == 200
        assert _post(model + "/v1/responses", {"question": "q"})[0] == 200
        assert [s.name for s in _named(spans)] == ["gym.model.responses"]
        spans.clear()
        monkeypatch.setattr(groups, "ENABLED", frozenset())
        status, body = _post(resources + "/verify", {"question": "q"})
        assert (status, json.loads(body)) == (200, {"reward": 1.0})
        assert _post(model + "/v1/chat/completions", {"question": "q"})[0] == 200
    assert _named(spans) == []  # (FastAPI's own spans may remain: these apps have no ingress)


def test_non_gym_apps_are_untouched(instrumented, spans):
    async def verify(body: Ask) -> dict:
        return {"reward": 1.0}

    plain = FastAPI()
    plain.post("/verify")(verify)
    plain.post("/run")(verify)

    class NotAGymServer:
        def setup_webserver(self) -> FastAPI:
            app = FastAPI()
            app.post("/verify")(verify)
            return app

    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import HeadServer

    head = HeadServer(config=BaseServerConfig(host="127.0.0.1", port=1)).setup_webserver()
    apps = [plain, NotAGymServer().setup_webserver(), head]
    for app in apps:
        for route in app.router.routes:
            assert not getattr(getattr(route, "endpoint", None), "_gym_autoinstr_seam", False), route
    assert _route(plain, "/verify").endpoint is verify
    with serve(plain) as base:
        assert _post(base + "/verify", {"question": "q"})[0] == 200
    assert _named(spans) == []


def test_a_request_the_sampler_dropped_gets_no_seam_span(instrumented, spans):
    server = _resources()
    app = server.setup_webserver()
    instrument_app(app, server.config.name)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{}"
    with serve(app) as base:
        for flags in ("00", "01"):
            request = urllib.request.Request(
                base + "/verify", data=json.dumps({"question": "q"}).encode(), method="POST"
            )
            request.add_header("Content-Type", "application/json")
            request.add_header("traceparent", traceparent.format(flags))
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
    (seam,) = _named(spans)  # the sampled request's only
    assert seam.name == "gym.verify" and format(seam.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert [s.kind for s in spans.get_finished_spans() if s.name != "gym.server.startup"].count(SpanKind.SERVER) == 1


def test_a_seam_that_records_nothing_hands_back_the_handlers_own_coroutine(instrumented, spans, monkeypatch):
    """FastAPI sees a coroutine function; with the seam's group off the request's chain
    holds the handler's coroutine alone, and with it on, the seam's own around it."""
    server = _resources()
    endpoint = _route(server.setup_webserver(), "/verify").endpoint
    assert getattr(endpoint, "_gym_autoinstr_seam", False)
    assert inspect.iscoroutinefunction(endpoint) and asyncio.iscoroutinefunction(endpoint)
    body = Ask(question="q")
    monkeypatch.setattr(groups, "ENABLED", frozenset())
    bare = endpoint(body)
    assert bare.cr_code is type(server).verify.__code__
    assert run_async(bare) == {"reward": 1.0}
    monkeypatch.setattr(groups, "ENABLED", frozenset({groups.VERIFY}))
    seamed = endpoint(body)
    assert seamed.cr_code is not type(server).verify.__code__
    assert run_async(seamed) == {"reward": 1.0}
    assert [s.name for s in _named(spans)] == ["gym.verify"]


def test_the_rollout_and_verify_seams_carry_the_reward_their_handler_returned(instrumented, spans):
    """The reward is read off the handler's return value (no parse): on ``gym.verify``, on
    ``gym.rollout`` (an agent invocation in GenAI terms) and on the ``/run`` request's SERVER
    span, the rollout's root when its caller is not traced."""
    agent, resources = _agent("graded_agent"), _resources(name="graded_resources")
    agent_app, resources_app = agent.setup_webserver(), resources.setup_webserver()
    instrument_app(agent_app, "graded_agent")
    instrument_app(resources_app, "graded_resources")
    with serve(agent_app) as agent_url, serve(resources_app) as resources_url:
        assert _post(agent_url + "/run", {"question": "q"})[0] == 200
        assert _post(resources_url + "/verify", {"question": "q"})[0] == 200
    finished = spans.get_finished_spans()
    (rollout,) = [s for s in finished if s.name == "gym.rollout"]
    (verify,) = [s for s in finished if s.name == "gym.verify"]
    servers = {s.attributes.get("http.route"): s for s in finished if s.kind == SpanKind.SERVER}
    assert len(servers) == 2  # (by route: a server span may end after the next request's)
    run_server, verify_server = servers["/run"], servers["/verify"]
    assert rollout.attributes["nemo.gym.reward"] == 1.0 == run_server.attributes["nemo.gym.reward"]
    assert run_server.attributes["gen_ai.operation.name"] == "invoke_agent"  # a GenAI UI lists the root as the agent
    assert run_server.attributes["gen_ai.agent.name"] == "graded_agent"
    assert rollout.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert rollout.attributes["gen_ai.agent.name"] == "graded_agent"
    assert verify.attributes["nemo.gym.reward"] == 1.0
    assert "nemo.gym.reward" not in verify_server.attributes  # only a /run's SERVER span gets it


def test_a_traced_callers_run_leaves_the_outcome_off_the_server_span(instrumented, spans):
    """A ``/run`` whose caller is traced (a ``traceparent``: Gym's collection driver, say)
    is not the rollout's root: its SERVER span gets no copy of the outcome (the caller's
    CLIENT span reads it from the answer); ``gym.rollout`` still has it."""
    agent = _agent("called_agent")
    app = agent.setup_webserver()
    instrument_app(app, "called_agent")
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with serve(app) as base:
        assert _post(base + "/run", {"question": "q"}, {"traceparent": caller})[0] == 200
    finished = spans.get_finished_spans()
    (rollout,) = [s for s in finished if s.name == "gym.rollout"]
    (server,) = [s for s in finished if s.kind == SpanKind.SERVER]
    assert server.parent.span_id == 0x00F067AA0BA902B7
    assert rollout.attributes["nemo.gym.reward"] == 1.0
    assert not {"nemo.gym.reward", "gen_ai.operation.name", "gen_ai.agent.name"} & set(server.attributes)


def test_a_rollouts_reward_is_the_evaluation_result_of_its_agent_invocation(instrumented, spans):
    """GenAI's ``gen_ai.evaluation.result``, parented to ``gym.rollout`` (``invoke_agent``):
    a span event where the process exports no logs (here); the score is the reward."""
    agent = _agent("evaluated_agent")
    app = agent.setup_webserver()
    instrument_app(app, "evaluated_agent")
    with serve(app) as base:
        assert _post(base + "/run", {"question": "q"})[0] == 200
    (rollout,) = [s for s in spans.get_finished_spans() if s.name == "gym.rollout"]
    (event,) = rollout.events
    assert event.name == "gen_ai.evaluation.result"
    assert dict(event.attributes) == {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": 1.0}
