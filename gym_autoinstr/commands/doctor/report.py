"""The doctor's findings, rendered for a person, and the exit status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ERROR = "error"  # tracing would not work
WARNING = "warning"  # tracing works, with something missing or surprising
INFO = "info"  # worth knowing, nothing to fix


@dataclass
class Problem:
    severity: str
    subject: str
    problem: str
    fix: str


SEVERITY_ORDER = (ERROR, WARNING, INFO)


def by_severity(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors first, then warnings, then notes (each kind in the order found)."""
    rank = {severity: i for i, severity in enumerate(SEVERITY_ORDER)}
    return sorted(problems, key=lambda problem: rank.get(problem["severity"], len(rank)))


def verdict_line(diagnosis: dict[str, Any]) -> str:
    """The report's first line: will Gym be traced, and if not, the first thing to fix."""
    problems = by_severity(diagnosis["problems"])
    if not diagnosis["ok"]:
        top = problems[0]
        more = len([p for p in problems if p["severity"] == ERROR]) - 1
        return f"tracing would NOT work: {top['fix']}" + (f"  (+{more} more error(s) below)" if more > 0 else "")
    warnings = len([p for p in problems if p["severity"] == WARNING])
    return "tracing would work" + (f"  ({warnings} warning(s) below)" if warnings else "")


