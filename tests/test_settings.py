"""The settings module: every variable gym-autoinstr reads is declared there and parsed
there, one way per kind; a bad value falls back to the default with one warning naming
the variable, the value and the fix; the doctor flags a misspelled ``GYM_AUTOINSTR_*``."""

from __future__ import annotations

import pathlib
import re

import pytest

from gym_autoinstr import settings
from gym_autoinstr._log import forget_said
from gym_autoinstr.advice import pool
from gym_autoinstr.fastpath import histograms

PACKAGE = pathlib.Path(settings.__file__).parent
SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))


def _warnings(caplog, name):
    return [r.getMessage() for r in caplog.records if name in r.getMessage()]


@pytest.fixture(autouse=True)
def _fresh():
    forget_said()
    yield
    forget_said()


# -- switches --------------------------------------------------------------------------

ON_SWITCH = settings.LEAN_SPANS
OFF_SWITCH = settings.FLEET_MEMORY


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF "])
def test_off_values_turn_a_switch_off(value):
    assert ON_SWITCH.read({ON_SWITCH.name: value}) is False


@pytest.mark.parametrize("value", ["1", "true", "Yes", " ON "])
def test_on_values_turn_a_switch_on(value):
    assert OFF_SWITCH.read({OFF_SWITCH.name: value}) is True


@pytest.mark.parametrize("environ", [{}, {ON_SWITCH.name: ""}, {ON_SWITCH.name: "  "}])
def test_unset_or_empty_keeps_the_default_silently(environ, caplog):
    assert ON_SWITCH.read(environ) is True
    same_for_off = {OFF_SWITCH.name: environ[ON_SWITCH.name]} if environ else {}
    assert OFF_SWITCH.read(same_for_off) is False
    assert not _warnings(caplog, ON_SWITCH.name) and not _warnings(caplog, OFF_SWITCH.name)


def test_a_bad_switch_value_keeps_the_default_with_one_warning_naming_the_fix(caplog):
    assert ON_SWITCH.read({ON_SWITCH.name: "maybe"}) is True
    assert ON_SWITCH.read({ON_SWITCH.name: "maybe"}) is True
    warnings = _warnings(caplog, ON_SWITCH.name)
    assert len(warnings) == 1
    assert "'maybe'" in warnings[0] and "stays on" in warnings[0] and "'false'" in warnings[0]
    assert OFF_SWITCH.read({OFF_SWITCH.name: "sure"}) is False
    (warning,) = _warnings(caplog, OFF_SWITCH.name)
    assert "'sure'" in warning and "stays off" in warning and "'true'" in warning


def test_the_levers_read_the_process_environment_at_call_time(monkeypatch):
    monkeypatch.setenv(histograms.ENV, "off")
    monkeypatch.setenv(pool.HOOKS_ENV, "no")
    assert not histograms.enabled_by_env()
    assert settings.AIOHTTP_HOOKS.read() is False
    monkeypatch.setenv(histograms.ENV, "yes")
    assert histograms.enabled_by_env()


def test_an_otel_flag_is_true_only_for_true():
    flag = settings.SDK_DISABLED
    assert flag.read({flag.name: " TRUE "}) is True
    assert flag.read({flag.name: "1"}) is False and flag.read({}) is False
    assert flag.check({flag.name: "1"}) == (False, None)  # the SDK's reading: no value is bad


# -- numbers ---------------------------------------------------------------------------


def test_a_number_in_range_is_taken():
    assert settings.FLUSH_TIMEOUT_MS.read({settings.FLUSH_TIMEOUT_MS.name: "0"}) == 0
    assert settings.FLUSH_TIMEOUT_MS.read({settings.FLUSH_TIMEOUT_MS.name: " 250.5 "}) == 250.5
    assert settings.LOOP_LAG_INTERVAL_MS.read({settings.LOOP_LAG_INTERVAL_MS.name: "3600000"}) == 3_600_000
    assert (
        settings.BSP_MAX_QUEUE_SIZE.read({settings.BSP_MAX_QUEUE_SIZE.name: "100.9"}) == 100
    )  # int(float()), as the SDK
    assert settings.RUN_MAX_GB.read({}) == 20 and settings.SEGMENT_MB.read({}) == 16


