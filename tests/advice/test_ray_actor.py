"""A Ray worker that runs Gym's orchestration becomes Gym's orchestrator (in-process part).

Each case runs in a fresh interpreter whose script sits where Ray's own scripts do, so
``identity`` sees a Ray worker (``.../ray/_private/workers/default_worker.py``) or a Ray
daemon (``.../ray/dashboard/dashboard.py``).  Start-up is what ``opentelemetry-instrument``
does (our configurator, then our instrumentor); then the script calls Gym's real
``RolloutCollectionHelper.run_examples`` (its head server unreachable, so it raises after
the promotion) and Gym's real ``GlobalConfigDictParser.parse``.  The real actor, fleet
and cluster are in ``test_realgym_ray_actor.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.harness.trio import free_ports

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    if os.environ.get("CASE_EMBEDDER"):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        embedder = TracerProvider(resource=Resource.create({"service.name": "embedder"}))
        embedder.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(embedder)

    from gym_autoinstr.setup import configurator
    from gym_autoinstr.instrumentor import GymInstrumentor
    configurator.GymConfigurator().configure()
    instrumentor = GymInstrumentor()
    instrumentor.instrument()
    out = {"before": configurator.STATE.configured_by}

    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from omegaconf import OmegaConf

    head = BaseServerConfig(host="127.0.0.1", port=int(os.environ["CASE_PORT"]))

    def collect():
        try:
            RolloutCollectionHelper().run_examples([], head_server_config=head)
            return None
        except Exception as error:
            return type(error).__name__

    if os.environ.get("CASE_WORKER_FIRST"):  # a traced actor method ran before Gym started
        out["worker_first"] = configurator.configure_ray_worker("agent", {}, None)
        from gym_autoinstr.telemetry.spans import tracer
        tracer().start_span("ray.execute Actor.setup").end()
    out["first_error"] = collect()
    provider = trace.get_tracer_provider()
    if not os.environ.get("CASE_EMBEDDER") and hasattr(provider, "add_span_processor"):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    out["second_error"] = collect()
    out["configured_by"] = configurator.STATE.configured_by
    who = configurator.STATE.identity
    out["role"] = getattr(who, "role", None)
    out["resource"] = (
        {k: v for k, v in getattr(provider, "resource", None).attributes.items()}
        if hasattr(provider, "resource")
        else {}
    )
    out["applied"] = sorted(instrumentor.patches.applied)
    out["same_provider"] = provider is trace.get_tracer_provider()

    # The server venvs Gym would build from here get our packages.
    parsed = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict=OmegaConf.create({"head_server": {"host": "127.0.0.1", "port": 11000}}),
        skip_load_from_cli=True, skip_load_from_dotenv=True))
    from gym_autoinstr.advice.venvs import server_requirements
    deps = list(parsed.get("head_server_deps") or [])
    out["ours_in_deps"] = bool(server_requirements()) and all(r in deps for r in server_requirements())

    out["spans"] = [{"name": s.name, "id": format(s.context.span_id, "016x"),
                     "parent": format(s.parent.span_id, "016x") if s.parent else None,
                     "end": s.end_time, "status": s.status.status_code.name,
                     "attributes": dict(s.attributes or {}),
                     "service": s.resource.attributes.get("service.name")} for s in exporter.get_finished_spans()]
    print("CASE " + json.dumps(out))
    """
)


def run_as(tmp_path, ray_script: str, **env: str) -> dict:
    script = tmp_path / "site-packages" / "ray" / ray_script
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(SCRIPT)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "NEMO_GYM_", "RAY_"))
    }
    environ.update(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "CASE_PORT": str(free_ports(1)[0]), **env}
    )
    result = subprocess.run(
        [sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("CASE ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(lines[-1][5:])


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    return run_as(
        tmp_path_factory.mktemp("worker"), "_private/workers/default_worker.py", GYM_AUTOINSTR_SHARD="shard-7"
    )


def test_a_ray_worker_is_silent_until_it_runs_gyms_orchestration(worker):
    assert worker["before"] == "skipped"
    assert worker["configured_by"] == "gym_autoinstr:ray_orchestrator"
    assert worker["role"] == "orchestrator"
    assert {"egress", "job", "venvs.requirements"} <= set(worker["applied"])
    resource = worker["resource"]
    assert resource["service.name"] == "nemo-gym/orchestrator"
    assert resource["nemo.gym.process.role"] == "orchestrator"
    assert resource["nemo.gym.shard"] == "shard-7"
    assert resource["process.pid"] > 0 and resource["host.name"]
    assert resource["nemo.gym.run.id"]


def test_the_call_that_promotes_raises_as_before(worker):
    # Gym's own error (its head server unreachable) reaches the caller unchanged, both times
    assert worker["first_error"] is not None
    assert worker["first_error"] == worker["second_error"]


def test_server_venvs_a_promoted_worker_builds_get_our_packages(worker):
    assert worker["ours_in_deps"]


def test_an_embedders_provider_in_the_worker_is_adopted(tmp_path):
    out = run_as(tmp_path, "_private/workers/default_worker.py", CASE_EMBEDDER="1")
    assert out["configured_by"] == "foreign:opentelemetry.sdk.trace"
    assert out["same_provider"]
    assert out["resource"]["service.name"] == "embedder"  # its name stays
    assert out["resource"]["nemo.gym.process.role"] == "orchestrator"  # our identity joins


def test_a_ray_daemon_never_becomes_gym(tmp_path):
    out = run_as(tmp_path, "dashboard/dashboard.py")
    assert out["before"] == out["configured_by"] == "skipped"
    assert out["role"] == "ray"
    assert out["applied"] == [] and out["spans"] == []
    assert not out["ours_in_deps"]


def test_a_worker_that_ran_a_traced_method_first_becomes_the_orchestrator(tmp_path):
    # an actor whose traced method ran before it started Gym: same provider, new identity
    out = run_as(tmp_path, "_private/workers/default_worker.py", CASE_WORKER_FIRST="1")
    assert out["worker_first"] is True
    assert out["configured_by"] == "gym_autoinstr:ray_orchestrator" and out["role"] == "orchestrator"
    assert out["same_provider"]
    assert out["resource"]["service.name"] == "nemo-gym/orchestrator"
    assert out["resource"]["nemo.gym.process.role"] == "orchestrator"
    assert {"egress", "job"} <= set(out["applied"])
    # the spans after the promotion carry the orchestrator's resource
    assert out["spans"] and {s["service"] for s in out["spans"]} == {"nemo-gym/orchestrator"}
