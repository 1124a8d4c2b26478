"""Span-group specs: presets and groups mixed, case and spaces ignored; a spec with an
unknown name falls back to the default preset as a whole, with one warning naming the name,
the closest valid one and the fix; Gym's own knob honoured."""

from __future__ import annotations

from gym_autoinstr._log import forget_said
from gym_autoinstr.telemetry import groups


def test_presets_select_exactly_their_groups():
    assert groups.parse_spec("default") == {"job", "server", "http_client", "rollout", "ray", "startup"}
    assert groups.parse_spec("per_rollout") == {
        "server",
        "http_client",
        "rollout",
        "verify",
        "agent",
        "model_call",
        "ray",
    }
    assert groups.parse_spec("all") == groups.ALL_GROUPS
    assert groups.parse_spec("none") == frozenset() == groups.parse_spec("")


def test_mixed_spec_is_case_insensitive_and_trimmed():
    assert groups.parse_spec(" Default , SANDBOX,verify ") == {
        "job",
        "server",
        "http_client",
        "rollout",
        "ray",
        "startup",
        "sandbox",
        "verify",
    }


def _warnings(caplog, word):
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


def test_a_misspelled_preset_falls_back_to_the_default_not_to_nothing(caplog):
    forget_said()
    assert groups.parse_spec("alll", source="GYM_AUTOINSTR_SPAN_GROUPS") == groups.PRESETS["default"]
    (warning,) = _warnings(caplog, "alll")
    assert warning.startswith("GYM_AUTOINSTR_SPAN_GROUPS='alll': 'alll' (did you mean 'all'?) is not a span group")
    assert "default preset" in warning and "Fix: set GYM_AUTOINSTR_SPAN_GROUPS=all " in warning


def test_a_spec_with_an_unknown_name_falls_back_as_a_whole_with_one_warning(caplog):
    forget_said()
    assert groups.parse_spec("server,serverz", source="GYM_AUTOINSTR_SPAN_GROUPS") == groups.PRESETS["default"]
    groups.parse_spec("server,serverz", source="GYM_AUTOINSTR_SPAN_GROUPS")
    (warning,) = _warnings(caplog, "serverz")
    assert "'serverz' (did you mean 'server'?)" in warning and "GYM_AUTOINSTR_SPAN_GROUPS=server,server" in warning
    assert all(name in warning for name in sorted(groups.ALL_GROUPS) + ["per_rollout"])


def test_a_name_like_no_valid_one_is_named_with_the_valid_ones(caplog):
    forget_said()
    found = groups.check("per_rollout, bogus", source="NEMO_GYM_OTEL_SPAN_GROUPS")
    assert found.enabled == groups.PRESETS["default"] and found.unknown == ("bogus",)
    assert "did you mean" not in found.problem and "'bogus' is not a span group or preset" in found.problem
    assert "names from: groups agent, http_client" in found.fix
    assert not caplog.records  # check logs nothing


def test_the_environment_falls_back_too_and_is_read_quietly_at_import(caplog):
    forget_said()
    environ = {"GYM_AUTOINSTR_SPAN_GROUPS": "alll"}
    assert groups.groups_from_environment(environ, quiet=True) == groups.PRESETS["default"]
    assert not _warnings(caplog, "alll")
    assert groups.reload(environ) == groups.PRESETS["default"]
    assert len(_warnings(caplog, "alll")) == 1
    groups.reload({})


def test_ours_wins_then_gyms_knob_then_the_default():
    assert groups.groups_from_environment({}) == groups.PRESETS["default"]
    assert groups.groups_from_environment({"NEMO_GYM_OTEL_SPAN_GROUPS": "verify"}) == {"verify"}
    both = {"GYM_AUTOINSTR_SPAN_GROUPS": "agent", "NEMO_GYM_OTEL_SPAN_GROUPS": "verify"}
    assert groups.groups_from_environment(both) == {"agent"}
