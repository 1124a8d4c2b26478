"""What ``opentelemetry-instrument``'s start-up would pick: distro, configurator, instrumentors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import ERROR, INFO, WARNING, Problem

OUR_DISTRO = "gym_autoinstr"
OUR_CONFIGURATOR = "gym_autoinstr"
OUR_INSTRUMENTOR = "nemo_gym"

# What each known distro sets by default (``os.environ.setdefault``) before the
# configurators run; they decide which configurator and exporter win.
DISTRO_DEFAULTS: dict[str, dict[str, str]] = {
    "gym_autoinstr.setup.distro": {
        "OTEL_PYTHON_CONFIGURATOR": OUR_CONFIGURATOR,
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi",
    },
    "opentelemetry.distro": {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    },
}


def _entry_points(group: str) -> list[dict[str, str]]:
    try:
        from importlib.metadata import entry_points

        found = entry_points(group=group)
    except Exception:
        return []
    rows = []
    for entry_point in found:
        dist = getattr(entry_point, "dist", None)
        rows.append({"name": entry_point.name, "value": entry_point.value, "package": getattr(dist, "name", None)})
    return rows


def _first_found(candidates: list[dict[str, str]], requested: str | None) -> dict[str, str] | None:
    # opentelemetry-instrument's rule for distros and configurators: the one named by the
    # variable, else the first entry point found.
    for candidate in candidates:
        if requested is None or candidate["name"] == requested:
            return candidate
    return None


def startup(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str], list[Problem]]:
    """Distro, configurator and instrumentors as ``opentelemetry-instrument`` would pick
    them, and the environment after the chosen distro's defaults."""
    problems: list[Problem] = []

    def add(severity: str, subject: str, problem: str, fix: str) -> None:
        problems.append(Problem(severity, subject, problem, fix))

    effective = dict(environ)

    distros = _entry_points("opentelemetry_distro")
    requested_distro = settings.PYTHON_DISTRO.raw(environ)
    distro = _first_found(distros, requested_distro)
    if distro is not None:
        for name, value in DISTRO_DEFAULTS.get(distro["value"].split(":")[0], {}).items():
            effective.setdefault(name, value)
    elif requested_distro:
        add(
            WARNING,
            "distro",
            f"OTEL_PYTHON_DISTRO={requested_distro!r} names no installed distro; "
            "OpenTelemetry's default distro is used",
            "unset OTEL_PYTHON_DISTRO or set it to one of: "
            f"{', '.join(d['name'] for d in distros) or 'none installed'}",
        )
    if distro is not None and distro["name"] != OUR_DISTRO:
        add(
            INFO,
            "distro",
            f"the {distro['name']!r} distro is found first, so its defaults apply, not ours",
            f"set OTEL_PYTHON_DISTRO={OUR_DISTRO} to use ours",
        )

    configurators = _entry_points("opentelemetry_configurator")
    requested_configurator = settings.PYTHON_CONFIGURATOR.raw(effective)
    configurator = _first_found(configurators, requested_configurator)
    if configurator is None:
        add(
            ERROR,
            "configurator",
            (
                f"OTEL_PYTHON_CONFIGURATOR={requested_configurator!r} names no installed configurator"
                if requested_configurator
                else "no OpenTelemetry configurator is installed"
            )
            + ": no tracer provider is built, so no span is recorded",
            f"set OTEL_PYTHON_CONFIGURATOR={OUR_CONFIGURATOR} "
            "(pip install gym-autoinstr in the environment that runs Gym)",
        )
    elif configurator["name"] != OUR_CONFIGURATOR:
        add(
            WARNING,
            "configurator",
            f"the {configurator['name']!r} configurator builds the SDK: Gym identity is added to it, "
            "but Ray's daemons export too, a missing exporter package is not worked around, "
            "and the exit flush is not time-boxed",
            f"set OTEL_PYTHON_CONFIGURATOR={OUR_CONFIGURATOR}",
        )

    instrumentors = _entry_points("opentelemetry_instrumentor")
    disabled = [
        name.strip()
        for name in (settings.PYTHON_DISABLED_INSTRUMENTATIONS.raw(effective) or "").split(",")
        if name.strip()
    ]
    ours = [i for i in instrumentors if i["name"] == OUR_INSTRUMENTOR]
    if not ours:
        add(
            ERROR,
            "instrumentor",
            f"no {OUR_INSTRUMENTOR!r} instrumentor is installed: Gym is not patched",
            "pip install gym-autoinstr in the environment that runs Gym (and in every Gym server venv)",
        )
    elif OUR_INSTRUMENTOR in disabled or "*" in disabled:
        add(
            ERROR,
            "instrumentor",
            f"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS={effective['OTEL_PYTHON_DISABLED_INSTRUMENTATIONS']!r} "
            f"turns off the {OUR_INSTRUMENTOR!r} instrumentor",
            f"remove {OUR_INSTRUMENTOR!r} (or '*') from OTEL_PYTHON_DISABLED_INSTRUMENTATIONS",
        )
    section = {
        "distro": {"requested": requested_distro, "selected": distro["name"] if distro else None, "installed": distros},
        "configurator": {
            "requested": requested_configurator,
            "selected": configurator["name"] if configurator else None,
            "installed": configurators,
        },
        "instrumentors": {
            "installed": instrumentors,
            "disabled": disabled,
            "enabled": [i["name"] for i in instrumentors if i["name"] not in disabled and "*" not in disabled],
        },
    }
    return section, effective, problems


def _gym_long_options() -> set[str]:
    """Every long option of Gym's ``gym`` command and its subcommands (0.6+: ``build_parser``);
    none for a Gym without it (its commands take Hydra's ``+key=value``)."""
    import argparse

    try:
        from nemo_gym.cli.main import build_parser

        parsers = [build_parser()]
    except Exception:
        return set()
    found: set[str] = set()
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            else:
                found.update(option for option in action.option_strings if option.startswith("--"))
    return found


def command_line() -> tuple[dict[str, Any], list[Problem]]:
    """Which of Gym's options ``opentelemetry-instrument`` stops at, unless ``--`` ends its own
    options before the command (``setup/command_line.py`` says so when it happens)."""
    from gym_autoinstr.setup.command_line import PROGRAM, ambiguous, instrument_options

    try:
        options = instrument_options()
        gym_options = _gym_long_options()
    except Exception:
        return {"ambiguous": {}}, []
    found = {option: ambiguous(option, options) for option in sorted(gym_options)}
    found = {option: matches for option, matches in found.items() if matches}
    section = {"gym_options": len(gym_options), "ambiguous": found}
    if not found:
        return section, []
    which = "; ".join(f"{option} (could be {', '.join(matches)})" for option, matches in found.items())
    return section, [
        Problem(
            INFO,
            "command line",
            f"{PROGRAM} takes Gym's {which} for an abbreviation of its own options, even after the command, "
            "and stops with 'ambiguous option' before Gym starts",
            f"end its options with -- before the command: {PROGRAM} -- gym eval submit --config my.yaml",
        )
    ]
