"""Did the last run lose spans?  The newest run directory's process notes, read back.

The run is ``GYM_AUTOINSTR_OUTPUT_DIR`` when set, else the newest directory under
``./gym-autoinstr-runs`` (the embedded default's).  A run that lost nothing says nothing;
one that lost spans is a warning per reason, with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gym_autoinstr import losses, settings
from gym_autoinstr.commands.doctor.report import WARNING, Problem
from gym_autoinstr.setup import files, notes


def newest_run(environ: Mapping[str, str]) -> Path | None:
    configured = settings.OUTPUT_DIR.raw(environ)
    if configured:
        return Path(configured) if Path(configured).is_dir() else None
    parent = Path.cwd() / files.DEFAULT_PARENT
    try:
        runs = [p for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def last_run(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    run = newest_run(environ)
    if run is None:
        return {"directory": None}, []
    found = notes.process_notes(run)
    entries = losses.lost_entries(found)
    section = {
        "directory": str(run),
        "processes": len(found),
        "running": len([n for n in found if n.get("alive")]),
        "spans": losses.spans_seen(found),
        "lost": entries,
    }
    problems = []
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_reason.setdefault(str(entry["reason"]), []).append(entry)
    for reason, group in by_reason.items():
        count = sum(int(e["count"]) for e in group)
        where = ", ".join(sorted({str(e["service"]).rsplit("/", 1)[-1] for e in group}))
        problems.append(
            Problem(
                WARNING,
                "last run",
                f"{count:,} span{'s' if count != 1 else ''} lost in {run} ({where}): "
                f"{losses.REASONS.get(reason, reason)}",
                losses.FIXES.get(reason, "see docs/long-runs.md"),
            )
        )
    return section, problems
