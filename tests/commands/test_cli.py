"""The bare ``gym-autoinstr`` command: help with no arguments, the version on ``--version``."""

from __future__ import annotations

import pytest

from gym_autoinstr.commands.cli import main
from gym_autoinstr.version import __version__


def test_no_arguments_prints_help_naming_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gym-autoinstr")
    for command in ("doctor", "view", "--version"):
        assert command in out


def test_version_flag_prints_name_and_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"gym-autoinstr {__version__}"


def test_unknown_command_is_a_usage_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["slow"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'slow'" in err and "doctor" in err and "view" in err
