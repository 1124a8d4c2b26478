"""Default-on switches (``GYM_AUTOINSTR_*`` levers): one parser for all of them, and a
value that is neither on nor off keeps the switch on with one warning naming it."""

from __future__ import annotations

import pytest

from gym_autoinstr._env import switched_off
from gym_autoinstr._log import forget_said
from gym_autoinstr.fastpath import histograms
from gym_autoinstr.advice import pool


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF "])
def test_off_values_turn_it_off(value):
    assert switched_off("GYM_AUTOINSTR_X", {"GYM_AUTOINSTR_X": value})


@pytest.mark.parametrize("environ", [{}, {"GYM_AUTOINSTR_X": ""}, {"GYM_AUTOINSTR_X": "1"}, {"GYM_AUTOINSTR_X": "True"}])
def test_unset_empty_and_on_values_keep_it_on(environ, caplog):
    forget_said()
    assert not switched_off("GYM_AUTOINSTR_X", environ)
    assert not [r for r in caplog.records if "GYM_AUTOINSTR_X" in r.getMessage()]


def test_a_bad_value_keeps_it_on_with_one_warning_naming_the_fix(caplog):
    forget_said()
    assert not switched_off("GYM_AUTOINSTR_X", {"GYM_AUTOINSTR_X": "maybe"})
    assert not switched_off("GYM_AUTOINSTR_X", {"GYM_AUTOINSTR_X": "maybe"})
    warnings = [r.getMessage() for r in caplog.records if "GYM_AUTOINSTR_X" in r.getMessage()]
    assert len(warnings) == 1
    assert "'maybe'" in warnings[0] and "false" in warnings[0]


def test_the_levers_read_the_process_environment(monkeypatch):
    monkeypatch.setenv(histograms.ENV, "off")
    monkeypatch.setenv(pool.HOOKS_ENV, "no")
    assert not histograms.enabled_by_env()
    assert switched_off(pool.HOOKS_ENV)
    monkeypatch.setenv(histograms.ENV, "yes")
    assert histograms.enabled_by_env()
