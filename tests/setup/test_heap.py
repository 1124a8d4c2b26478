"""The start-up heap freeze: in a real ``opentelemetry-instrument`` process, before Gym is
imported, and not otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = (
    "import gc, json, sys; "
    "print(json.dumps({'frozen': gc.get_freeze_count(), 'gym_loaded': 'nemo_gym' in sys.modules}))"
)


def _run(env_extra: dict) -> dict:
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        **env_extra,
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    out = subprocess.run(
        [str(bin_dir / "opentelemetry-instrument"), sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _baseline() -> int:
    # What the interpreter itself may have frozen already (CPython freezes a few hundred
    # objects of its own start-up in some builds).
    out = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_freeze_count())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(out.stdout.strip())


def test_opentelemetry_start_up_is_frozen_before_the_program_runs():
    seen = _run({})
    assert seen["frozen"] > _baseline() + 10000 and not seen["gym_loaded"]


def test_the_freeze_can_be_turned_off():
    assert _run({"GYM_AUTOINSTR_GC_FREEZE": "0"})["frozen"] == _baseline()


def test_a_manual_instrument_call_freezes_nothing():
    code = (
        "import gc; from gym_autoinstr.instrumentor import GymInstrumentor; "
        "GymInstrumentor().instrument(); print(gc.get_freeze_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) == _baseline()
