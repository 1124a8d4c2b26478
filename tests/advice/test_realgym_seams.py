"""The span catalogue on real Gym processes: every seam, with its attributes and its parent.

Each trio runs under ``opentelemetry-instrument`` with this project installed in the Gym
venv, exporting through a real collector (rotel) to the test's sink.  Rollouts go to the
agent's ``/run`` directly, and through Gym's own rollout-collection driver
(``RolloutCollectionHelper.run_from_config``, what ``ng_collect_rollouts`` / ``gym eval
run --no-serve`` call) for ``gym.job`` and the rollout traces linked to it.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from gym_autoinstr.telemetry.groups import ALL_GROUPS, RAY, SANDBOX, parse_spec
from tests.harness.collector import Collector
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym

COLLECT_SERVICE = "nemo-gym/collect"  # the collection driver script (before 0.7)


def _collect_service(version: str) -> str:
    """The collection process's service: the driver script's name, or on 0.7 Gym's own
    ``gym eval run --no-serve`` (a Gym command: the orchestrator role)."""
    return "nemo-gym/orchestrator" if version >= "0.7" else COLLECT_SERVICE


def _service(span: dict) -> str:
    return span["resource"].get("service.name", "")


def _otel_env(collector: Collector, groups_spec: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "GYM_AUTOINSTR_SPAN_GROUPS": groups_spec,
    }


def _collect(trio: GymTrio, tmp_path, num_repeats: int) -> None:
    """Run Gym's rollout collection against the running trio, instrumented."""
    _, done = trio.collect([trio.default_row()], tmp_path / "collect", num_repeats=num_repeats, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Error in sitecustomize" not in done.stderr


def _group_of(span: dict) -> str | None:
    name, kind = span["name"], span["kind"]
    if kind == "SERVER":
        return "server"
    if kind == "CLIENT":
        return "http_client"
    if name.startswith(("gym.startup", "gym.server.startup")):
        return "startup"
    return {
        "gym.job": "job",
        "gym.rollout": "rollout",
        "gym.verify": "verify",
        "gym.agent.responses": "agent",
    }.get(name, "model_call" if name.startswith("gym.model.") else name)


def _by_trace(spans: list[dict]) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        traces[span["trace_id"]].append(span)
    return traces


def _parent(span: dict, trace: list[dict]) -> dict:
    (parent,) = [s for s in trace if s["span_id"] == span["parent_span_id"]]
    return parent


SEAM_PARENTS = {
    # seam: (service it runs in, the SERVER span names it may sit under)
    "gym.rollout": (AGENT, {"POST /run"}),
    "gym.agent.responses": (AGENT, {"POST /v1/responses", "POST /ng-rollout/{rollout_id}/v1/responses"}),
    "gym.model.responses": (MODEL, {"POST /v1/responses"}),
    "gym.verify": (RESOURCES, {"POST /verify"}),
}


def _assert_rollout_seams(trace: list[dict], rollout_result: dict | None, version: str, rollout_id: str | None) -> None:
    seams = [s for s in trace if s["name"].startswith("gym.") and s["name"] != "gym.job"]
    names = sorted(s["name"] for s in seams)
    # one rollout of the example: /run, one agent /v1/responses (a tool loop of two model calls), one verify
    assert names == ["gym.agent.responses"] + ["gym.model.responses"] * 2 + ["gym.rollout", "gym.verify"], names
    for seam in seams:
        service, parents = SEAM_PARENTS[seam["name"]]
        parent = _parent(seam, trace)
        assert seam["kind"] == "INTERNAL"
        assert _service(seam) == f"nemo-gym/{service}"
        assert (parent["kind"], _service(parent)) == ("SERVER", f"nemo-gym/{service}"), (seam["name"], parent["name"])
        # (behind Gym's /ng-rollout/<id> prefix too: the ingress finds the route the
        # prefix-stripping middleware routed to)
        assert parent["name"] in parents, (seam["name"], parent["name"])
        assert seam["attributes"]["nemo.gym.server.name"] == service
        assert seam["status"] == "UNSET"
    (rollout,) = [s for s in seams if s["name"] == "gym.rollout"]
    # every model call in GenAI terms: the seam names the model, the agent's CLIENT span of
    # the call (the seam's SERVER span's parent) counts its tokens, once; the agent's token
    # totals are the sum of its model calls
    model_seams = [s for s in seams if s["name"] == "gym.model.responses"]
    model_calls = [_parent(_parent(seam, trace), trace) for seam in model_seams]
    for seam, call in zip(model_seams, model_calls):
        attributes = seam["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "policy"  # the model server's configured model
        # (0.7's handler returns the answer as JSON bytes: not parsed again for its model)
        assert attributes.get("gen_ai.response.model") == (None if version >= "0.7" else "policy")
        assert "gen_ai.usage.input_tokens" not in attributes
        assert call["attributes"]["gen_ai.response.model"] == "policy"
        assert (call["kind"], _service(call), call["attributes"]["gen_ai.operation.name"]) == (
            "CLIENT",
            f"nemo-gym/{AGENT}",
            "chat",
        )
        assert call["attributes"]["gen_ai.usage.input_tokens"] > 0 < call["attributes"]["gen_ai.usage.output_tokens"]
    if rollout_result is not None:
        usage = rollout_result["response"]["usage"]
        assert sum(c["attributes"]["gen_ai.usage.input_tokens"] for c in model_calls) == usage["input_tokens"]
        assert sum(c["attributes"]["gen_ai.usage.output_tokens"] for c in model_calls) == usage["output_tokens"]
        assert rollout["attributes"]["nemo.gym.rollout.usage.input_tokens"] == usage["input_tokens"]
        assert rollout["attributes"]["nemo.gym.reward"] == rollout_result["reward"]
    # the rollout id: none before 0.5; from 0.5 on gym.rollout; where Gym itself correlates
    # the rollout (capture on, 0.7.0 here), on every seam and on the calls /run makes
    if rollout_id is None:
        assert not [s for s in trace if "nemo.gym.rollout.id" in s["attributes"]]
    else:
        assert rollout["attributes"]["nemo.gym.rollout.id"] == rollout_id
    if version == "0.7.0":
        # (calls made inside gym.rollout: Gym's agent answers /v1/responses from the path
        # prefix without entering rollout_context, so its calls to the model are not here)
        for span in seams + [s for s in trace if s["kind"] == "CLIENT" and s["parent_span_id"] == rollout["span_id"]]:
            assert span["attributes"].get("nemo.gym.rollout.id") == rollout_id, span["name"]


def _extra_config(version: str, tmp_path) -> dict:
    if version != "0.7.0":
        return {}
    # Gym correlates rollouts across servers (the /ng-rollout/<id>/ prefix) only with
    # model-call capture on.
    return {"observability_enabled": True, "model_call_capture_dir": str(tmp_path / "capture")}


@pytest.mark.parametrize("version", ["0.4.0", "0.5.1", "0.7.0"])
def test_every_seam_appears_with_attributes_under_the_right_parent(version, tmp_path, policy_model):
    with Collector(log_dir=tmp_path / "collector") as collector:
        trio = GymTrio.for_version(
            version,
            tmp_path / "gym",
            policy_url=policy_model.url,
            instrument=True,
            env=_otel_env(collector, "all"),
            extra_config=_extra_config(version, tmp_path),
        )
        with trio:
            results = [trio.rollout(rollout_index=index) for index in (0, 1)]
            _collect(trio, tmp_path, num_repeats=2)
            assert collector.sink.wait_for(
                lambda spans: (
                    sum(s["name"] == "gym.rollout" for s in spans) >= 4 and any(s["name"] == "gym.job" for s in spans)
                ),
                timeout=30,
            ), sorted({(_service(s), s["name"]) for s in collector.sink.spans()})
        spans = collector.sink.spans()

    traces = _by_trace(spans)
    run_service = f"nemo-gym/{ENVIRONMENT if trio.has_relay else AGENT}"
    direct = {
        s["trace_id"]: s
        for s in spans
        if s["kind"] == "SERVER"
        and s["name"] == "POST /run"
        and s["parent_span_id"] is None
        and _service(s) == run_service
    }
    assert len(direct) == 2
    ids = {}
    for trace_id, _root in direct.items():
        trace = traces[trace_id]
        (rollout,) = [s for s in trace if s["name"] == "gym.rollout"]
        ids[trace_id] = rollout["attributes"].get("nemo.gym.rollout.id")
    expected_ids = {"0-0", "0-1"} if version >= "0.5" else {None}
    assert set(ids.values()) == expected_ids
    for trace_id, rollout_id in ids.items():
        result = results[int(rollout_id.split("-")[1])] if rollout_id else results[0]
        _assert_rollout_seams(traces[trace_id], result, version, rollout_id)

    # gym.job: one root in the collection process, a trace of its own; each rollout's
    # CLIENT span is the root of that rollout's trace, linked to the job
    (job,) = [s for s in spans if s["name"] == "gym.job"]
    assert (job["kind"], job["parent_span_id"], _service(job)) == ("INTERNAL", None, _collect_service(version))
    run_clients = [
        s
        for s in spans
        if s["kind"] == "CLIENT"
        and _service(s) == _collect_service(version)
        and s["attributes"]["url.full"].endswith("/run")
    ]
    assert len(run_clients) == 2
    assert all(s["parent_span_id"] is None for s in run_clients)
    assert all(s["links"] == [{"trace_id": job["trace_id"], "span_id": job["span_id"]}] for s in run_clients)
    job_rollouts = [r for c in run_clients for r in traces[c["trace_id"]] if r["name"] == "gym.rollout"]
    assert len(job_rollouts) == 2
    job_ids = sorted(s["attributes"].get("nemo.gym.rollout.id") or "" for s in job_rollouts)
    assert job_ids == (["", ""] if version < "0.5" else ["0-0", "0-1"])

    # content-free: no prompt or completion text in any attribute
    prompt = json.dumps(trio.default_row()["responses_create_params"]["input"])
    words = {w for w in prompt.replace('"', " ").split() if len(w) > 6}
    leaked = [
        (s["name"], k)
        for s in spans
        for k, v in s["attributes"].items()
        if isinstance(v, str) and any(w in v for w in words)
    ]
    assert not leaked


# Presets and a mixed spec select exactly their groups; `none` exports nothing at all.
@pytest.mark.parametrize("spec", ["default", "per_rollout", " Default, verify ,MODEL_CALL", "none"])
def test_span_groups_select_exactly_their_spans(spec, tmp_path, policy_model):
    version = "0.4.0"
    with Collector(log_dir=tmp_path / "collector") as collector:
        trio = GymTrio.for_version(
            version,
            tmp_path / "gym",
            policy_url=policy_model.url,
            instrument=True,
            env=_otel_env(collector, spec),
        )
        with trio:
            assert trio.rollout()["reward"] == 1.0
            _collect(trio, tmp_path, num_repeats=1)
            expected = parse_spec(spec) - {SANDBOX, RAY}  # the example trio uses neither
            if expected:
                assert collector.sink.wait_for(lambda spans: {_group_of(s) for s in spans} >= expected, timeout=30), (
                    sorted({_group_of(s) for s in collector.sink.spans()})
                )
        spans = collector.sink.spans()  # servers and the collection process have flushed at exit
    assert {_group_of(s) for s in spans} == expected
    assert expected <= ALL_GROUPS
    if "job" not in expected and "server" in expected:
        # no job: each rollout is its own trace, rooted at the agent's POST /run
        roots = [s for s in spans if s["parent_span_id"] is None]
        assert roots and all(_service(s) in (COLLECT_SERVICE, f"nemo-gym/{AGENT}") for s in roots)
