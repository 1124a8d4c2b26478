"""Which fast parts replace SDK machinery here, and why any is off (``fastpath/parts.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import WARNING, Problem


def fast_path(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    """Each fast part on or off, with the reason; checked here as the configurator checks
    them (their private OpenTelemetry names, then a probe against the SDK)."""
    from gym_autoinstr.fastpath import contract, parts

    section = parts.report()
    if not settings.FAST_PATH.read(dict(environ)):  # the environment asked about, not only this process's
        reason = f"{settings.FAST_PATH.name} is off"
        section["switch"] = False
        for row in section["parts"]:
            row["on"], row["reason"] = False, reason
    section["versions"] = parts.versions()
    problems = [
        Problem(
            WARNING,
            "fast path",
            f"part {row['name']} is off: {row['reason']} ({section['versions']}); the stock SDK does its work, "
            "more slowly",
            "nothing to do for tracing to work; report the OpenTelemetry versions above to gym-autoinstr "
            f"(its private names are listed in {contract.__name__})",
        )
        for row in section["parts"]
        if not row["on"] and section["switch"] and not row["reason"].startswith("needs ")
    ]
    return section, problems
