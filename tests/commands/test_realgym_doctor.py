"""``gym-autoinstr doctor`` on a real Gym 0.7.0 (a release target, ``tests/harness/gym_targets.py``)
whose own telemetry is live: we stand down.  The doctor's other diagnoses: ``test_doctor.py``."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.commands.test_doctor import pointcut, problems
from tests.harness.gym_targets import clean_environment

pytestmark = pytest.mark.realgym


# -- Gym 0.7.0: its own telemetry -----------------------------------------------------

FAKE_NEMO_LENS = {
    "nemo/lens/__init__.py": """
        from . import handle
        class NemoLensConfig: pass
        class TelemetryHandle: pass
        def get_meter(): return None
        def get_tracer(): return None
        def setup_telemetry(*args, **kwargs): return None
    """,
    "nemo/lens/handle.py": "_INITIALIZED = False\n",
    "nemo/lens/semconv.py": "NV_DL_RANK = 'nv.dl.rank'\nNV_DL_WORLD_SIZE = 'nv.dl.world_size'\n",
}


@pytest.mark.parametrize("with_lens", [True, False], ids=["working nemo-lens", "no nemo-lens"])
def test_gym_07_own_telemetry_live_means_we_stand_down(tmp_path, with_lens):
    from tests.harness import gym_targets

    lens = tmp_path / "lens"
    for path, text in FAKE_NEMO_LENS.items():
        (lens / path).parent.mkdir(parents=True, exist_ok=True)
        (lens / path).write_text(textwrap.dedent(text))
    result = gym_targets.run_doctor(
        "0.7.0",
        cwd=str(tmp_path),
        pythonpath=[str(lens)] if with_lens else [],
        env=clean_environment(NEMO_GYM_OTEL_ENABLED="1"),
    )
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["problems"]
    assert report["gym"]["version"] == "0.7.0"
    assert pointcut(report, "coexistence")["resolved"] is True
    native = report["native_telemetry"]
    assert native["present"] and native["call_sites"] and native["enabled"]
    assert native["live"] is with_lens
    (note,) = problems(report, "info", "Gym telemetry")
    assert ("stands down" if with_lens else "inert") in note["problem"]
