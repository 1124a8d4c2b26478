"""``opentelemetry-instrument``'s command line: an option it cannot resolve, explained.

``opentelemetry-instrument [its options] command [arguments]`` parses its whole command
line with argparse, which takes an abbreviation of its long options anywhere, even after
the command.  An argument of the command that abbreviates two of them stops it before the
command starts: ``opentelemetry-instrument gym eval submit --config X`` ends with
"ambiguous option: --config could match --configurator, --config_file" (``--config_file``
is ``OTEL_CONFIG_FILE``, in newer SDKs).  ``--`` before the command ends its options.

One hook of ours runs before that parse: ``run()`` imports every
``opentelemetry_environment_variables`` entry point to build its options, and this module
is ours (entry point ``gym_autoinstr``; it declares no ``OTEL_*`` name, so it adds no
option).  Imported there, it finds the arguments argparse is about to reject and says, once,
on stderr, what to write instead.  It changes nothing: argparse's own error follows.
``gym-autoinstr doctor`` names the Gym options that would stop it (``ambiguous_options``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable, Sequence

PROGRAM = "opentelemetry-instrument"
ENTRY_POINT_GROUP = "opentelemetry_environment_variables"
# Its options that take no value (the rest take one, as its run() declares them).
_FLAGS = ("-h", "--help", "--version")


def instrument_options() -> set[str]:
    """``opentelemetry-instrument``'s long options, built as its ``run()`` builds them: one
    ``--<name>`` per ``OTEL_*`` name of every module in the entry point group, ``OTEL_`` or
    ``OTEL_PYTHON_`` taken off and lower-cased."""
    from importlib.metadata import entry_points

    options = {"--help", "--version"}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.value == __name__:
            continue
        try:
            module = entry_point.load()
        except Exception:  # run() would fail on it too, with its own message
            continue
        options.update(
            "--" + re.sub(r"OTEL_(PYTHON_)?", "", name).lower() for name in dir(module) if name.startswith("OTEL_")
        )
    return options


def ambiguous(argument: str, options: Iterable[str]) -> list[str]:
    """The options ``argument`` abbreviates when it abbreviates more than one (argparse's
    prefix matching: an exact name is no abbreviation); else nothing."""
    if not argument.startswith("--") or argument == "--":
        return []
    name = argument.split("=", 1)[0]
    options = set(options)
    if name in options:
        return []
    matches = sorted(option for option in options if option.startswith(name))
    return matches if len(matches) > 1 else []


def command_at(arguments: Sequence[str]) -> int | None:
    """Where the command starts in ``opentelemetry-instrument``'s arguments (after its own
    options and their values); None when ``--`` comes first (then nothing after it is
    parsed as an option) or there is no command."""
    at = 0
    while at < len(arguments):
        argument = arguments[at]
        if argument == "--":
            return None
        if not argument.startswith("-") or argument == "-":
            return at
        at += 1 if ("=" in argument or argument in _FLAGS) else 2
    return None


def rejected(arguments: Sequence[str], options: Iterable[str]) -> list[tuple[str, list[str]]]:
    """The command's arguments that ``opentelemetry-instrument`` would reject as ambiguous."""
    at = command_at(arguments)
    if at is None:
        return []
    options = set(options)
    found = []
    for argument in arguments[at + 1 :]:
        if argument == "--":
            break
        matches = ambiguous(argument, options)
        if matches:
            found.append((argument.split("=", 1)[0], matches))
    return found


def explanation(argv: Sequence[str], options: Iterable[str]) -> str | None:
    """What to say for ``opentelemetry-instrument``'s ``argv``, or None when it parses."""
    arguments = list(argv[1:])
    found = rejected(arguments, options)
    if not found:
        return None
    at = command_at(arguments)
    assert at is not None
    fixed = shlex.join([PROGRAM, *arguments[:at], "--", *arguments[at:]])
    what = "; ".join(f"{name} (could be {', '.join(matches)})" for name, matches in found)
    return (
        f"{PROGRAM} takes an option it cannot resolve for one of its own, even after the command: {what}, so it "
        f"stops with 'ambiguous option' before {arguments[at]} starts. Fix: end its options with -- before the "
        f"command: {fixed}"
    )


def _explain_this_command_line() -> None:
    if os.path.basename(sys.argv[0] if sys.argv else "") != PROGRAM:
        return
    try:
        message = explanation(sys.argv, instrument_options())
    except Exception:  # never in the way of opentelemetry-instrument's start-up
        return
    if message:
        from gym_autoinstr._log import logger

        logger.error("%s", message)


_explain_this_command_line()
