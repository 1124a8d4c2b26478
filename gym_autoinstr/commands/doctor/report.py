"""The doctor's findings, rendered for a person, and the exit status."""

from __future__ import annotations

from collections.abc import Callable
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


def adder(problems: list[Problem], subject: str) -> Callable[[str, str, str], None]:
    """``add(severity, problem, fix)``: one more problem of ``subject`` in ``problems``."""
    return lambda severity, problem, fix: problems.append(Problem(severity, subject, problem, fix))


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


def render(diagnosis: dict[str, Any], *, verbose: bool = False) -> str:
    """The human-readable report: the verdict, then the problems with their fixes (errors
    first), then one line per section.  ``verbose``: the notes too, and each section in
    full (every pointcut, process-wide patch and fast-path part, and how each is applied)."""
    problems = by_severity(diagnosis["problems"])
    shown = problems if verbose else [p for p in problems if p["severity"] != INFO]
    lines = [verdict_line(diagnosis), ""]
    for problem in shown:
        lines.append(f"{problem['severity'].upper()}: {problem['subject']}: {problem['problem']}")
        lines.append(f"  fix: {problem['fix']}")
    if shown:
        lines.append("")
    lines += _details(diagnosis) if verbose else _summary(diagnosis)
    if not verbose:
        notes = len(problems) - len(shown)
        lines.append("")
        lines.append(
            "more: gym-autoinstr doctor --verbose (every pointcut, process-wide patch and fast-path part"
            + (f"; {notes} note(s))" if notes else ")")
        )
    return "\n".join(lines)


def _gym_line(diagnosis: dict[str, Any]) -> str:
    gym = diagnosis["gym"]
    known = "known" if gym["known"] else f"not a release we know ({gym['known_range']})"
    return f"nemo-gym      {gym['version'] or 'not installed'}" + (f"  ({known})" if gym["version"] else "")


def _pointcut_state(row: dict[str, Any]) -> str:
    if row["resolved"]:
        return "applied" if row["expected"] is not False else "applied (table says absent)"
    if row["expected"] is False:
        return "absent, as expected"
    return f"MISSING: {row['reason']}"


def _summary(diagnosis: dict[str, Any]) -> list[str]:
    """One line per section."""
    lines = [_gym_line(diagnosis) + f"; gym-autoinstr {diagnosis['gym_autoinstr']} on Python {diagnosis['python']}"]
    rows = diagnosis["pointcuts"]
    applied = [row for row in rows if row["resolved"]]
    absent = [row for row in rows if not row["resolved"] and row["expected"] is False]
    missing = [row["name"] for row in rows if not row["resolved"] and row["expected"] is not False]
    text = f"{len(applied)} applied; {len(absent)} not in this Gym release, as expected"
    lines.append(f"pointcuts     {text}" + (f", {len(missing)} MISSING: {', '.join(missing)}" if missing else ""))
    process_rows = diagnosis.get("process_patches") or []
    if process_rows:
        gone = [row["name"] for row in process_rows if not row["resolved"]]
        lines.append(
            f"patches       {len(process_rows)} process-wide, "
            + (f"targets absent here: {', '.join(gone)}" if gone else "every target present")
        )
    start = diagnosis["startup"]
    lines.append(
        f"start-up      distro {start['distro']['selected'] or 'default'}, configurator "
        f"{start['configurator']['selected'] or 'none'}, instrumentors "
        f"{', '.join(start['instrumentors']['enabled']) or 'none'}"
    )
    lines += _command_line_lines(diagnosis)
    lines += _exporter_lines(diagnosis)
    lines += _setting_lines(diagnosis)
    ray_section = diagnosis.get("ray") or {}
    ray_line = _ray_line(ray_section)
    absent_workers = [row["name"] for row in ray_section.get("worker_pointcuts") or [] if not row["resolves"]]
    if absent_workers:
        ray_line += f"; Gym inside a Ray actor: {', '.join(absent_workers)} absent"
    lines.append(ray_line)
    variables = diagnosis.get("settings") or {}
    if variables:
        named = variables.get("set") or []
        flagged = [
            f"{len(variables['unknown'])} unknown" if variables["unknown"] else "",
            f"{len(variables['invalid'])} invalid" if variables["invalid"] else "",
        ]
        flagged = [word for word in flagged if word]
        lines.append(
            "settings      "
            + (f"{len(named)} GYM_AUTOINSTR_* set" if named else "no GYM_AUTOINSTR_* set")
            + (f" ({', '.join(flagged)}: above)" if flagged else "")
        )
    fast = diagnosis.get("fast_path") or {}
    if fast:
        on = [row for row in fast["parts"] if row["on"]]
        off = [row["name"] for row in fast["parts"] if not row["on"]]
        lines.append(
            f"fast path     {'on' if fast['switch'] else 'OFF'}: {len(on)} of {len(fast['parts'])} parts"
            + (f" (off: {', '.join(off)})" if off and fast["switch"] else "")
            + f"  ({fast['variable']})"
        )
    run = diagnosis.get("last_run") or {}
    if run.get("directory"):
        lost = sum(int(e["count"]) for e in run.get("lost") or ())
        lines.append(
            f"last run      {run['directory']}: {run['processes']} processes ({run['running']} running), "
            + (f"{lost:,} of {run['spans']:,} spans LOST (above)" if lost else f"{run['spans']:,} spans, none lost")
        )
    return lines