@pytest.mark.parametrize(
    "setting, bad",
    [
        (settings.FLUSH_TIMEOUT_MS, "-1"),
        (settings.FLUSH_TIMEOUT_MS, "soon"),
        (settings.LOOP_LAG_INTERVAL_MS, "0.5"),
        (settings.LOOP_LAG_INTERVAL_MS, "3600001"),
        (settings.RUN_MAX_GB, "0"),
        (settings.BSP_MAX_QUEUE_SIZE, "0.5"),
        (settings.BSP_SCHEDULE_DELAY, "nan"),
    ],
)
def test_a_bad_number_falls_back_to_the_default_with_a_warning_naming_it(setting, bad, caplog):
    assert setting.read({setting.name: bad}) == setting.default
    (warning,) = _warnings(caplog, setting.name)
    assert repr(bad) in warning and str(setting.default) in warning.split(repr(bad), 1)[1]


# -- choices and lists -----------------------------------------------------------------


def test_a_choice_takes_its_values_in_any_case_and_warns_on_others(caplog):
    choice = settings.JOB_TRACE
    assert choice.read({}) == "per_rollout"
    assert choice.read({choice.name: " Single "}) == "single"
    assert choice.read({choice.name: "one"}) == "per_rollout"
    (warning,) = _warnings(caplog, choice.name + "=")
    assert "'one'" in warning and "per_rollout, single" in warning and f"{choice.name}=single" in warning


def test_a_specific_otlp_protocol_inherits_the_generic_one_and_a_bad_one_is_named_where_it_is(caplog):
    specific, generic = settings.OTLP_TRACES_PROTOCOL, settings.OTLP_PROTOCOL
    assert specific.read({generic.name: "grpc"}) == "grpc"
    assert specific.read({generic.name: "grpc", specific.name: "http"}) == "http/protobuf"  # alias
    assert specific.read({generic.name: "pigeon"}) == "http/protobuf"
    (warning,) = _warnings(caplog, "pigeon")
    assert warning.startswith(f"{generic.name}='pigeon'")


def test_a_comma_list_drops_blanks_and_set_but_empty_is_empty():
    paths = settings.EXCLUDED_PATHS
    assert paths.read({}) == paths.default
    assert paths.read({paths.name: " /a, ,/b "}) == ("/a", "/b")
    assert paths.read({paths.name: ""}) == ()


def test_excluded_paths_that_could_never_match_a_request_fall_back_to_the_default(caplog):
    paths = settings.EXCLUDED_PATHS
    assert paths.read({paths.name: "/a,health"}) == paths.default  # a request's path always starts with /
    (warning,) = _warnings(caplog, paths.name)
    assert "'health'" in warning and "start with '/'" in warning and "/health" in warning.split(";", 1)[1]


def test_every_value_that_does_not_parse_is_named_with_its_fallback_and_a_fix(caplog):
    """The documented rule, for every declared setting: a bad value gives the default and
    one message naming the variable, the value, what was used instead and what to set."""
    for setting in settings.ALL.values():
        value, message = setting.check({setting.name: "no such value"})
        if message is None:  # free text (string, otel boolean) parses whatever it is
            assert isinstance(setting, (settings.Text, settings.OtelFlag)), setting
            continue
        assert value == setting.default, setting
        assert message.startswith(f"{setting.name}='no such value' is not "), message
        assert setting.fix and message.endswith(" " + setting.fix), message


# -- the registry, and who reads the environment --------------------------------------


def test_every_declared_setting_has_a_description_and_a_unique_name():
    assert all(s.description and s.kind and s.name == name for name, s in settings.ALL.items())
    declared = [v for v in vars(settings).values() if isinstance(v, settings.Setting)]
    assert len(declared) == len(settings.ALL)


