"""Would ``gym env start`` put our packages into the server venvs it builds?"""

from __future__ import annotations

from typing import Any

from gym_autoinstr.commands.doctor.report import INFO, WARNING, Problem


def server_venvs(report: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Problem]]:
    """Would ``gym env start`` put our packages into the server venvs it builds?"""
    resolved = any(row["name"] == "venvs.requirements" and row["resolved"] for row in report)
    section: dict[str, Any] = {"will_install": False, "requirements": []}
    if not resolved:
        return section, [
            Problem(
                WARNING,
                "server venvs",
                "Gym's head_server_deps could not be patched here, so server venvs Gym builds get no OpenTelemetry "
                "and those servers run untraced",
                "run the servers from one venv with gym-autoinstr installed (+skip_venv_if_present=true), "
                "or install gym-autoinstr into each server venv",
            )
        ]
    try:
        from gym_autoinstr.advice.venvs import (
            gone_fix,
            gone_message,
            gone_requirements,
            local_path_fix,
            local_path_message,
            local_requirements,
            requirement_override,
            requirement_problem,
            server_requirements,
        )

        section["requirements"] = list(server_requirements())
        override = requirement_override()
        section["override"] = " ".join(override) if override else None
        bad_override = requirement_problem()
        local = local_requirements()
        section["local_paths"] = {r.name: r.local_path for r in local}
        gone = gone_requirements()
        section["gone_paths"] = {r.name: r.local_path for r in gone}
    except Exception as error:
        return section, [
            Problem(
                WARNING,
                "server venvs",
                f"the pinned requirements for server venvs could not be derived ({error!r})",
                "reinstall gym-autoinstr (pip install --force-reinstall gym-autoinstr) so its metadata is complete",
            )
        ]
    section["will_install"] = bool(section["requirements"])
    # Only a problem once servers run on other hosts: a note, as the orchestrator logs it.
    problems = [Problem(INFO, "server venvs", local_path_message(local), local_path_fix())] if local else []
    if bad_override:  # as the orchestrator warns
        problems.append(Problem(WARNING, "server venvs", *bad_override))
    if gone:  # as the orchestrator warns
        problems.append(Problem(WARNING, "server venvs", gone_message(gone), gone_fix()))
    return section, problems
