"""Standing down where Gym's own telemetry is live (0.7+ with a working nemo-lens)."""

from __future__ import annotations

import sys
import types

import pytest
from fastapi import FastAPI

from gym_autoinstr.advice import coexistence
from gym_autoinstr.advice.ingress import instrument_app
from tests.harness.servers import run_async, serve

pytest.importorskip("nemo_gym")


@pytest.fixture
def native(monkeypatch):
    """A stand-in for nemo_gym.telemetry.setup whose handle says it is exporting."""
    state = {"exporting": False}
    module = types.ModuleType("nemo_gym.telemetry.setup")

    def init_telemetry():
        return None

    def get_telemetry():
        return types.SimpleNamespace(is_exporting=state["exporting"])

    module.init_telemetry = init_telemetry
    module.get_telemetry = get_telemetry
    monkeypatch.setitem(sys.modules, "nemo_gym.telemetry.setup", module)
    yield state
    coexistence.set_native_live_for_tests(False)


def test_inert_native_telemetry_leaves_the_work_to_us(instrumented, native):
    native["exporting"] = False
    coexistence.init_telemetry_advice(lambda: None, None, (), {})
    assert coexistence.native_telemetry_live() is False


def test_live_native_telemetry_makes_egress_and_ingress_stand_down(instrumented, spans, native):
    native["exporting"] = True
    coexistence.init_telemetry_advice(lambda: None, None, (), {})
    assert coexistence.native_telemetry_live() is True

    app = FastAPI()

    @app.post("/echo")
    async def echo():
        return {}

    assert instrument_app(app, "agent") is False  # Gym's own ingress takes the app

    async def call(url):
        from nemo_gym import server_utils

        response = await server_utils.request("POST", url, json={})
        await response.read()
        return response.status

    with serve(app) as base:
        assert run_async(call(f"{base}/echo")) == 200
    # no span of ours (FastAPI's built-in telemetry is Gym's business then)
    assert [s for s in spans.get_finished_spans() if s.instrumentation_scope.name == "gym_autoinstr"] == []
