"""``GYM_AUTOINSTR_*`` variables: a name that is none of ours (a misspelling, ignored), and
a value that does not parse (parsed here as Gym's processes parse it, ``settings.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import WARNING, Problem

SUBJECT = "settings"
# Checked by their own sections (span_groups.py, pipeline.py); switches, numbers and lists here.
_CHECKED_KINDS = (settings.Switch, settings.Number, settings.CommaList)


def variables(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    problems: list[Problem] = []
    unknown = settings.unknown(environ)
    for name, closest in unknown:
        problem, fix = settings.unknown_problem(name, closest)  # as the instrumentor warns at run time
        problems.append(Problem(WARNING, SUBJECT, problem, fix))
    invalid = []
    for setting in settings.ALL.values():
        if not isinstance(setting, _CHECKED_KINDS):
            continue
        _, message = setting.check(environ)
        if message:
            invalid.append(setting.name)
            if setting.fix:  # said once, as the fix, not also at the end of the message
                message = message.removesuffix(" " + setting.fix)
            fix = setting.fix or f"unset {setting.name} or set it to {setting.default!r}"
            problems.append(Problem(WARNING, SUBJECT, message, fix))
    section = {
        "set": sorted(name for name in environ if name.startswith(settings.PREFIX)),
        "unknown": [{"name": name, "closest": closest} for name, closest in unknown],
        "invalid": invalid,
    }
    return section, problems
