"""Span-group specs: presets and groups mixed, case and spaces ignored, unknown names
warned about once with the valid ones listed, and Gym's own knob honoured."""

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


def test_unknown_names_are_ignored_with_one_warning_listing_the_valid_ones(caplog):
    forget_said()
    assert groups.parse_spec("server,serverz", source="GYM_AUTOINSTR_SPAN_GROUPS") == {"server"}
    groups.parse_spec("server,serverz", source="GYM_AUTOINSTR_SPAN_GROUPS")
    warnings = [r.getMessage() for r in caplog.records if "serverz" in r.getMessage()]
    assert len(warnings) == 1
    assert "GYM_AUTOINSTR_SPAN_GROUPS" in warnings[0]
    assert all(name in warnings[0] for name in sorted(groups.ALL_GROUPS) + ["per_rollout"])


def test_ours_wins_then_gyms_knob_then_the_default():
    assert groups.groups_from_environment({}) == groups.PRESETS["default"]
    assert groups.groups_from_environment({"NEMO_GYM_OTEL_SPAN_GROUPS": "verify"}) == {"verify"}
    both = {"GYM_AUTOINSTR_SPAN_GROUPS": "agent", "NEMO_GYM_OTEL_SPAN_GROUPS": "verify"}
    assert groups.groups_from_environment(both) == {"agent"}
