"""``gym-autoinstr doctor`` names what would stop tracing, and how to fix it.

Each diagnosis runs ``doctor --json`` in a fresh interpreter (the runner venv's, with
nemo-gym 0.4.0) whose environment was bent one way: an exporter package that will not
import, a Gym version we do not know, a Gym whose target is gone, a span-group typo,
Gym's own telemetry live.  Breakage is simulated inside that interpreter by a short
``-c`` prelude, never by a ``sitecustomize``: the doctor must see exactly what a Gym
process would.  The interpreters are forks of one that imported Gym's third-party
dependencies once (tests/harness/forkserver.py; about 1 s a diagnosis instead of 5): Gym,
OpenTelemetry's SDK and exporters and this project are imported fresh in each.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from gym_autoinstr.pointcuts import POINTCUTS, PROCESS_PATCHES, version_applies
from tests.harness.forkserver import ForkServer
from tests.harness.gym_targets import clean_environment

HTTP_EXPORTER = "opentelemetry.exporter.otlp.proto.http"
GRPC_EXPORTER = "opentelemetry.exporter.otlp.proto.grpc"
COLLECTOR = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.invalid:4318"}

BLOCK_IMPORTS = """
import importlib.abc

class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == blocked or name.startswith(blocked + ".") for blocked in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
"""


# Gym's third-party imports, the bulk of a diagnosis's time (none reads the settings varied here)
PRELOAD = (
    "pandas", "wandb", "ray", "openai", "numpy", "fastapi", "aiohttp", "pydantic", "hydra", "omegaconf", "rich",
    "pydot", "pyarrow", "urllib3", "httpx", "click", "starlette", "uvicorn", "yaml", "requests", "psutil", "grpc",
    "google.protobuf",
)  # fmt: skip
_FORKS: ForkServer | None = None


@pytest.fixture(scope="module", autouse=True)
def _fork_server():
    global _FORKS
    with ForkServer(sys.executable, PRELOAD, clean_environment()) as server:
        _FORKS = server
        yield server
    _FORKS = None


def doctor(
    tmp_path,
    *,
    prelude: str = "",
    env: dict[str, str] | None = None,
    pythonpath: str = "",
    as_json: bool = True,
    verbose: bool = False,
):
    """Run ``gym-autoinstr doctor --offline`` after ``prelude``; return (exit code, JSON or text, stderr).
    Offline: these cases are about the install; the live endpoint check has its own tests
    (test_doctor_pipeline.py)."""
    arguments = ["doctor", "--offline", "--json"] if as_json else ["doctor", "--offline"]
    arguments += ["--verbose"] if verbose else []
    code = (
        f"import sys\n{textwrap.dedent(prelude)}\n"
        f"from gym_autoinstr.commands.cli import main\nsys.exit(main({arguments!r}))\n"
    )
    environ = clean_environment(**(env or {}))
    if pythonpath:
        environ["PYTHONPATH"] = pythonpath
    workdir = tmp_path / "cwd"
    workdir.mkdir(exist_ok=True)
    result = _FORKS.run(code, env=environ, cwd=workdir, pythonpath=pythonpath.split(os.pathsep) if pythonpath else ())
    if not as_json:
        return result.returncode, result.stdout, result.stderr
    try:
        report = json.loads(result.stdout)
    except ValueError:
        pytest.fail(
            f"doctor printed no JSON (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        )
    return result.returncode, report, result.stderr


def problems(report, severity=None, subject=None):
    return [
        p
        for p in report["problems"]
        if (severity is None or p["severity"] == severity) and (subject is None or p["subject"] == subject)
    ]


def pointcut(report, name):
    (row,) = [row for row in report["pointcuts"] if row["name"] == name]
    return row


def test_a_healthy_install_is_reported_healthy(tmp_path):
    code, report, _ = doctor(tmp_path)
    assert code == 0 and report["ok"], problems(report, "error")
    assert report["gym"] == {"version": "0.4.0", "known": True, "known_range": "0.2.0 - 0.7.x"}
    assert {row["name"] for row in report["pointcuts"]} == {p.name for p in POINTCUTS}
    for row in report["pointcuts"]:
        assert row["resolved"] is row["expected"], row
    assert pointcut(report, "coexistence")["reason"] == "no module 'nemo_gym.telemetry'"
    assert report["startup"]["distro"]["selected"] == "gym_autoinstr"
    assert report["startup"]["configurator"]["selected"] == "gym_autoinstr"
    assert "nemo_gym" in report["startup"]["instrumentors"]["enabled"]
    # No exporter configured: the embedded default writes files beside the orchestrator.
    assert [(e["name"], e["writable"]) for e in report["exporters"]] == [("files", True)]
    assert problems(report, "info", "exporter")[0]["fix"].startswith("read them with `gym-autoinstr view")
    assert report["span_groups"] == {
        "variable": None,
        "spec": None,
        "enabled": ["http_client", "job", "ray", "rollout", "server", "startup"],
        "unknown": [],
    }
    assert report["native_telemetry"]["present"] is False
    assert report["ray"]["active"] is True and report["ray"]["ray_version"]
    # gym env start would pin our packages into every server venv it builds
    venvs = report["server_venvs"]
    assert venvs["will_install"] is True
    assert any(
        r.startswith("-e ") or r.startswith("gym-autoinstr") or "gym-autoinstr" in r for r in venvs["requirements"]
    )
    assert any(r.startswith("opentelemetry-sdk==") for r in venvs["requirements"])
    assert not problems(report, "error") and not problems(report, "warning")
    # this checkout is installed editable: a path servers on other hosts cannot install
    assert venvs["local_paths"]["gym-autoinstr"] and venvs["override"] is None
    (local,) = [p for p in problems(report, "info", "server venvs") if "from a path on this machine" in p["problem"]]
    assert "GYM_AUTOINSTR_SERVER_REQUIREMENT" in local["fix"]
    assert "index" not in local["fix"] and "==" not in local["fix"]  # gym-autoinstr is on no package index
    assert not list((tmp_path / "cwd").iterdir()), "importing Gym wrote into the working directory"


def test_the_process_wide_patches_are_listed_after_the_pointcuts(tmp_path):
    """Every PROCESS_PATCHES row, whether its target exists here, and whether it is applied in
    the doctor's own process (never: it configures no pipeline and makes no Gym session)."""
    here = str(pathlib.Path(__file__).resolve().parents[2])  # this checkout's package, whatever is installed
    _, report, _ = doctor(tmp_path, pythonpath=here)
    rows = {row["name"]: row for row in report["process_patches"]}
    assert list(rows) == [row.name for row in PROCESS_PATCHES]
    assert {name: (row["resolved"], row["applied_here"]) for name, row in rows.items()} == {
        row.name: (True, 0) for row in PROCESS_PATCHES
    }
    assert rows["asyncio.wrap_future"]["pointcut"] == "ray.await_error"
    _, text, _ = doctor(
        tmp_path,
        prelude=f"BLOCKED = [{GRPC_EXPORTER!r}]\n" + BLOCK_IMPORTS,
        pythonpath=here,
        as_json=False,
        verbose=True,
    )
    listed = text.split("\nprocess-wide patches", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    names = [line.split()[0] for line in listed if not line.startswith("    ")]
    assert names == [row.name for row in PROCESS_PATCHES]
    assert text.index("\npointcuts\n") < text.index("\nprocess-wide patches")
    (grpc,) = [line for line in listed if line.startswith("  otlp.grpc.encode_spans ")]
    assert "absent: " in grpc and GRPC_EXPORTER in grpc
    (semaphores,) = [i for i, line in enumerate(listed) if line.startswith("  asyncio.semaphore_class ")]
    assert "advice/concurrency.py watch_server" in listed[semaphores + 1]


def test_a_configured_collector_is_reached_over_the_otlp_exporter(tmp_path):
    code, report, _ = doctor(tmp_path, env=COLLECTOR)
    assert code == 0 and report["ok"]
    assert [(e["name"], e["protocol"], e["importable"]) for e in report["exporters"]] == [
        ("otlp", "http/protobuf", True)
    ]
    assert not problems(report, subject="exporter")


def test_metric_and_log_exporters_are_reported_beside_the_span_exporter(tmp_path):
    _, report, _ = doctor(tmp_path)  # the embedded default: metrics to the run directory, logs off
    assert [(e["name"], e["used"]) for e in report["metric_exporters"]] == [("files", "files")]
    assert report["log_exporters"] == []
    _, report, _ = doctor(
        tmp_path, env={**COLLECTOR, "NEMO_GYM_OTEL_LOGS_ENABLED": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert [(e["name"], e["used"]) for e in report["metric_exporters"]] == [("otlp", "grpc")]
    assert [(e["name"], e["used"]) for e in report["log_exporters"]] == [("otlp", "grpc")]
    _, text, _ = doctor(
        tmp_path,
        env={**COLLECTOR, "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_LOGS_EXPORTER": "console"},
        as_json=False,
    )
    assert "metrics       prometheus  (NOT importable)" in text and "logs          console  (importable)" in text
    assert "OTEL_METRICS_EXPORTER names 'prometheus'" in text


def test_an_unwritable_run_directory_means_tracing_would_not_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, report, _ = doctor(tmp_path, env={"GYM_AUTOINSTR_OUTPUT_DIR": str(blocker / "runs")})
    assert code == 1
    (error,) = problems(report, "error")
    assert error["subject"] == "exporter" and "GYM_AUTOINSTR_OUTPUT_DIR" in error["fix"]


SECTIONS = [
    "nemo-gym",
    "pointcuts",
    "patches",
    "start-up",
    "exporter",
    "metrics",
    "logs",
    "span groups",
    "job traces",
    "client spans",
    "Gym telemetry",
    "server venvs",
    "ray",
    "settings",
    "fast path",
]


def _config_is_ambiguous() -> bool:
    """Gym's --config stops opentelemetry-instrument where its SDK has OTEL_CONFIG_FILE too (newer SDKs)."""
    from gym_autoinstr.setup import command_line

    return bool(command_line.ambiguous("--config", command_line.instrument_options()))


def _sections() -> list[str]:
    """SECTIONS, and how to start Gym after the start-up where opentelemetry-instrument would stop at --config."""
    sections = list(SECTIONS)
    if _config_is_ambiguous():
        sections.insert(sections.index("start-up") + 1, "command line")
    return sections


def test_the_text_report_is_the_verdict_the_problems_and_a_line_per_section(tmp_path):
    code, text, stderr = doctor(tmp_path, as_json=False)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "tracing would work" and lines[1] == ""
    assert [line[:14].strip() for line in lines[2:-2]] == _sections()  # no problem to list here: no warning
    assert lines[2] == "nemo-gym      0.4.0  (known); gym-autoinstr 0.1.0 on Python " + sys.version.split()[0]
    # the details are behind --verbose: module paths, every pointcut, the notes (INFO)
    assert not any(detail in text for detail in (".py", "nemo_gym.", "INFO:")), text
    assert lines[-2:] == [
        "",
        "more: gym-autoinstr doctor --verbose (every pointcut, process-wide patch and fast-path part; "
        f"{3 if _config_is_ambiguous() else 2} note(s))",
    ]
    assert "tracing would" not in "\n".join(lines[1:])  # said once, first
    assert "doctor:" not in stderr  # no progress when nobody watches (stderr is no terminal)
    code, full, _ = doctor(tmp_path, as_json=False, verbose=True)
    assert full.splitlines()[0] == "tracing would work" and "more: " not in full
    assert "INFO: server venvs: " in full and "\npointcuts\n  egress " in full
    assert "by fastpath/batching.py accepts_encoded (make_processor)" in full


def test_a_failing_report_names_the_first_fix_in_its_first_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"GYM_AUTOINSTR_OUTPUT_DIR": str(blocker / "runs"), "GYM_AUTOINSTR_FLUSH_TIMEOUT_MS": "soon"}
    code, report, _ = doctor(tmp_path, env=env)
    (error,) = problems(report, "error")
    code, text, _ = doctor(tmp_path, env=env, as_json=False)
    assert code == 1
    first, *rest = text.splitlines()
    assert first == f"tracing would NOT work: {error['fix']}"
    # the problems follow, errors before warnings (notes only with --verbose), then a line per section
    listed = [line.split(":", 1)[0] for line in rest if line.startswith(("ERROR:", "WARNING:", "INFO:"))]
    assert listed == ["ERROR", "WARNING"]
    assert rest[1].startswith("ERROR: exporter: ") and rest[2].startswith("  fix: ")
    assert rest.index("") < max(i for i, line in enumerate(rest) if line.startswith("  fix: ")) < len(rest) - 1
    assert [line[:14].strip() for line in rest[6:-2]] == _sections()
    notes = 2 if _config_is_ambiguous() else 1
    assert rest[-1].endswith(f"(every pointcut, process-wide patch and fast-path part; {notes} note(s))")


def _doctor_on_a_terminal(tmp_path, *arguments: str) -> tuple[int, str, str]:
    """The doctor with stderr on a pseudo-terminal (a person watching), stdout a pipe."""
    import pty

    controller, terminal = pty.openpty()
    workdir = tmp_path / "cwd"
    workdir.mkdir(exist_ok=True)
    code = "import sys\nfrom gym_autoinstr.commands.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "doctor", "--offline", *arguments],
        cwd=workdir,
        env=clean_environment(),
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    stdout, _ = process.communicate(timeout=120)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other side closed: all read
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    return process.returncode, stdout, seen.decode(errors="replace")


def test_progress_goes_to_a_watching_terminal_and_json_stays_clean(tmp_path):
    code, stdout, terminal = _doctor_on_a_terminal(tmp_path, "--json")
    assert code == 0
    assert json.loads(stdout)["ok"] is True  # stdout: the JSON alone
    progress = [line for line in terminal.splitlines() if line.startswith("doctor: ")]
    assert progress[0] == "doctor: importing Gym and resolving the pointcuts (a few seconds)..."
    assert "doctor: checking the start-up: distro, configurator, exporters..." in progress
    assert not any("sending an empty export" in line for line in progress)  # --offline: nothing sent
    code, stdout, terminal = _doctor_on_a_terminal(tmp_path)
    assert code == 0 and stdout.splitlines()[0] == "tracing would work" and "doctor: " not in stdout


def test_a_missing_exporter_package_falls_back_to_the_other_protocol(tmp_path):
    code, report, _ = doctor(tmp_path, prelude=f"BLOCKED = [{HTTP_EXPORTER!r}]\n" + BLOCK_IMPORTS, env=COLLECTOR)
    assert code == 0 and report["ok"]
    (exporter,) = report["exporters"]
    assert exporter["importable"] is False and exporter["used"] == "grpc"
    (warning,) = [w for w in problems(report, "warning", "exporter") if "spans" in w["problem"]]
    assert "pip install opentelemetry-exporter-otlp-proto-http" in warning["fix"]
    # metrics have no such fallback: the doctor says they are not exported
    (metrics,) = report["metric_exporters"]
    assert (metrics["protocol"], metrics["importable"]) == ("http/protobuf", False)
    assert [w for w in problems(report, "warning", "exporter") if "no metrics are exported" in w["problem"]]


def test_no_importable_exporter_means_tracing_would_not_work(tmp_path):
    code, report, _ = doctor(
        tmp_path, prelude=f"BLOCKED = [{HTTP_EXPORTER!r}, {GRPC_EXPORTER!r}]\n" + BLOCK_IMPORTS, env=COLLECTOR
    )
    assert code == 1 and not report["ok"]
    (error,) = problems(report, "error")
    assert error["subject"] == "exporter" and "never exported" in error["problem"]
    assert error["fix"] == "pip install opentelemetry-exporter-otlp-proto-http"


def test_the_grpc_protocol_checks_the_grpc_package(tmp_path):
    code, report, _ = doctor(
        tmp_path,
        prelude=f"BLOCKED = [{GRPC_EXPORTER!r}]\n" + BLOCK_IMPORTS,
        env={**COLLECTOR, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    )
    assert code == 0
    (exporter,) = report["exporters"]
    assert exporter["protocol"] == "grpc" and exporter["used"] == "http/protobuf"
    assert "pip install opentelemetry-exporter-otlp-proto-grpc" in problems(report, "warning", "exporter")[0]["fix"]


def test_an_unknown_gym_version_is_named_and_still_checked(tmp_path):
    # A newer metadata record first on the path: Python reports that version for nemo-gym.
    overlay = tmp_path / "overlay"
    record = overlay / "nemo_gym-0.9.0.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-gym\nVersion: 0.9.0\n")
    code, report, _ = doctor(tmp_path, pythonpath=str(overlay))
    assert report["gym"]["version"] == "0.9.0" and report["gym"]["known"] is False
    (warning,) = problems(report, "warning", "nemo-gym")
    assert "outside the releases" in warning["problem"]
    assert pointcut(report, "egress")["resolved"] is True
    # Every non-optional pointcut still resolves (the code is 0.4.0's): tracing works.
    assert code == 0 and report["ok"]
    # Optional pointcuts the table promises for 0.9.0, which this Gym lacks, are warnings.
    promised = {
        p.name
        for p in POINTCUTS
        if p.optional and version_applies(p.versions, "0.9.0") and not version_applies(p.versions, "0.4.0")
    }
    assert promised >= {"coexistence"}
    assert {p["subject"] for p in problems(report, "warning")} == {"nemo-gym"} | {
        f"pointcut {name}" for name in promised
    }


def test_a_pointcut_gone_from_gym_is_an_error_with_a_fix(tmp_path):
    prelude = """
    import os, tempfile
    here = os.getcwd()
    os.chdir(tempfile.mkdtemp())
    import nemo_gym.server_utils
    os.chdir(here)
    del nemo_gym.server_utils.request   # a Gym where the egress target is gone
    """
    code, report, _ = doctor(tmp_path, prelude=prelude)
    assert code == 1 and not report["ok"]
    row = pointcut(report, "egress")
    assert row["resolved"] is False and row["expected"] is True
    assert "request" in row["reason"]
    (error,) = problems(report, "error", "pointcut egress")
    assert "nemo_gym.server_utils.request not found in nemo-gym 0.4.0" in error["problem"]
    assert error["fix"]
    assert pointcut(report, "ingress")["resolved"] is True  # the rest is still applied


@pytest.mark.parametrize(
    "env, closest",
    [
        ({"GYM_AUTOINSTR_SPAN_GROUPS": "defualt"}, "default"),
        ({"GYM_AUTOINSTR_SPAN_GROUPS": "default, Sandboxx"}, "sandbox"),
        ({"NEMO_GYM_OTEL_SPAN_GROUPS": "per_rollout,bogus"}, None),
    ],
)
def test_a_span_group_spec_with_an_unknown_name_means_the_default_preset(tmp_path, env, closest):
    code, report, _ = doctor(tmp_path, env=env)
    assert code == 0  # the default preset is used: tracing works
    ((variable, spec),) = env.items()
    assert report["span_groups"]["variable"] == variable and report["span_groups"]["spec"] == spec
    assert report["span_groups"]["enabled"] == ["http_client", "job", "ray", "rollout", "server", "startup"]
    (problem,) = problems(report, subject="span groups")
    assert problem["severity"] == "warning" and "default preset is used" in problem["problem"]
    assert report["span_groups"]["unknown"] == [spec.split(",")[-1].strip()]
    assert (f"did you mean {closest!r}" in problem["problem"]) is (closest is not None)


def test_span_groups_all_off_is_a_warning(tmp_path):
    code, report, _ = doctor(tmp_path, env={"GYM_AUTOINSTR_SPAN_GROUPS": "none"})
    assert code == 0 and report["span_groups"]["enabled"] == []
    assert problems(report, "warning", "span groups")


@pytest.mark.parametrize(
    "env, subject",
    [
        ({"OTEL_PYTHON_CONFIGURATOR": "nonexistent"}, "configurator"),
        ({"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi,nemo_gym"}, "instrumentor"),
        ({"OTEL_TRACES_EXPORTER": "none"}, "exporter"),
        ({"OTEL_SDK_DISABLED": "true"}, "exporter"),
    ],
)
def test_settings_that_stop_tracing_are_errors(tmp_path, env, subject):
    code, report, _ = doctor(tmp_path, env=env)
    assert code == 1
    (error,) = problems(report, "error")
    assert error["subject"] == subject and error["fix"]


def test_opentelemetry_distro_found_first_changes_the_defaults(tmp_path):
    # opentelemetry-distro (installed in the runner venv) defaults the protocol to grpc
    # and leaves the configurator to whichever is found first.
    code, report, _ = doctor(tmp_path, env={"OTEL_PYTHON_DISTRO": "distro"})
    assert code == 0
    assert report["startup"]["distro"]["selected"] == "distro"
    assert report["startup"]["configurator"]["requested"] is None
    assert report["exporters"][0]["protocol"] == "grpc"
    assert problems(report, "info", "distro")


# (report key, variable, value, mode, warned, the fix's suggestion, text line label, text for the mode)
SETTINGS = [
    (
        "job_trace",
        "GYM_AUTOINSTR_JOB_TRACE",
        None,
        "per_rollout",
        False,
        "",
        "job traces",
        "each rollout its own trace",
    ),
    ("job_trace", "GYM_AUTOINSTR_JOB_TRACE", " Single", "single", False, "", "job traces", "one trace per job"),
    (
        "job_trace",
        "GYM_AUTOINSTR_JOB_TRACE",
        "one",
        "per_rollout",
        True,
        "GYM_AUTOINSTR_JOB_TRACE=single",
        "job traces",
        "each rollout its own trace",
    ),
    ("client_spans", "GYM_AUTOINSTR_CLIENT_SPANS", None, "all", False, "", "client spans", "one per call"),
    (
        "client_spans",
        "GYM_AUTOINSTR_CLIENT_SPANS",
        " Failures",
        "failures",
        False,
        "",
        "client spans",
        "only for failed calls",
    ),
    (
        "client_spans",
        "GYM_AUTOINSTR_CLIENT_SPANS",
        "lean",
        "all",
        True,
        "GYM_AUTOINSTR_CLIENT_SPANS=failures",
        "client spans",
        "one per call",
    ),
]


@pytest.mark.parametrize("key, variable, value, mode, warned, fix, label, text", SETTINGS)
def test_a_shape_setting_is_reported(tmp_path, key, variable, value, mode, warned, fix, label, text):
    env = {} if value is None else {variable: value}
    code, report, _ = doctor(tmp_path, env=env)
    assert code == 0
    assert report[key] == {"variable": variable, "value": value, "mode": mode}
    found = problems(report, "warning", {"job_trace": "job trace", "client_spans": "client spans"}[key])
    assert bool(found) is warned
    if warned:
        assert fix in found[0]["fix"]
    _, rendered, _ = doctor(tmp_path, env=env, as_json=False)
    line = next(line for line in rendered.splitlines() if line.startswith(label))
    assert text in line and variable in line


def test_ray_propagation_is_reported_with_the_ray_version_and_why_not(tmp_path):
    code, report, _ = doctor(tmp_path, env={"GYM_AUTOINSTR_SPAN_GROUPS": "server"})
    import ray

    from gym_autoinstr.pointcuts import RAY_WORKER_POINTCUTS

    workers = report["ray"].pop("worker_pointcuts")
    assert report["ray"] == {"ray_version": ray.__version__, "active": False, "reason": "span group 'ray' is off"}
    assert any(p["subject"] == "ray" and "'ray'" in p["fix"] for p in problems(report, "info"))
    # the rows a Ray actor applies when it becomes Gym's orchestrator: all present in this Gym
    assert [row["name"] for row in workers] == [p.name for p in RAY_WORKER_POINTCUTS]
    assert all(row["resolves"] for row in workers), workers
    code, text, _ = doctor(tmp_path, as_json=False, verbose=True)
    assert f"ray           {ray.__version__}: tasks traced into the workers" in text
    assert "ray actors    Gym inside a Ray actor: " + ", ".join(f"{p.name} ok" for p in RAY_WORKER_POINTCUTS) in text


def test_the_server_requirement_setting_replaces_the_local_path(tmp_path):
    wheel = "gym-autoinstr @ https://example.invalid/gym_autoinstr-0.1.0-py3-none-any.whl"
    code, report, _ = doctor(tmp_path, env={"GYM_AUTOINSTR_SERVER_REQUIREMENT": wheel})
    venvs = report["server_venvs"]
    assert venvs["override"] == wheel and "gym-autoinstr" not in venvs["local_paths"]
    assert f"'{wheel}'" in venvs["requirements"]
    assert not [p for p in problems(report, subject="server venvs") if "gym-autoinstr (" in p["problem"]]
    # one that is not a requirement is named, as the orchestrator warns, and this machine's install is used
    code, report, _ = doctor(tmp_path, env={"GYM_AUTOINSTR_SERVER_REQUIREMENT": "--index-url http://x gym-autoinstr"})
    assert code == 0 and report["server_venvs"]["override"] is None
    (bad,) = problems(report, "warning", "server venvs")
    assert "is not one requirement" in bad["problem"] and "git+" in bad["fix"]


def test_gyms_options_that_stop_opentelemetry_instrument_are_named_with_the_fix(tmp_path):
    # Gym's `gym` command (0.4.0 here) has --config; OTEL_PYTHON_CONFIGURATOR is --configurator
    code, report, _ = doctor(tmp_path)
    section = report["command_line"]
    assert section["gym_options"] > 10
    if not _config_is_ambiguous():  # an SDK without OTEL_CONFIG_FILE: --config is --configurator's alone
        assert section["ambiguous"] == {} and not problems(report, "info", "command line")
        return
    assert section["ambiguous"] == {"--config": ["--config_file", "--configurator"]}
    (note,) = problems(report, "info", "command line")
    assert "Gym's --config (could be --config_file, --configurator)" in note["problem"]
    assert note["fix"] == (
        "end its options with -- before the command: opentelemetry-instrument -- gym eval submit --config my.yaml"
    )
    code, text, _ = doctor(tmp_path, as_json=False)
    assert (
        "command line  opentelemetry-instrument -- gym ...: without --, it stops at gym's --config "
        "('ambiguous option')" in text.splitlines()
    )