def render(diagnosis: dict[str, Any]) -> str:
    """The human-readable report: the verdict first, then the details, then every problem
    with its fix (errors first)."""
    lines = [verdict_line(diagnosis), ""]
    gym = diagnosis["gym"]
    known = "known" if gym["known"] else f"not a release we know ({gym['known_range']})"
    lines.append(f"nemo-gym      {gym['version'] or 'not installed'}" + (f"  ({known})" if gym["version"] else ""))
    lines.append(f"gym-autoinstr {diagnosis['gym_autoinstr']}  on Python {diagnosis['python']}")
    lines.append("")
    lines.append("pointcuts")
    for row in diagnosis["pointcuts"]:
        if row["resolved"]:
            state = "applied" if row["expected"] is not False else "applied (table says absent)"
        elif row["expected"] is False:
            state = "absent, as expected"
        else:
            state = f"MISSING: {row['reason']}"
        lines.append(f"  {row['name']:<22} {row['module']}.{row['attribute']}  [{row['versions']}]  {state}")
    process_rows = diagnosis.get("process_patches") or []
    if process_rows:
        lines.append("")
        lines.append("process-wide patches (applied in Gym processes at the moment shown; restored by uninstrument)")
    for row in process_rows:
        if not row["resolved"]:
            found = f"{'absent' if row['optional'] else 'MISSING'}: {row['reason']}"
        elif row["applied_here"]:
            found = f"applied in this process ({row['applied_here']})"
        else:
            found = "present"
        target = f"{row['module']}.{row['attribute']}" + (" (per object)" if row["scope"] == "instances" else "")
        lines.append(f"  {row['name']:<24} {target}  {found}")
        how = f"as pointcut {row['pointcut']}" if row["pointcut"] else row["applied_by"]
        lines.append(f"    by {how}; when: {row['when']}")
        if not row["reversible"]:
            lines.append(f"    {row['restore']}")
    start = diagnosis["startup"]
    lines.append("")
    lines.append(
        f"distro        {start['distro']['selected'] or 'default'}  (installed: {_names(start['distro']['installed'])})"
    )
    lines.append(
        f"configurator  {start['configurator']['selected'] or 'none'}  "
        f"(installed: {_names(start['configurator']['installed'])})"
    )
    lines.append(f"instrumentors {', '.join(start['instrumentors']['enabled']) or 'none'}")
    for row in diagnosis["exporters"]:
        detail = f" over {row['used']}" if row.get("used") and row.get("protocol") else ""
        detail += f" to {row['directory']}" if row.get("directory") else ""
        lines.append(
            f"exporter      {row['name']}{detail}  ({'importable' if row['importable'] else 'NOT importable'})"
        )
    if not diagnosis["exporters"]:
        lines.append("exporter      none")
    for signal, label in (("metric_exporters", "metrics"), ("log_exporters", "logs")):
        rows = diagnosis.get(signal) or []
        for row in rows:
            detail = f" over {row['used']}" if row.get("used") and row.get("protocol") else ""
            detail += f" to {row['directory']}" if row.get("directory") else ""
            lines.append(
                f"{label:<13} {row['name']}{detail}  ({'importable' if row['importable'] else 'NOT importable'})"
            )
        if not rows:
            lines.append(
                f"{label:<13} off"
                + (
                    "  (OTEL_LOGS_EXPORTER or NEMO_GYM_OTEL_LOGS_ENABLED=true to export them)"
                    if label == "logs"
                    else ""
                )
            )
    section = diagnosis.get("pipeline") or {}
    if section.get("skipped"):
        if section["skipped"] == "--offline":
            lines.append("pipeline      not checked (--offline)")
    for target in section.get("targets", []):
        how = f"{target['protocol']}{' (TLS)' if target['tls'] else ''} to {target['url']}"
        source = f" from {target['variable']}" if target["variable"] else " (default endpoint)"
        verdict = (
            f"accepted an empty export ({target.get('status')})" if target["accepted"] else "spans could NOT arrive"
        )
        lines.append(f"pipeline      {how}{source}: {verdict}")
    groups_section = diagnosis["span_groups"]
    source = groups_section["variable"] or "default"
    lines.append(f"span groups   {', '.join(groups_section['enabled']) or 'none'}  (from {source})")
    for key, label, modes, otherwise in (
        (
            "job_trace",
            "job traces",
            {"single": "one trace per job (rollouts nested under gym.job)"},
            "each rollout its own trace, linked to gym.job",
        ),
        (
            "client_spans",
            "client spans",
            {"failures": "only for failed calls between Gym servers (leaner shape)"},
            "one per call",
        ),
    ):
        setting = diagnosis.get(key) or {}
        if setting:
            lines.append(f"{label:<14}{modes.get(setting['mode'], otherwise)}  ({setting['variable']})")
    native = diagnosis["native_telemetry"]
    lines.append(
        "Gym telemetry "
        + (
            "live: we stand down"
            if native["live"]
            else "not in this Gym"
            if not native["present"]
            else "inert: we trace"
        )
    )
    venvs = diagnosis["server_venvs"]
    lines.append(
        "server venvs  "
        + (
            f"gym env start installs {len(venvs['requirements'])} pinned packages into each"
            if venvs["will_install"]
            else "NOT given our packages"
        )
    )
    ray_section = diagnosis.get("ray") or {}
    lines.append(
        "ray           "
        + (
            f"{ray_section.get('ray_version')}: tasks traced into the workers"
            if ray_section.get("active")
            else f"{ray_section.get('ray_version') or 'not installed'}: not traced ({ray_section.get('reason')})"
        )
    )
    worker_rows = ray_section.get("worker_pointcuts") or []
    if worker_rows:
        lines.append(
            "ray actors    Gym inside a Ray actor: "
            + ", ".join(f"{row['name']} {'ok' if row['resolves'] else 'absent'}" for row in worker_rows)
        )
    fast = diagnosis.get("fast_path") or {}
    if fast:
        lines.append(f"fast path     {'on' if fast['switch'] else 'OFF'}  ({fast['variable']})")
        for row in fast["parts"]:
            lines.append(f"  {row['name']:<16} {'on' if row['on'] else 'off: ' + row['reason']}")
    problems = by_severity(diagnosis["problems"])
    if problems:
        lines.append("")
    for problem in problems:
        lines.append(f"{problem['severity'].upper()}: {problem['subject']}: {problem['problem']}")
        lines.append(f"  fix: {problem['fix']}")
    return "\n".join(lines)


def _names(rows: list[dict[str, str]]) -> str:
    return ", ".join(row["name"] for row in rows) or "none"


def exit_status(diagnosis: dict[str, Any]) -> int:
    """0 when tracing would work, 1 when it would not."""
    return 0 if diagnosis["ok"] else 1
