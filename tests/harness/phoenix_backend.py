"""A real Arize Phoenix server as a trace backend: its own venv, its own process.

    with PhoenixServer(workdir) as phoenix:
        env = phoenix.otlp_env("gym")                # OTEL_* for Gym's processes
        ...
        traces = phoenix.wait_for_rollouts("gym", 5) # spans through Phoenix's REST API
        rows = phoenix.trace_list("gym", "attributes['nemo.gym.reward'] < 0.5")  # the UI's list
        page = phoenix.trace_url("gym", traces[0]["trace_id"])

``phoenix_venv()`` builds ``arize-phoenix`` into a tool venv once (cached, locked and
stamped like the Gym venvs: about 630 MB, 40 s).  ``phoenix serve`` runs as its own
process group with its SQLite (``phoenix.db``) under the work directory, on two loopback
ports of ``ports.py`` (HTTP: UI, REST, GraphQL, OTLP/HTTP at ``/v1/traces``; OTLP/gRPC),
its own telemetry pixels, web fonts, agent assistant and MCP server off: no network, no
account.  It is ready (``/readyz``: its database answers) 15-20 s after the start, fresh
or on its database again, on two idle cores; 40-50 s on busy ones.
``./run-demo --backend phoenix`` uses the same class.

What Phoenix 20.26.1 does with what it is sent (each checked against a running server,
with spans sent by the OpenTelemetry SDK over OTLP/HTTP and gRPC):

- Project: the ``x-project-name`` header (OTLP/HTTP only; gRPC ignores it), else the
  resource attribute ``openinference.project.name`` (both transports; the header wins
  when both are there), else ``default``.  ``otlp_env`` sets both.
- Span kind: OpenInference's ``openinference.span.kind`` when present; else it is
  derived at ingest from the GenAI conventions: ``gen_ai.operation.name`` ``invoke_agent``
  -> AGENT, ``chat`` -> LLM, ``execute_tool`` -> TOOL (no GenAI operation gives EVALUATOR
  or CHAIN); with neither, UNKNOWN.  ``gen_ai.usage.input_tokens``/``output_tokens``
  become ``llm.token_count.prompt``/``completion``/``total``, ``gen_ai.request.model``
  ``llm.model_name``, ``gen_ai.tool.name`` ``tool.name`` (TOOL spans only); the derived
  attributes are stored beside the sent ones and never override them.
- Tokens: a span's own counts are taken only when its kind is LLM; every span carries
  the sum over its subtree (``cumulativeTokenCountTotal``: the trace list's "total
  tokens").  Counts on an AGENT root are not added again; counts on LLM spans nested in
  LLM spans are (one model call as an LLM CLIENT span over an LLM SERVER span counts
  twice in the list and in the trace filter's ``token_count_total``; the project's total
  counts only LLM spans without an LLM child).
- Arbitrary attributes (``nemo.gym.reward`` double, ``nemo.gym.task.index`` int) are
  stored nested (``{"nemo": {"gym": {"reward": ...}}}``), listed on the span's page and
  filterable, but cannot be a column of the trace list, nor its sort key.  The trace
  list's filter (GraphQL ``traceFilterCondition``, the UI's ``?traceFilterCondition=``)
  reads the root span's: ``attributes['nemo.gym.reward'] < 0.5``; the span list's
  (``filterCondition``, ``?spanFilterCondition=``) wants ``nemo.gym.reward < 0.5`` or
  ``attributes['nemo']['gym']['reward'] < 0.5`` (``attributes['nemo.gym.reward']``
  silently matches nothing there).
- Span events are stored and shown (a span's Events tab; REST and GraphQL return them);
  a ``gen_ai.evaluation.result`` event is not turned into an annotation.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.harness.readme import recipe

from .gym_install import tool_venv
from .ports import reserve_ports
from .ui_server import UiServer

PHOENIX_REQUIREMENT = "arize-phoenix==20.26.1"  # the newest on the index (2026-12)
PROJECT_HEADER = "x-project-name"  # OTLP/HTTP only
PROJECT_RESOURCE_ATTRIBUTE = "openinference.project.name"  # OTLP/HTTP and gRPC

# The UI's trace list (its TracesTableQuery, cut down): root spans of the traces that pass
# the trace filter, newest first, with the columns the list shows.
_TRACE_LIST = """
query TraceList($id: ID!, $first: Int!, $traceFilterCondition: String) {
  node(id: $id) {
    ... on Project {
      rootSpans: spans(first: $first, sort: {col: startTime, dir: desc}, filterCondition: "parent_span is None",
                       traceFilterCondition: $traceFilterCondition) {
        edges { node {
          name spanKind statusCode statusMessage startTime latencyMs metadata
          tokenCountTotal cumulativeTokenCountTotal cumulativeTokenCountPrompt cumulativeTokenCountCompletion
          spanId trace { traceId numSpans }
        } }
      }
    }
  }
}
"""

_SPAN_LIST = """
query SpanList($id: ID!, $first: Int!, $filterCondition: String) {
  node(id: $id) {
    ... on Project {
      spans(first: $first, sort: {col: startTime, dir: asc}, filterCondition: $filterCondition) {
        edges { node {
          name spanKind statusCode parentId spanId tokenCountTotal cumulativeTokenCountTotal
          trace { traceId }
        } }
      }
    }
  }
}
"""


def phoenix_venv() -> pathlib.Path:
    return tool_venv("phoenix", [PHOENIX_REQUIREMENT], check="import phoenix.server.main")


class PhoenixServer(UiServer):
    """``phoenix serve`` with its own SQLite under ``workdir`` on free loopback ports
    (ui_server.py)."""

    label = "phoenix serve"
    ready_path = "/readyz"  # its database answers
    log_name = "phoenix-server.log"

    def __init__(
        self,
        workdir: os.PathLike[str] | str,
        port: int | None = None,
        grpc_port: int | None = None,
        start_timeout: float = 240.0,
    ) -> None:
        free = iter(reserve_ports(2)) if port is None or grpc_port is None else iter(())
        super().__init__(workdir, port or next(free), start_timeout)
        self.grpc_port = grpc_port or next(free)
        self.venv = phoenix_venv()
        self._project_ids: dict[str, str] = {}

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        return [str(self.venv / "bin" / "phoenix"), "serve"]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in super().environment().items() if not k.startswith("PHOENIX_")}
        env.update(
            {
                "PHOENIX_WORKING_DIR": str(self.workdir),  # its SQLite: <workdir>/phoenix.db
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_PORT": str(self.port),
                "PHOENIX_GRPC_PORT": str(self.grpc_port),
                "PHOENIX_TELEMETRY_ENABLED": "false",  # the UI's FullStory and Scarf pixels
                "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",  # no web fonts, no WASM sandbox download
                "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
                "PHOENIX_ENABLE_MCP_SERVER": "false",
                "PHOENIX_LOG_MIGRATIONS": "false",  # else every CREATE TABLE of the migrations is logged
            }
        )
        return env

    # ---- the recipe -------------------------------------------------------------------

    def otlp_env(self, project: str, protocol: str = "http/protobuf") -> dict[str, str]:
        """The recipe: Gym's processes export straight to Phoenix, into ``project``.
        Over OTLP/HTTP the header chooses the project; over gRPC (``protocol="grpc"``)
        only the resource attribute can.  Traces only: Phoenix takes no metrics or logs
        (``/v1/metrics`` and ``/v1/logs`` answer 405)."""
        env = recipe("Arize Phoenix")  # the README's, this server's address and project in it
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://127.0.0.1:6006/v1/traces", env
        assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"].startswith(PROJECT_HEADER + "="), env
        env.update(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_RESOURCE_ATTRIBUTES": f"{PROJECT_RESOURCE_ATTRIBUTE}={project}",
            }
        )
        if protocol == "grpc":
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = self.grpc_endpoint
            del env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
        else:
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = self.url + "/v1/traces"
            env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"{PROJECT_HEADER}={project}"
        return env

    # ---- the REST and GraphQL APIs -----------------------------------------------------

    def _request(self, path: str, *, params: Any = None, body: Any = None) -> Any:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            url, data=data, method="POST" if data else "GET", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def projects(self) -> list[dict[str, Any]]:
        """``GET /v1/projects``: ``{"id", "name", "description"}`` each."""
        return self._request("/v1/projects", params={"limit": 1000})["data"]

    def project_id(self, project: str) -> str:
        """The project's GlobalID (``/projects/<id>`` in the UI, ``node(id:)`` in GraphQL)."""
        if project not in self._project_ids:
            path = "/v1/projects/" + urllib.parse.quote(project, safe="")
            self._project_ids[project] = self._request(path)["data"]["id"]
        return self._project_ids[project]

    def spans(self, project: str, **filters: Any) -> list[dict[str, Any]]:
        """Every span of the project, oldest first, through ``GET /v1/projects/{project}/spans``
        (paged by ``next_cursor``); ``[]`` while the project does not exist.  ``filters``
        are the endpoint's own: ``trace_id``, ``parent_id="null"`` (roots), ``name``,
        ``span_kind``, ``status_code``, ``attribute="nemo.gym.task.index:3"`` (equality only).
        A span: ``{"id", "name", "context": {"trace_id", "span_id"}, "span_kind",
        "parent_id", "start_time", "end_time", "status_code", "status_message",
        "attributes" (flat, dotted keys), "events": [{"name", "timestamp", "attributes"}]}``."""
        out: list[dict[str, Any]] = []
        params = {"limit": 1000, "sort": "start_time", "order": "asc", **filters}
        path = "/v1/projects/" + urllib.parse.quote(project, safe="") + "/spans"
        while True:
            try:
                page = self._request(path, params=params)
            except urllib.error.HTTPError as error:
                if error.code == 404 and not out:
                    return []
                raise
            out.extend(page["data"])
            if not page.get("next_cursor"):
                return out
            params["cursor"] = page["next_cursor"]

    def traces(self, project: str) -> list[dict[str, Any]]:
        """The project's spans by trace, in order of first span: ``{"trace_id", "root"
        (the span without a parent, or None while it has not arrived), "spans"}``."""
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for span in self.spans(project):
            by_trace.setdefault(span["context"]["trace_id"], []).append(span)
        return [
            {"trace_id": trace_id, "root": next((s for s in spans if s["parent_id"] is None), None), "spans": spans}
            for trace_id, spans in by_trace.items()
        ]

    def wait_for_traces(
        self, project: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 90.0
    ) -> list[dict[str, Any]]:
        """``traces(project)`` once ``predicate`` holds of it; whatever is there at timeout.
        Phoenix answers an OTLP request before it stores the spans (a background task), so
        a span is readable a moment after its export returned."""
        deadline = time.monotonic() + timeout
        while True:
            traces = self.traces(project)
            if predicate(traces) or time.monotonic() > deadline:
                return traces
            time.sleep(1)

    def rollout_traces(self, project: str) -> list[dict[str, Any]]:
        """The traces rooted at an agent's ``POST /run`` (one per rollout); the fleet's
        start-up trace (``gym.startup``) lands in the same project and is left out."""
        return [t for t in self.traces(project) if t["root"] is not None and t["root"]["name"] == "POST /run"]

    def wait_for_rollouts(self, project: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The rollout traces once ``count`` of them have their root and no span arrived
        between two looks; whatever is there at timeout."""
        previous = None
        deadline = time.monotonic() + timeout
        while True:
            traces = self.rollout_traces(project)
            shape = sorted((t["trace_id"], len(t["spans"])) for t in traces)
            if (len(traces) >= count and shape == previous) or time.monotonic() > deadline:
                return traces
            previous = shape
            time.sleep(2)

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        """The UI's own API (``POST /graphql``); raises on GraphQL errors (an invalid
        filter expression is one, with Phoenix's explanation)."""
        answer = self._request("/graphql", body={"query": query, "variables": variables})
        if answer.get("errors"):
            raise RuntimeError(f"graphql: {answer['errors']}")
        return answer["data"]

    def trace_list(self, project: str, trace_filter: str | None = None, first: int = 100) -> list[dict[str, Any]]:
        """The UI's trace list: each trace's root span, newest first, as its Traces tab
        queries it (``filterCondition: "parent_span is None"``, the user's expression as
        ``traceFilterCondition``: ``attributes['nemo.gym.reward'] < 0.5``, ``error_count
        > 0``, ``token_count_total > 100``, ``any(span.span_kind == 'TOOL' for span in
        spans)``).  A row: ``name``, ``spanKind`` (lower case: ``agent``), ``statusCode``,
        ``latencyMs``, ``metadata`` (the root's ``metadata`` attribute), ``tokenCountTotal``
        (its own), ``cumulativeTokenCountTotal`` (the "total tokens" column), ``spanId``,
        ``trace {traceId numSpans}``."""
        data = self.graphql(_TRACE_LIST, id=self.project_id(project), first=first, traceFilterCondition=trace_filter)
        return [edge["node"] for edge in data["node"]["rootSpans"]["edges"]]

    def span_list(self, project: str, span_filter: str | None = None, first: int = 1000) -> list[dict[str, Any]]:
        """The UI's span list (its Spans tab's ``filterCondition``: ``span_kind == 'LLM'``,
        ``nemo.gym.reward < 0.5``), oldest first."""
        data = self.graphql(_SPAN_LIST, id=self.project_id(project), first=first, filterCondition=span_filter)
        return [edge["node"] for edge in data["node"]["spans"]["edges"]]

    # ---- the UI ------------------------------------------------------------------------

    def traces_url(self, project: str, trace_filter: str | None = None) -> str:
        """The project's trace list (the Traces tab), filtered as the UI's filter box does."""
        url = f"{self.url}/projects/{self.project_id(project)}/traces"
        if trace_filter:
            url += "?" + urllib.parse.urlencode({"traceFilterCondition": trace_filter})
        return url

    def trace_url(self, project: str, trace_id: str) -> str:
        """One trace: the list with the trace's panel open (span tree, root span's
        attributes).  ``<url>/redirects/traces/<trace_id>`` leads there too, unknowing of
        the project."""
        return f"{self.url}/projects/{self.project_id(project)}/traces/{trace_id}"
