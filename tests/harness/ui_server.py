"""A trace UI run as a local server of its own (MLflow's, Phoenix's): started in its own
session with its log in its work directory, ready once a path of its HTTP API answers 200,
stopped by process group (only the group it started).  Subclasses say how to run it
(``command``, ``environment``), where it is ready (``ready_path``) and what it is called."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any


class UiServer:
    label = "trace UI"  # in error messages: "mlflow server", "phoenix serve"
    ready_path = "/health"
    log_name = "ui-server.log"

    def __init__(self, workdir: os.PathLike[str] | str, port: int, start_timeout: float) -> None:
        self.workdir = pathlib.Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.start_timeout = start_timeout
        self.log_path = self.workdir / self.log_name
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """This environment without OpenTelemetry's settings nor PYTHONPATH (no
        sitecustomize of ours: the UI itself is not traced)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.pop("PYTHONPATH", None)
        return env

    def start(self) -> Any:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=5) as response:
                    if response.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.label} not ready within {self.start_timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"<no {self.label} log>"
