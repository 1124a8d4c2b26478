"""Under ``opentelemetry-instrument``, the Python processes a traced process spawns start
with OpenTelemetry's sitecustomize too (how ``gym env start``'s servers get traced).
Contrib before 0.63b0 takes its directory off ``PYTHONPATH`` at start-up, for good; our
``opentelemetry_post_instrument`` hook puts it back (``setup/distro.py``).  Run for real:
a process under the installed ``opentelemetry-instrument`` spawns a grandchild, which
reports where its sitecustomize came from."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

CHILD = """
import os, subprocess, sys
grandchild = subprocess.run(
    [sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"],
    capture_output=True, text=True, check=True,
)
print("PYTHONPATH=" + os.environ.get("PYTHONPATH", ""))
print("GRANDCHILD=" + grandchild.stdout.strip())
"""


def test_a_spawned_python_process_runs_opentelemetrys_sitecustomize(tmp_path):
    from opentelemetry.instrumentation import auto_instrumentation

    directory = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    instrument = pathlib.Path(sys.executable).parent / "opentelemetry-instrument"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "NEMO_GYM_"))}
    env.update(
        PYTHONPATH=str(REPO),  # this checkout's gym_autoinstr, whichever venv runs the test
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    result = subprocess.run(
        [str(instrument), sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    contrib = importlib.metadata.version("opentelemetry-instrumentation")
    assert lines["PYTHONPATH"].split(os.pathsep)[0] == directory, (contrib, lines)
    assert str(REPO) in lines["PYTHONPATH"].split(os.pathsep)  # the user's entries stay
    assert os.path.dirname(lines["GRANDCHILD"]) == directory, (contrib, lines)
