"""The configurator's choices: exporters, fallbacks, identity, and who gets a provider."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gym_autoinstr._log import forget_said
from gym_autoinstr.setup import configurator, identity, meters


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "NEMO_GYM_CONFIG_PATH",
        "NEMO_GYM_OTEL_RUN_ID",
        "SLURM_JOB_ID",
        "GYM_AUTOINSTR_RUN_ID",
        "GYM_AUTOINSTR_SERVICE_NAME_SUFFIX",
    ):
        monkeypatch.delenv(name, raising=False)
    forget_said()


@pytest.fixture(autouse=True)
def explicit_endpoint(monkeypatch):
    # An endpoint makes OTLP explicit; without one the embedded file default applies.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")


def _modules(exporters):
    return [type(e).__module__ for _, e in exporters]


def test_default_is_otlp_over_http(monkeypatch):
    assert _modules(configurator.span_exporters()) == ["opentelemetry.exporter.otlp.proto.http.trace_exporter"]


def test_grpc_when_asked(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert _modules(configurator.span_exporters()) == ["opentelemetry.exporter.otlp.proto.grpc.trace_exporter"]


def test_missing_exporter_package_falls_back_to_the_other_protocol(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    exporters = configurator.span_exporters()
    assert _modules(exporters) == ["opentelemetry.exporter.otlp.proto.http.trace_exporter"]
    assert "opentelemetry-exporter-otlp-proto-grpc" in caplog.text  # names the package to install


def test_no_exporter_at_all_still_leaves_a_recording_provider(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert configurator.span_exporters() == []
    provider = configurator.build_tracer_provider(identity.ProcessIdentity("server", "my_agent"))
    span = provider.get_tracer("t").start_span("x")
    assert span.is_recording() and span.get_span_context().is_valid  # context still propagates


def test_bad_protocol_and_unknown_exporter_are_named(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,zipkinish")
    exporters = configurator.span_exporters()
    assert _modules(exporters) == ["opentelemetry.exporter.otlp.proto.http.trace_exporter"]
    assert "carrier-pigeon" in caplog.text
    known = "otlp, otlp_proto_http, otlp_proto_grpc, console, none, files"  # + entry points: none more here
    assert caplog.messages[-1] == (
        f"OTEL_TRACES_EXPORTER names 'zipkinish', which no installed package provides; known here: {known}. "
        "Name those (comma-separated) in OTEL_TRACES_EXPORTER, or install the package that provides 'zipkinish'."
    )
    caplog.clear()  # and each name it lists is taken; metrics likewise
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", known.replace(" ", ""))
    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus,none")
    labels = [label.split(":")[0] for label, _ in configurator.span_exporters()]
    assert labels == known.replace(" none,", "").split(", ")
    assert meters.readers() == []
    assert caplog.messages == [
        "OTEL_METRICS_EXPORTER names 'prometheus', which is not supported here: no metrics go to it; "
        "known here: otlp, console, files, none."
    ]


def test_files_beside_otlp_writes_the_run_directory_a_local_copy(monkeypatch, tmp_path):
    """``OTEL_TRACES_EXPORTER=otlp,files``: OTLP and the run directory's file of this
    process, as the local-file default writes it (what ``gym-autoinstr view`` reads)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from gym_autoinstr.setup.files import OtlpJsonFileExporter, read_path

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,files")
    monkeypatch.setenv("GYM_AUTOINSTR_OUTPUT_DIR", str(tmp_path / "run"))
    exporters = configurator.span_exporters(identity.ProcessIdentity("server", "my_agent"))
    assert [label.split(":")[0] for label, _ in exporters] == ["otlp", "files"]
    label, exporter = exporters[1]
    assert label == f"files:{tmp_path / 'run'}" and isinstance(exporter, OtlpJsonFileExporter)
    # (a provider of its own, not the configurator's: nothing left registered for the process's flush)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("written").end()
    provider.shutdown()
    assert [span["name"] for span in read_path(tmp_path / "run")] == ["written"]


