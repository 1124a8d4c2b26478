"""What the real-Gym tests read off an exported trace, and the OTLP settings they start Gym with."""

from __future__ import annotations

import json
import urllib.request

from tests.harness.collector import Collector
from tests.harness.trio import MODEL, GymTrio, PolicyModel


def otel_env(collector: Collector, protocol: str, **extra: str) -> dict[str, str]:
    endpoint = collector.http_endpoint if protocol == "http/protobuf" else collector.grpc_endpoint
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        **extra,
    }


def received_upstream(policy_model: PolicyModel) -> list[dict]:
    with urllib.request.urlopen(policy_model.base + "/_received", timeout=10) as response:
        return json.loads(response.read())


def reset_upstream(policy_model: PolicyModel) -> None:
    request = urllib.request.Request(policy_model.base + "/_reset", data=b"", method="POST")
    urllib.request.urlopen(request, timeout=10).read()


def drop_upstream(policy_model: PolicyModel, count: int) -> None:
    """The policy model closes the connection of each of its next ``count`` model calls unanswered."""
    request = urllib.request.Request(
        policy_model.base + "/_drop", data=json.dumps({"count": count}).encode(), method="POST"
    )
    urllib.request.urlopen(request, timeout=10).read()


def strip_ids(value):
    """A rollout result without its run-specific ids and timestamps."""
    if isinstance(value, dict):
        return {
            k: strip_ids(v) for k, v in value.items() if not (k == "id" or k.endswith("_id") or k.startswith("created"))
        }
    if isinstance(value, list):
        return [strip_ids(v) for v in value]
    return value


def service_of(span: dict) -> str:
    return span["resource"].get("service.name", "")


def rollout_traces(spans: list[dict], run_service: str) -> dict[str, list[dict]]:
    """trace id -> spans, for every trace whose root is the ``POST /run`` the test sent."""
    roots = [
        s
        for s in spans
        if s["kind"] == "SERVER"
        and s["name"] == "POST /run"
        and s["parent_span_id"] is None
        and service_of(s) == run_service
    ]
    return {root["trace_id"]: [s for s in spans if s["trace_id"] == root["trace_id"]] for root in roots}


def expected_services(trio: GymTrio) -> set[str]:
    return {f"nemo-gym/{name}" for name in trio.server_names}


def assert_one_connected_trace(trace: list[dict], trio: GymTrio, server_parents: tuple[str, ...] = ("CLIENT",)) -> None:
    """``server_parents``: the kinds a callee's SERVER span may hang under (the caller's
    CLIENT span; ``GYM_AUTOINSTR_CLIENT_SPANS=failures``: the caller's SERVER or seam span)."""
    by_id = {s["span_id"]: s for s in trace}
    # every process of the trio took part
    assert {service_of(s) for s in trace} == expected_services(trio)
    # every SERVER span but the root is parented by a CLIENT span (the agent also calls
    # its own /v1/responses, so the caller may be the same process)
    servers = [s for s in trace if s["kind"] == "SERVER"]
    assert len(servers) >= 5
    for span in servers:
        if span["parent_span_id"] is None:
            continue
        parent = by_id.get(span["parent_span_id"])
        assert parent is not None, f"{span['name']} in {service_of(span)}: parent not in trace"
        assert parent["kind"] in server_parents, (span["name"], parent["name"], parent["kind"])
    # every CLIENT span carries the contract's attributes, and no query string
    clients = [s for s in trace if s["kind"] == "CLIENT"]
    assert clients
    for span in clients:
        # `{method} {url.template}` to a server of the fleet, `{method}` elsewhere (the upstream)
        template = span["attributes"].get("url.template")
        assert span["name"] == (f"POST {template}" if template else "POST"), span["name"]
        assert span["attributes"]["http.request.method"] == "POST"
        assert isinstance(span["attributes"]["http.response.status_code"], int)
        assert "?" not in span["attributes"]["url.full"]
    # the agent->model->upstream chain: the model's CLIENT span to the policy model exists
    assert any(
        service_of(s) == f"nemo-gym/{MODEL}" and s["attributes"]["url.full"].endswith("/responses") for s in clients
    )
    # one root per rollout
    assert sum(1 for s in trace if s["parent_span_id"] is None) == 1


# ----------------------------------------------------------- collection jobs (issue 15)


def spans_since(spans: list[dict], start_ns: int) -> list[dict]:
    """The spans that started at or after ``start_ns`` (one phase of a shared fleet)."""
    return [s for s in spans if s["start_ns"] >= start_ns]


def job_spans(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["name"] == "gym.job"]


def by_trace(spans: list[dict]) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = {}
    for span in spans:
        traces.setdefault(span["trace_id"], []).append(span)
    return traces


def linked_rollout_roots(spans: list[dict], job: dict) -> list[dict]:
    """Root spans (no parent) whose links point at ``job``: the rollouts of that job."""
    return [
        s
        for s in spans
        if s["parent_span_id"] is None
        and {"trace_id": job["trace_id"], "span_id": job["span_id"]} in s.get("links", [])
    ]


def assert_whole_rollout(trace: list[dict], root: dict, trio: GymTrio) -> None:
    """One rollout's trace, complete: ``root`` is its only root, every other span's parent
    is in it, and it crosses the collection process and every server of the trio down to
    the verify call."""
    ids = {s["span_id"] for s in trace}
    assert [s for s in trace if s["parent_span_id"] is None] == [root]
    assert all(s["parent_span_id"] in ids for s in trace if s is not root)
    services = {service_of(s) for s in trace}
    assert services >= expected_services(trio) | {service_of(root)}, services
    assert len(services) >= 4  # the collection process and the trio's three servers (at least)
    names = [s["name"] for s in trace]
    assert names.count("gym.rollout") == 1 and "POST /verify" in names and "POST /seed_session" in names, names
