"""Sandbox spans on Gym's real ``AsyncSandbox`` (and the sync ``Sandbox`` over it), driven
through a small provider that runs commands as local subprocesses."""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from gym_autoinstr.telemetry import groups
from tests.harness.servers import run_async

pytest.importorskip("nemo_gym.sandbox.api")

SECRET = "SECRET_TASK_CONTENT"
_ids = itertools.count(1)


class LocalProcessProvider:
    """A real provider: each sandbox is a temporary directory, exec is a subprocess."""

    name = "local-process"

    async def create(self, spec):
        from nemo_gym.sandbox.providers import SandboxHandle

        return SandboxHandle(sandbox_id=f"local-{next(_ids)}", provider_name=self.name, raw=tempfile.mkdtemp())

    async def exec(self, handle, command, *, cwd=None, env=None, timeout_s=None, user=None):
        from nemo_gym.sandbox.providers import SandboxExecResult

        process = await asyncio.create_subprocess_shell(
            command,
            cwd=cwd or handle.raw,
            env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except asyncio.TimeoutError:
            process.kill()
            return SandboxExecResult(stdout=None, stderr=None, return_code=-1, error_type="timeout")
        return SandboxExecResult(stdout=stdout.decode(), stderr=stderr.decode(), return_code=process.returncode)

    async def upload_file(self, handle, local_path: Path, remote_path: str) -> None:
        Path(handle.raw, remote_path).write_bytes(Path(local_path).read_bytes())

    async def download_file(self, handle, remote_path: str, local_path: Path) -> None:
        Path(local_path).write_bytes(Path(handle.raw, remote_path).read_bytes())

    async def status(self, handle):
        from nemo_gym.sandbox.providers import SandboxStatus

        return SandboxStatus.RUNNING

    async def close(self, handle) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _sandbox_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("gym.sandbox.")]


async def _session(cwd_secret: str = SECRET):
    from nemo_gym.sandbox.api import AsyncSandbox
    from nemo_gym.sandbox.providers import SandboxSpec

    sandbox = AsyncSandbox(LocalProcessProvider(), SandboxSpec(files={"task.txt": SECRET}))
    await sandbox.start()
    ok = await sandbox.exec(f"cat task.txt && echo {SECRET}", env={"TOKEN": SECRET})
    failed = await sandbox.exec(f"echo {SECRET} >&2; exit 3")
    timed_out = await sandbox.exec("sleep 5", timeout_s=0.1)
    await sandbox.stop()
    await sandbox.stop()  # already stopped: no second span
    return ok, failed, timed_out


def test_start_exec_stop_spans_with_ids_and_return_codes(instrumented, spans):
    ok, failed, timed_out = run_async(_session())
    assert SECRET in ok.stdout and failed.return_code == 3  # the sandbox works as before
    names = [s.name for s in _sandbox_spans(spans)]
    assert names == [
        "gym.sandbox.start",
        "gym.sandbox.exec",
        "gym.sandbox.exec",
        "gym.sandbox.exec",
        "gym.sandbox.stop",
    ]
    start, exec_ok, exec_failed, exec_timeout, stop = _sandbox_spans(spans)
    sandbox_id = start.attributes["nemo.gym.sandbox.id"]
    assert sandbox_id.startswith("local-")
    for span in (start, exec_ok, exec_failed, exec_timeout, stop):
        assert span.kind == SpanKind.INTERNAL
        assert span.attributes["nemo.gym.sandbox.provider"] == "local-process"
        assert span.attributes["nemo.gym.sandbox.id"] == sandbox_id
        # never the command, cwd, env or output
        assert SECRET not in repr(dict(span.attributes)) + repr(span.events)
    assert exec_ok.attributes["nemo.gym.sandbox.return_code"] == 0
    assert "nemo.gym.sandbox.error_type" not in exec_ok.attributes
    assert exec_failed.attributes["nemo.gym.sandbox.return_code"] == 3
    assert exec_timeout.attributes["nemo.gym.sandbox.error_type"] == "timeout"
    assert exec_failed.status.status_code == StatusCode.UNSET  # a failing command is a result, not an error


def test_a_provider_exception_marks_the_span(instrumented, spans):
    from nemo_gym.sandbox.api import AsyncSandbox
    from nemo_gym.sandbox.providers import SandboxSpec

    class Broken(LocalProcessProvider):
        async def create(self, spec):
            raise ConnectionError(f"cannot reach {SECRET}")

    async def start():
        with pytest.raises(ConnectionError):
            await AsyncSandbox(Broken(), SandboxSpec()).start()

    run_async(start())
    (span,) = _sandbox_spans(spans)
    assert span.name == "gym.sandbox.start"
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "ConnectionError"
    assert SECRET not in str(span.status.description) + repr(dict(span.attributes)) + repr(span.events)


def test_the_sync_sandbox_is_traced_through_the_async_one(instrumented, spans):
    from nemo_gym.sandbox.api import Sandbox
    from nemo_gym.sandbox.providers import SandboxSpec

    with Sandbox(LocalProcessProvider(), SandboxSpec()) as sandbox:
        sandbox.start()
        assert sandbox.exec("exit 0").return_code == 0
    assert [s.name for s in _sandbox_spans(spans)] == ["gym.sandbox.start", "gym.sandbox.exec", "gym.sandbox.stop"]


def test_sandbox_group_off_means_zero_spans_and_a_working_sandbox(instrumented, spans, monkeypatch):
    monkeypatch.setattr(groups, "ENABLED", groups.PRESETS["per_rollout"])
    ok, failed, _ = run_async(_session())
    assert SECRET in ok.stdout and failed.return_code == 3
    assert spans.get_finished_spans() == ()
