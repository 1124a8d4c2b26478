"""``opentelemetry-instrument gym eval submit --config X`` stops with argparse's "ambiguous
option" before Gym starts; our entry point in ``opentelemetry_environment_variables``, which
``opentelemetry-instrument`` imports before it parses, says why and what to write instead
(``setup/command_line.py``).  Run for real: the installed ``opentelemetry-instrument``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from gym_autoinstr.setup import command_line

INSTRUMENT = pathlib.Path(sys.executable).parent / "opentelemetry-instrument"
# What the newest OpenTelemetry declares around --config (OTEL_PYTHON_CONFIGURATOR, OTEL_CONFIG_FILE).
OPTIONS = {"--configurator", "--config_file", "--service_name", "--traces_exporter", "--help", "--version"}


def _instrument(*arguments: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "NEMO_GYM_"))}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    return subprocess.run([str(INSTRUMENT), *arguments], capture_output=True, text=True, env=env, timeout=60)


def test_an_ambiguous_option_of_the_command_is_explained_before_opentelemetry_instrument_stops():
    # --traces abbreviates --traces_exporter, --traces_sampler and --traces_sampler_arg in every
    # release of the range (--config is ambiguous only where the SDK has OTEL_CONFIG_FILE)
    done = _instrument("--service_name", "demo", sys.executable, "-c", "pass", "--traces", "x")
    assert done.returncode == 2  # argparse's own error, unchanged
    ours, theirs = done.stderr.index("gym-autoinstr: ERROR: "), done.stderr.index("ambiguous option: --traces")
    assert ours < theirs
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("gym-autoinstr:")]
    assert "--traces (could be --traces_exporter, --traces_sampler, --traces_sampler_arg" in line
    assert line.endswith(
        f"Fix: end its options with -- before the command: opentelemetry-instrument --service_name demo -- "
        f"{sys.executable} -c pass --traces x"
    )


def test_with_the_double_dash_the_command_runs_and_nothing_is_said():
    done = _instrument("--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--traces", "x")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['--traces', 'x']"
    assert "gym-autoinstr: ERROR" not in done.stderr


def test_the_entry_point_adds_no_option_of_its_own():
    # opentelemetry-instrument adds --<name> for every OTEL_* name of the module: a duplicate would crash it
    assert not [name for name in dir(command_line) if name.startswith("OTEL_")]
    assert command_line.instrument_options() >= {"--configurator", "--traces_exporter", "--version"}


def test_gym_eval_submits_config_is_named_with_the_fix():
    argv = ["/venv/bin/opentelemetry-instrument", "gym", "eval", "submit", "--config", "my submit.yaml"]
    message = command_line.explanation(argv, OPTIONS)
    assert message == (
        "opentelemetry-instrument takes an option it cannot resolve for one of its own, even after the command: "
        "--config (could be --config_file, --configurator), so it stops with 'ambiguous option' before gym starts. "
        "Fix: end its options with -- before the command: "
        "opentelemetry-instrument -- gym eval submit --config 'my submit.yaml'"
    )


def test_what_parses_is_left_alone():
    explain = command_line.explanation
    assert explain(["oi", "--", "gym", "eval", "submit", "--config", "x"], OPTIONS) is None
    assert explain(["oi", "gym", "eval", "submit", "--dry-run", "--json"], OPTIONS) is None
    assert explain(["oi", "gym", "--service", "x"], OPTIONS) is None  # one match: the command's, by REMAINDER
    assert explain(["oi", "gym", "--configurator", "x"], OPTIONS) is None  # an exact name
    assert explain(["oi", "gym", "env", "start", "+config_paths=[a.yaml]"], OPTIONS) is None
    assert explain(["oi", "gym", "--", "--config", "x"], OPTIONS) is None  # the command's own --
    assert "--config=x (could be" not in (explain(["oi", "--config_file=f", "gym", "--config=x"], OPTIONS) or "")
    assert "--config (could be" in (explain(["oi", "--config_file=f", "gym", "--config=x"], OPTIONS) or "")