def test_every_gym_autoinstr_name_in_the_package_is_declared():
    named = set()
    for path in SOURCES:
        named |= set(re.findall(r"\bGYM_AUTOINSTR_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    missing = sorted(named - set(settings.ALL))
    assert not missing, f"declare these in gym_autoinstr/settings.py: {missing}"
    assert named  # the scan sees the names (docstrings mention them too)


_READ = re.compile(
    r"""(environ\s*(\.get\(|\[|\.pop\(|\.setdefault\()|getenv\()\s*(f?["'])((GYM_AUTOINSTR|OTEL|NEMO_GYM)_|IS_NEMO_GYM|SLURM_)"""
)


def test_no_module_but_settings_reads_a_variable_by_its_literal_name():
    offenders = []
    for path in SOURCES:
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _READ.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "read these through gym_autoinstr.settings:\n" + "\n".join(offenders)


def test_the_source_scan_catches_a_literal_read():
    assert _READ.search('x = os.environ.get("GYM_AUTOINSTR_LEAN_SPANS", "")')
    assert _READ.search("environ['OTEL_SDK_DISABLED']")
    assert _READ.search('os.getenv("NEMO_GYM_CONFIG_PATH")')
    assert not _READ.search("os.environ.get(variable)")


def test_unknown_names_get_the_closest_known_one():
    found = settings.unknown({"GYM_AUTOINSTR_SPAN_GROUP": "all", "GYM_AUTOINSTR_LEAN_SPANS": "0", "OTEL_X": "1"})
    assert found == [("GYM_AUTOINSTR_SPAN_GROUP", "GYM_AUTOINSTR_SPAN_GROUPS")]


# -- a misspelled name, at run time --------------------------------------------------


def test_a_misspelled_name_is_warned_about_at_run_time_once_per_process_tree(tmp_path):
    import subprocess
    import sys

    from tests.harness.gym_targets import clean_environment

    child = "from gym_autoinstr.instrumentor import GymInstrumentor\nGymInstrumentor().instrument()\n"
    parent = (
        child + "import subprocess, sys\nsys.stderr.flush()\n"
        f"subprocess.run([sys.executable, '-c', {child!r}], check=True)\n"
    )
    environ = clean_environment(GYM_AUTOINSTR_SPAN_GROUP="all", GYM_AUTOINSTR_NO_SUCH_THING="1")
    result = subprocess.run(
        [sys.executable, "-c", parent], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "is not a gym-autoinstr setting" in line]
    assert len(lines) == 2, result.stderr  # one per name, from the parent alone
    (misspelled,) = [line for line in lines if "GYM_AUTOINSTR_SPAN_GROUP " in line]
    assert misspelled.startswith("gym-autoinstr: WARNING: GYM_AUTOINSTR_SPAN_GROUP is not")
    assert "ignored" in misspelled and "did you mean GYM_AUTOINSTR_SPAN_GROUPS?" in misspelled
    (unlike,) = [line for line in lines if "GYM_AUTOINSTR_NO_SUCH_THING" in line]
    assert "did you mean" not in unlike and "GYM_AUTOINSTR_SPAN_GROUPS" in unlike  # the names to choose from
    # a child that has a name its parent did not have says it itself
    alone = subprocess.run(
        [sys.executable, "-c", child],
        cwd=tmp_path,
        env={**environ, settings.UNKNOWN_SAID.name: "GYM_AUTOINSTR_NO_SUCH_THING"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = [line for line in alone.stderr.splitlines() if "is not a gym-autoinstr setting" in line]
    assert len(said) == 1 and "GYM_AUTOINSTR_SPAN_GROUP " in said[0], alone.stderr


# -- the doctor ------------------------------------------------------------------------


def test_the_doctor_flags_a_misspelled_variable_and_names_the_right_one():
    from gym_autoinstr.commands.doctor import diagnose

    diagnosis = diagnose({"GYM_AUTOINSTR_SPAN_GROUP": "all"}, offline=True)
    problems = [p for p in diagnosis["problems"] if "GYM_AUTOINSTR_SPAN_GROUP " in p["problem"] + " "]
    assert len(problems) == 1, diagnosis["problems"]
    (problem,) = problems
    assert problem["severity"] == "warning" and "ignored" in problem["problem"]
    assert "GYM_AUTOINSTR_SPAN_GROUPS" in problem["fix"]
    assert diagnosis["settings"]["unknown"] == [
        {"name": "GYM_AUTOINSTR_SPAN_GROUP", "closest": "GYM_AUTOINSTR_SPAN_GROUPS"}
    ]


def test_the_doctor_names_a_bad_switch_number_or_list_as_the_runtime_parses_it():
    from gym_autoinstr.commands.doctor import diagnose

    environ = {
        settings.GC_FREEZE.name: "nope",
        settings.FLUSH_TIMEOUT_MS.name: "-5",
        settings.LEAN_SPANS.name: "off",
        settings.EXCLUDED_PATHS.name: "health",
    }
    diagnosis = diagnose(environ, offline=True)
    said = {p["problem"].split("=", 1)[0]: p for p in diagnosis["problems"] if p["subject"] == "settings"}
    assert set(said) == {settings.GC_FREEZE.name, settings.FLUSH_TIMEOUT_MS.name, settings.EXCLUDED_PATHS.name}
    assert "'nope'" in said[settings.GC_FREEZE.name]["problem"] and "'false'" in said[settings.GC_FREEZE.name]["fix"]
    # the runtime says the problem and its fix in one line; the doctor splits them, each said once
    gc_freeze = said[settings.GC_FREEZE.name]
    assert gc_freeze["problem"] + " " + gc_freeze["fix"] == settings.GC_FREEZE.check(environ)[1]
    assert settings.GC_FREEZE.fix not in gc_freeze["problem"]
    assert all(p["severity"] == "warning" for p in said.values())
    assert diagnosis["settings"]["invalid"] == sorted(said, key=list(settings.ALL).index)
