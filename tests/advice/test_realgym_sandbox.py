"""Sandbox create retries counted from Gym's real OpenSandbox provider, in a real process.

Gym's ``AsyncSandbox`` drives its real ``opensandbox`` provider (with the real OpenSandbox
SDK and tenacity) against an OpenSandbox API this test serves on loopback: its first
creates answer 503 (transient: the provider retries them), then one succeeds.  The
process runs under ``opentelemetry-instrument`` and exports to the real collector (rotel);
the test reads ``gym.sandbox.create_retry_total`` there, with its provider attribute, beside
the start and the active count of the same run.  Gym 0.7.0, whose provider also calls Gym's
own (inert) ``record_sandbox_create_retry``: exactly one count per retry arrives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.metrics import latest, metric_points
from tests.harness.traces import otel_env

pytestmark = pytest.mark.realgym

VERSION = "0.7.0"
SANDBOX_EXTRAS = ["opensandbox>=1.1", "tenacity>=9.1.4"]  # nemo-gym[sandbox]'s, for this provider
FAILED_CREATES = 2
DRIVER = Path(__file__).resolve().parent.parent / "fixtures" / "sandbox_retry" / "drive.py"


class OpenSandboxApi(ThreadingHTTPServer):
    """The slice of the OpenSandbox lifecycle API a create and a kill use: ``POST
    /sandboxes`` (503 for the first ``failures``, then 202), the sandbox's endpoints,
    ``DELETE /sandboxes/{id}``."""

    daemon_threads = True

    def __init__(self, failures: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.failures = failures
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: OpenSandboxApi

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        self.wfile.write(head.encode() + data)  # one write: no Nagle delay

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            self.server.requests.append((self.command, path))
            creates = sum(1 for m, p in self.server.requests if m == "POST" and p.endswith("/sandboxes"))
        if self.command == "POST" and path.endswith("/sandboxes"):
            if creates <= self.server.failures:
                return self._answer(503, {"code": "UNAVAILABLE", "message": "no capacity yet"})
            return self._answer(
                202,
                {
                    "id": "sbx-retried",
                    "status": {"state": "Running"},
                    "createdAt": "2026-01-01T00:00:00Z",
                    "entrypoint": ["tail", "-f", "/dev/null"],
                },
            )
        endpoint = re.search(r"/sandboxes/([^/]+)/endpoints/(\d+)$", path)
        if self.command == "GET" and endpoint:
            return self._answer(200, {"endpoint": f"127.0.0.1:{self.server.port}/proxy/{endpoint.group(2)}"})
        if self.command == "DELETE":
            return self._answer(204)
        return self._answer(404, {"code": "NOT_FOUND", "message": path})

    do_GET = do_POST = do_DELETE = do_PATCH = _handle


@pytest.fixture(scope="module")
def sandbox_run(tmp_path_factory):
    from tests.harness.collector import Collector

    tmp = tmp_path_factory.mktemp("sandbox-retry")
    venv = gym_venv(VERSION, extra=SANDBOX_EXTRAS)
    api = OpenSandboxApi(FAILED_CREATES)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        with Collector(log_dir=tmp / "collector") as collector:
            env = {
                **os.environ,
                **otel_env(
                    collector, "http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="500", OTEL_SERVICE_NAME="sandbox-driver"
                ),
                "NEMO_GYM_CONFIG_DICT": "{}",
                "SANDBOX_API_PORT": str(api.port),
                "SANDBOX_CREATE_RETRIES": str(FAILED_CREATES + 1),
            }
            env.pop("PYTHONPATH", None)
            run = subprocess.run(
                [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"), str(DRIVER)],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, run.stderr[-3000:]
            result = json.loads(run.stdout.strip().splitlines()[-1])
            points = metric_points(collector.sink)
        yield result, points, api.requests, run.stderr
    finally:
        api.shutdown()


def test_each_retried_create_is_counted_once_by_provider(sandbox_run):
    result, points, requests, stderr = sandbox_run
    assert result == {"sandbox_id": "sbx-retried", "error": None}, (result, requests, stderr[-2000:])
    creates = [r for r in requests if r[0] == "POST" and r[1].endswith("/sandboxes")]
    assert len(creates) == FAILED_CREATES + 1, requests  # Gym's provider really retried
    retries = latest(points, "gym.sandbox.create_retry_total")
    assert retries, sorted({p["name"] for p in points})
    (point,) = retries.values()
    assert point["attributes"] == {"nemo.gym.sandbox.provider": "opensandbox"}
    assert point["kind"] == "sum" and point["unit"] == "{retry}"
    assert point["value"] == FAILED_CREATES  # the create that succeeded was not a retry


def test_the_same_start_is_measured_once_and_released(sandbox_run):
    _, points, _, _ = sandbox_run
    (start,) = latest(points, "gym.sandbox.startup_duration_ms").values()
    assert start["attributes"] == {"nemo.gym.sandbox.provider": "opensandbox"} and start["value"] == 1
    (active,) = latest(points, "gym.sandbox.active").values()
    assert active["value"] == 0  # started once, stopped once
