"""Every server venv Gym builds is traced: the real ``gym env start`` building its uv venvs.

Gym 0.4.0 on Python 3.12 (0.5+ cannot build uv venvs on these machines: uv has no
``--ignore-requires-python``), ``uv`` installed in the Gym venv, the uv cache shared
between runs under the test cache root.  Slow: about a minute with a warm uv cache.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess

import pytest

from tests.harness.gym_install import gym_venv
from tests.harness.traces import assert_one_connected_trace, otel_env, rollout_traces, service_of
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym

VERSION = "0.4.0"


def _pins(venv: pathlib.Path) -> list[str]:
    """The requirements the orchestrator's venv derives (run there, as Gym's parser does)."""
    code = "import json; from gym_autoinstr.advice import venvs; print(json.dumps(venvs.server_requirements()))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    return json.loads(out.stdout)


def _missing_in(orchestrator_venv: pathlib.Path, server_venv: pathlib.Path) -> list[str]:
    code = (
        "import json, pathlib, sys; from gym_autoinstr.advice import venvs; "
        "print(json.dumps(venvs.missing_in(pathlib.Path(sys.argv[1]))))"
    )
    out = subprocess.run(
        [str(orchestrator_venv / "bin" / "python"), "-c", code, str(server_venv)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return json.loads(out.stdout)


def _disk_bytes(path: pathlib.Path) -> int:
    """Blocks the venv itself occupies (files hard-linked from the uv cache count once, in the cache)."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _apparent_bytes(path: pathlib.Path) -> int:
    out = subprocess.run(
        ["du", "-s", "--apparent-size", "--block-size=1", "-l", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[0])


def _sitecustomize_dir(environ: dict[str, str]) -> str | None:
    for entry in environ.get("PYTHONPATH", "").split(os.pathsep):
        if (pathlib.Path(entry) / "sitecustomize.py").exists() and "opentelemetry" in entry:
            return entry
    return None


def test_every_server_venv_gym_builds_reports_into_one_trace(tmp_path, policy_model, collector):
    trio = GymTrio.for_version(
        VERSION,
        tmp_path / "gym",
        policy_url=policy_model.url,
        instrument=True,
        build_venvs=True,
        venv_extra=["uv"],
        env=otel_env(collector, "http/protobuf"),
    )
    with trio.start(timeout=900):
        results = trio.rollouts(3, concurrency=1)
        assert all(r["reward"] == 1.0 for r in results)
        assert collector.sink.wait_for(
            lambda spans: len(rollout_traces(spans, f"nemo-gym/{AGENT}")) >= 3, timeout=30
        ), trio.log_tail(40)
        servers = trio.server_processes()
        descendants = {name: p.children(recursive=True) for name, p in servers.items()}
        environs = {name: p.environ() for name, p in servers.items()}
        # A grandchild started by a server (a uvicorn worker, a Ray worker) inherits the
        # server's environment: started that way with the server's interpreter, it runs
        # the sitecustomize, and our configurator, from the server's own venv.
        probe = (
            "import sys; from gym_autoinstr.setup.configurator import STATE; "
            "print(STATE.configured_by, sys.modules['sitecustomize'].__file__)"
        )
        grandchildren = {}
        for name, process in servers.items():
            environ = dict(environs[name], OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
            python = str(trio.server_venv(name) / "bin" / "python")
            grandchildren[name] = subprocess.run(
                [python, "-c", probe], env=environ, cwd=process.cwd(), capture_output=True, text=True, timeout=60
            )
    log = trio.log_text()
    assert "Error in sitecustomize" not in log
    assert "Failed to auto initialize" not in log

    # Gym built a venv per server, each with our packages at the orchestrator's pins
    for name in (RESOURCES, AGENT, MODEL):
        server_venv = trio.server_venv(name)
        assert (server_venv / "bin" / "python").exists() and not server_venv.is_symlink()
        assert _missing_in(trio.venv, server_venv) == []

    # one rollout, one trace across the three server processes
    spans = collector.sink.spans()
    traces = rollout_traces(spans, f"nemo-gym/{AGENT}")
    assert len(traces) == 3
    for trace in traces.values():
        assert_one_connected_trace(trace, trio)

    # each server reported from its own venv, the one Gym built under the working directory
    executables = {}
    for span in spans:
        executables.setdefault(service_of(span), set()).add(span["resource"]["process.executable.path"])
    for name in (RESOURCES, AGENT, MODEL):
        (path,) = executables[f"nemo-gym/{name}"]
        assert pathlib.Path(path) == trio.server_venv(name) / "bin" / "python"
    assert len({next(iter(executables[f"nemo-gym/{n}"])) for n in (RESOURCES, AGENT, MODEL)}) == 3

    # start-up spans: the venv Gym built for each server was created inside that server's
    # venv_setup stage (spawn to the Python process), under the orchestrator's gym.startup
    (root,) = [s for s in spans if s["name"] == "gym.startup"]
    for name in (RESOURCES, AGENT, MODEL):
        (inside,) = [s for s in spans if s["name"] == "gym.server.startup" and service_of(s) == f"nemo-gym/{name}"]
        assert inside["trace_id"] == root["trace_id"]
        (stage,) = [
            s
            for s in spans
            if s["name"] == "gym.server.startup.venv_setup" and s["parent_span_id"] == inside["span_id"]
        ]
        created = (trio.server_venv(name) / "pyvenv.cfg").stat().st_mtime_ns
        assert stage["start_ns"] <= created <= stage["end_ns"], (name, stage["start_ns"], created, stage["end_ns"])

    # the chain reaches grandchildren: the sitecustomize stays on every server's PYTHONPATH
    for name in (RESOURCES, AGENT, MODEL):
        sitecustomize = _sitecustomize_dir(environs[name])
        assert sitecustomize, environs[name].get("PYTHONPATH")
        probe_out = grandchildren[name]
        assert probe_out.returncode == 0, probe_out.stderr
        configured_by, loaded_from = probe_out.stdout.split()
        assert configured_by == "gym_autoinstr" and loaded_from.startswith(sitecustomize)
        for child in descendants[name]:
            try:
                child_environ = child.environ()
            except Exception:
                continue  # exited since
            assert _sitecustomize_dir(child_environ) == sitecustomize

    # what it cost, per server venv (printed for docs/server-venvs.md; -s shows it)
    costs = {
        name: {
            "disk_bytes": _disk_bytes(trio.server_venv(name)),
            "apparent_bytes": _apparent_bytes(trio.server_venv(name)),
        }
        for name in (RESOURCES, AGENT, MODEL)
    }
    print(f"\nstart-up with venv builds: {trio.startup_seconds:.1f}s; per server venv: {json.dumps(costs)}")


def test_a_reused_venv_without_our_packages_is_named_and_gym_still_serves(tmp_path, policy_model, collector):
    """``skip_venv_if_present`` with a stale venv: the resources server's venv is a Gym venv
    without this project (nor OpenTelemetry's SDK)."""
    stale = gym_venv(VERSION, with_project=False)
    trio = GymTrio.for_version(
        VERSION,
        tmp_path / "gym",
        policy_url=policy_model.url,
        instrument=True,
        server_venvs={RESOURCES: stale},
        env=otel_env(collector, "http/protobuf"),
    )
    with trio:
        result = trio.rollout()
        assert result["reward"] == 1.0  # Gym still serves, that server untraced
        assert collector.sink.wait_for(
            lambda spans: any(service_of(s) == f"nemo-gym/{AGENT}" for s in spans), timeout=30
        )
    log = trio.log_text()
    stale_venv = trio.server_venv(RESOURCES)
    messages = [line for line in log.splitlines() if "reuses the venv" in line]
    assert len(messages) == 1, messages  # one message, for the one stale server
    (message,) = messages
    assert f"'{RESOURCES}'" in message and str(stale_venv) in message and "gym-autoinstr" in message
    fix = shlex.split(message.split("Fix: ", 1)[1])
    assert fix[:5] == ["uv", "pip", "install", "--python", str(stale_venv / "bin" / "python")]
    assert fix[5:] == [word for pin in _pins(trio.venv) for word in shlex.split(pin)]
    # said before the server was spawned: ahead of the resources server's first output
    if "Error in sitecustomize" in log:
        assert log.index(message) < log.index("Error in sitecustomize")
    # the rest of the fleet is traced; the stale server is not
    services = {service_of(s) for s in collector.sink.spans()}
    assert {f"nemo-gym/{AGENT}", f"nemo-gym/{MODEL}"} <= services
    assert f"nemo-gym/{RESOURCES}" not in services
