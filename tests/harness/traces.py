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


def strip_ids(value):
    """A rollout result without its run-specific ids and timestamps."""
    if isinstance(value, dict):
        return {k: strip_ids(v) for k, v in value.items() if not (k == "id" or k.endswith("_id") or k.startswith("created"))}
    if isinstance(value, list):
        return [strip_ids(v) for v in value]
    return value


def service_of(span: dict) -> str:
    return span["resource"].get("service.name", "")


def rollout_traces(spans: list[dict], run_service: str) -> dict[str, list[dict]]:
    """trace id -> spans, for every trace whose root is the ``POST /run`` the test sent."""
    roots = [
        s for s in spans
        if s["kind"] == "SERVER" and s["name"] == "POST /run" and s["parent_span_id"] is None and service_of(s) == run_service
    ]
    return {root["trace_id"]: [s for s in spans if s["trace_id"] == root["trace_id"]] for root in roots}


def expected_services(trio: GymTrio) -> set[str]:
    return {f"nemo-gym/{name}" for name in trio.server_names}


def assert_one_connected_trace(trace: list[dict], trio: GymTrio) -> None:
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
        assert parent["kind"] == "CLIENT", (span["name"], parent["name"])
    # every CLIENT span carries the contract's attributes, and no query string
    clients = [s for s in trace if s["kind"] == "CLIENT"]
    assert clients
    for span in clients:
        assert span["name"] == "HTTP POST"
        assert span["attributes"]["http.request.method"] == "POST"
        assert isinstance(span["attributes"]["http.response.status_code"], int)
        assert "?" not in span["attributes"]["url.full"]
    # the agent->model->upstream chain: the model's CLIENT span to the policy model exists
    assert any(service_of(s) == f"nemo-gym/{MODEL}" and s["attributes"]["url.full"].endswith("/responses") for s in clients)
    # one root per rollout
    assert sum(1 for s in trace if s["parent_span_id"] is None) == 1
