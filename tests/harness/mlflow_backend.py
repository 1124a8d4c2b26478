"""A real MLflow tracking server as a trace backend: its own venv, its own process.

    with MlflowServer(workdir) as mlflow:
        experiment = mlflow.create_experiment("gym")
        env = mlflow.otlp_env(experiment)            # OTEL_EXPORTER_OTLP_TRACES_* for Gym
        ...
        traces = mlflow.search_traces(experiment)    # through MLflow's own Python client

MLflow >= 3.6 ingests OTLP/HTTP (protobuf) at ``/v1/traces`` when its backend store is
SQL (SQLite here); the experiment is chosen by the ``x-mlflow-experiment-id`` header.
There is no gRPC receiver.  ``mlflow_venv()`` builds the venv once (cached, locked and
stamped like the Gym venvs); ``./run-demo --backend mlflow`` uses the same class.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from tests.harness.readme import recipe

from .collector import free_port
from .gym_install import tool_venv
from .ui_server import UiServer

MLFLOW_REQUIREMENT = "mlflow==3.17.2"  # >= 3.6 for OTLP ingest; the newest with a matching mlflow-skinny here
EXPERIMENT_HEADER = "x-mlflow-experiment-id"


def mlflow_venv() -> pathlib.Path:
    return tool_venv("mlflow", [MLFLOW_REQUIREMENT], check="import mlflow.server, mlflow.tracing")


_SEARCH = """
import json, sys, mlflow
from mlflow import MlflowClient
mlflow.set_tracking_uri(sys.argv[1])
traces = MlflowClient().search_traces(
    locations=[sys.argv[2]], max_results=int(sys.argv[3]), filter_string=sys.argv[4] or None
)
out = []
for trace in traces:
    info = trace.info
    out.append({
        "trace_id": info.trace_id,
        "state": str(info.state),
        "token_usage": info.token_usage,
        "metadata": dict(info.trace_metadata or {}),
        "tags": dict(info.tags or {}),
        "spans": [
            {
                "name": s.name, "span_id": s.span_id, "parent_id": s.parent_id, "trace_id": s.trace_id,
                "span_type": s.span_type, "attributes": s.attributes,
            }
            for s in trace.data.spans
        ],
    })
print(json.dumps(out, default=str))
"""


class MlflowServer(UiServer):
    """``mlflow server`` with a SQLite store on a free loopback port (ui_server.py)."""

    label = "mlflow server"
    log_name = "mlflow-server.log"

    def __init__(self, workdir: os.PathLike[str] | str, port: int | None = None, start_timeout: float = 240.0) -> None:
        super().__init__(workdir, port or free_port(), start_timeout)
        self.venv = mlflow_venv()

    def command(self) -> list[str]:
        return [
            str(self.venv / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.workdir / 'mlflow.db'}",
            "--default-artifact-root",
            str(self.workdir / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in super().environment().items() if not k.startswith("MLFLOW_")}

    # ---- the REST API -----------------------------------------------------------------

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def create_experiment(self, name: str) -> str:
        return self._post("/api/2.0/mlflow/experiments/create", {"name": name})["experiment_id"]

    def otlp_env(self, experiment_id: str) -> dict[str, str]:
        """The README's recipe (``readme.recipe``), this server's address and experiment in
        it: Gym's processes export straight to MLflow over OTLP/HTTP."""
        env = recipe("MLflow")
        default = "http://127.0.0.1:5000"
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].startswith(default), env
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = self.url + env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"][len(default) :]
        assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"].startswith(EXPERIMENT_HEADER + "="), env
        env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"{EXPERIMENT_HEADER}={experiment_id}"
        return env

    def traces_url(self, experiment_id: str) -> str:
        return f"{self.url}/#/experiments/{experiment_id}/traces"

    def trace_url(self, experiment_id: str, trace_id: str) -> str:
        return f"{self.traces_url(experiment_id)}?selectedEvaluationId={trace_id}"

    def search_traces(self, experiment_id: str, max_results: int = 100, where: str = "") -> list[dict[str, Any]]:
        """Every trace of the experiment with its spans (those ``where`` selects: MLflow's
        filter string, e.g. ``tag.`nemo.gym.reward` = '1.0'``), through MLflow's own client."""
        with tempfile.TemporaryDirectory() as scratch:
            result = subprocess.run(
                [str(self.venv / "bin" / "python"), "-c", _SEARCH, self.url, experiment_id, str(max_results), where],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=scratch,
                env={
                    k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MLFLOW_")) and k != "PYTHONPATH"
                },
            )
        if result.returncode != 0:
            raise RuntimeError(f"search_traces failed:\n{result.stderr[-3000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def wait_for_traces(self, experiment_id: str, predicate, timeout: float = 90.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            traces = self.search_traces(experiment_id)
            if predicate(traces) or time.monotonic() > deadline:
                return traces
            time.sleep(2)

    def search_rollouts(self, experiment_id: str) -> list[dict[str, Any]]:
        """The experiment's rollout traces (rooted at an agent's ``POST /run``); the fleet's
        start-up trace (``gym.startup``) lands in the same experiment and is left out."""
        return rollout_traces_only(self.search_traces(experiment_id))

    def wait_for_rollouts(self, experiment_id: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The experiment's rollout traces once ``count`` of them are complete in MLflow
        (root span in: state OK) and no span arrived between two looks; whatever is there
        at timeout."""
        previous = None
        deadline = time.monotonic() + timeout
        while True:
            traces = self.search_rollouts(experiment_id)
            shape = sorted((t["trace_id"], len(t["spans"])) for t in traces)
            done = sum(1 for t in traces if t["state"].endswith("OK")) >= count
            if (done and shape == previous) or time.monotonic() > deadline:
                return traces
            previous = shape
            time.sleep(2)


def rollout_traces_only(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traces whose root is a ``POST /run`` (one per rollout)."""
    return [t for t in traces if any(s["name"] == "POST /run" and s["parent_id"] is None for s in t["spans"])]
