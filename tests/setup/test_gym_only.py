"""Only Gym processes write or export (issue 47): a plain Python program under
``opentelemetry-instrument`` gets no pipeline, no file and no run directory; the same
program importing Gym is configured as it does, and what it records after is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gym_autoinstr.setup import files
from tests.harness.traces import otel_env

PLAIN = "print('plain')"
# Gym imported mid-program: the span made after it is exported.
GYM = (
    "import nemo_gym.server_utils; from opentelemetry import trace; "
    "trace.get_tracer('probe').start_span('probe.after_gym').end(); print('gym')"
)


def _instrumented(code: str, cwd: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "GYM_AUTOINSTR_"))}
    for variable in ("NEMO_GYM_CONFIG_PATH", "NEMO_GYM_OTEL_RUN_ID", "SLURM_JOB_ID"):
        env.pop(variable, None)
    env.update(env_extra)
    cwd.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "opentelemetry-instrument"), sys.executable, "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out


def _all_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*"))


def _resource_cases(requests: list) -> set[str]:
    cases = set()
    for request in requests:
        for resource_metrics in request.resource_metrics:
            for attribute in resource_metrics.resource.attributes:
                if attribute.key == "probe.case":
                    cases.add(attribute.value.string_value)
    return cases


def test_a_plain_program_exports_nothing_and_a_gym_program_everything(tmp_path, collector):
    common = otel_env(collector, "http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="200")
    plain = _instrumented(PLAIN, tmp_path / "plain", OTEL_RESOURCE_ATTRIBUTES="probe.case=plain", **common)
    assert plain.stdout.strip() == "plain" and "gym-autoinstr" not in plain.stderr
    gym = _instrumented(GYM, tmp_path / "gym", OTEL_RESOURCE_ATTRIBUTES="probe.case=gym", **common)
    assert gym.stdout.strip() == "gym"

    # the Gym program's span and metrics arrive (it ran second: the plain one's would be in)
    assert collector.sink.wait_for(lambda spans: any(s["name"] == "probe.after_gym" for s in spans), timeout=30)
    assert collector.sink.wait_for(lambda _: "gym" in _resource_cases(collector.sink.metrics_requests()), timeout=30)
    assert {span["resource"].get("probe.case") for span in collector.sink.spans()} == {"gym"}
    assert _resource_cases(collector.sink.metrics_requests()) == {"gym"}
    assert not any(
        attribute.value.string_value == "plain"
        for request in collector.sink.logs_requests()
        for resource_logs in request.resource_logs
        for attribute in resource_logs.resource.attributes
    )
    # and neither wrote a file where it ran
    assert _all_files(tmp_path / "plain") == [] and _all_files(tmp_path / "gym") == []


def test_the_embedded_file_default_writes_only_for_a_gym_program(tmp_path):
    plain = _instrumented(PLAIN, tmp_path / "plain")
    assert plain.stdout.strip() == "plain"
    assert _all_files(tmp_path / "plain") == []  # no gym-autoinstr-runs/pid-N/..., no metrics.jsonl

    _instrumented(GYM, tmp_path / "gym")
    (run,) = (tmp_path / "gym" / files.DEFAULT_PARENT).iterdir()
    spans = files.read_path(run)
    assert [span["name"] for span in spans if span["name"].startswith("probe.")] == ["probe.after_gym"]