def _details(diagnosis: dict[str, Any]) -> list[str]:
    """Every section in full."""
    lines = [_gym_line(diagnosis)]
    lines.append(f"gym-autoinstr {diagnosis['gym_autoinstr']}  on Python {diagnosis['python']}")
    lines.append("")
    lines.append("pointcuts")
    for row in diagnosis["pointcuts"]:
        lines.append(
            f"  {row['name']:<22} {row['module']}.{row['attribute']}  [{row['versions']}]  {_pointcut_state(row)}"
        )
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
    lines += _command_line_lines(diagnosis)
    lines += _exporter_lines(diagnosis)
    lines += _setting_lines(diagnosis)
    ray_section = diagnosis.get("ray") or {}
    lines.append(_ray_line(ray_section))
    worker_rows = ray_section.get("worker_pointcuts") or []
    if worker_rows:
        lines.append(
            "ray actors    Gym inside a Ray actor: "
            + ", ".join(f"{row['name']} {'ok' if row['resolves'] else 'absent'}" for row in worker_rows)
        )
    variables = diagnosis.get("settings") or {}
    if variables:
        lines.append("settings      " + (", ".join(variables.get("set") or []) or "no GYM_AUTOINSTR_* set"))
    fast = diagnosis.get("fast_path") or {}
    if fast:
        lines.append(f"fast path     {'on' if fast['switch'] else 'OFF'}  ({fast['variable']})")
        for row in fast["parts"]:
            lines.append(f"  {row['name']:<16} {'on' if row['on'] else 'off: ' + row['reason']}")
    return lines


def _command_line_lines(diagnosis: dict[str, Any]) -> list[str]:
    """How to start Gym when opentelemetry-instrument would stop at one of its options."""
    found = (diagnosis.get("command_line") or {}).get("ambiguous") or {}
    if not found:
        return []
    return [
        f"command line  opentelemetry-instrument -- gym ...: without --, it stops at gym's {', '.join(found)} "
        "('ambiguous option')"
    ]


def _exporter_lines(diagnosis: dict[str, Any]) -> list[str]:
    """The span, metric and log exporters, and the live check of the endpoint: a line each."""
    lines = []
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
    if section.get("skipped") == "--offline":
        lines.append("pipeline      not checked (--offline)")
    for target in section.get("targets", []):
        how = f"{target['protocol']}{' (TLS)' if target['tls'] else ''} to {target['url']}"
        source = f" from {target['variable']}" if target["variable"] else " (default endpoint)"
        verdict = (
            f"accepted an empty export ({target.get('status')})" if target["accepted"] else "spans could NOT arrive"
        )
        lines.append(f"pipeline      {how}{source}: {verdict}")
    return lines


def _setting_lines(diagnosis: dict[str, Any]) -> list[str]:
    """Span groups, the shape settings, Gym's own telemetry and the server venvs: a line each."""
    groups_section = diagnosis["span_groups"]
    source = groups_section["variable"] or "default"
    lines = [f"span groups   {', '.join(groups_section['enabled']) or 'none'}  (from {source})"]
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
    return lines


def _ray_line(ray_section: dict[str, Any]) -> str:
    return "ray           " + (
        f"{ray_section.get('ray_version')}: tasks traced into the workers"
        if ray_section.get("active")
        else f"{ray_section.get('ray_version') or 'not installed'}: not traced ({ray_section.get('reason')})"
    )


def _names(rows: list[dict[str, str]]) -> str:
    return ", ".join(row["name"] for row in rows) or "none"


def exit_status(diagnosis: dict[str, Any]) -> int:
    """0 when tracing would work, 1 when it would not."""
    return 0 if diagnosis["ok"] else 1