def test_server_identity_from_gyms_environment(monkeypatch):
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "math_agent_3")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rl-fleet")
    monkeypatch.setenv("GYM_AUTOINSTR_RUN_ID", "run-123")
    who = identity.detect()
    assert who == identity.ProcessIdentity("server", "math_agent_3")
    attributes = configurator.build_tracer_provider(who).resource.attributes
    assert attributes["service.name"] == "rl-fleet/math_agent_3"
    assert attributes["nemo.gym.server.name"] == "math_agent_3"
    assert attributes["nemo.gym.service_group"] == "math_agent"
    assert attributes["nemo.gym.run.id"] == "run-123"
    assert attributes["nemo.gym.version"]


def test_a_role_is_a_role_and_is_written_as_its_plain_value():
    who = identity.ProcessIdentity("ray_worker", "agent")  # given by its value
    assert who.role is identity.Role.RAY_WORKER and not who.is_gym
    assert identity.ProcessIdentity(identity.Role.SERVER, "agent").is_gym
    value = identity.resource_attributes(who)["nemo.gym.process.role"]
    assert type(value) is str and value == "ray_worker"  # a plain str in telemetry, never the enum
    assert f"{who.role} {configurator.ConfiguredBy.SKIPPED}" == "ray_worker skipped"  # logs and doctor print values
    with pytest.raises(ValueError):
        identity.ProcessIdentity("gym_server", "agent")


def test_explicit_run_ids_win_and_the_orchestrator_mints_one(monkeypatch):
    environ = {"SLURM_JOB_ID": "777", "GYM_AUTOINSTR_RUN_ID": "minted"}
    assert identity.run_id(environ) == "777"
    environ = {"NEMO_GYM_OTEL_RUN_ID": "nat", "SLURM_JOB_ID": "777"}
    assert identity.run_id(environ) == "nat"
    environ: dict[str, str] = {}
    minted = identity.run_id(environ, mint=True)
    assert minted and environ["GYM_AUTOINSTR_RUN_ID"] == minted  # children inherit it


def _detect_in(argv: list[str], env: dict[str, str]) -> str:
    code = textwrap.dedent(
        """
        import sys
        from gym_autoinstr.setup import identity
        print(identity.detect().role, identity.detect().name)
        """
    )
    result = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_roles_from_the_command_line():
    import os

    base = {k: v for k, v in os.environ.items() if k != "NEMO_GYM_CONFIG_PATH"}
    assert _detect_in([], {**base, "NEMO_GYM_CONFIG_PATH": "resources"}) == "server resources"
    assert _detect_in([], base) == "process python"


def test_ray_processes_are_recognised(monkeypatch):
    monkeypatch.setattr(
        sys,
        "orig_argv",
        ["python", "/venv/lib/python3.12/site-packages/ray/_private/workers/default_worker.py"],
        raising=False,
    )
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "agent")  # inherited from a Gym server: still Ray
    assert identity.detect().role == "ray"
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "ray.util.client.server"], raising=False)
    assert identity.detect().role == "ray"


def test_gym_cli_is_the_orchestrator(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["python", "/venv/bin/gym", "env", "start"], raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gym", "env", "start"])
    assert identity.detect() == identity.ProcessIdentity("orchestrator", "orchestrator")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/ng_collect_rollouts"])
    assert identity.detect().role == "orchestrator"


def test_the_doctor_counts_files_as_our_configurators_exporter():
    """``files`` is ours: the doctor lists it as working, not as a package nobody installed;
    under another configurator it is an unknown name as before."""
    from gym_autoinstr.commands.doctor.exporters import exporters
    from gym_autoinstr.commands.doctor.startup import OUR_CONFIGURATOR

    environ = {"OTEL_TRACES_EXPORTER": "otlp,files", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    rows, problems = exporters(environ, OUR_CONFIGURATOR)
    assert [(row["name"], row["used"]) for row in rows] == [("otlp", "http/protobuf"), ("files", "files")]
    assert problems == []
    rows, problems = exporters(environ, "someone_elses")
    assert rows[1]["used"] is None and "'files', which no installed package provides" in problems[0].problem
