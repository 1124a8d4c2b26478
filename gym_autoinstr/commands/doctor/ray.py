"""Would Gym's Ray tasks be traced into the Ray workers, and if not, why?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_autoinstr.commands.doctor.report import INFO, WARNING, Problem, adder
from gym_autoinstr.telemetry import groups

# The Ray releases the carrier was built and tested against.
TESTED_RAY = "2.60"


def _probe_remote_function() -> str | None:
    """Why this Ray's RemoteFunction is not the shape the carrier relies on, or None."""
    import ray

    def probe(x):  # never submitted: only its RemoteFunction's state is read
        return x

    remote_function = ray.remote(probe)
    missing = [
        name
        for name in ("_function", "_function_signature", "_last_export_cluster_and_job")
        if name not in remote_function.__dict__
    ]
    return f"RemoteFunction lacks {', '.join(missing)}" if missing else None


def worker_pointcuts() -> list[dict[str, Any]]:
    """The rows a Ray worker applies once it runs Gym's orchestration (``RAY_WORKER_POINTCUTS``),
    each with whether Gym here has the attribute it names (looked up, not patched)."""
    import importlib

    from gym_autoinstr.pointcuts import RAY_WORKER_POINTCUTS

    rows = []
    for pointcut in RAY_WORKER_POINTCUTS:
        reason = None
        try:
            owner: Any = importlib.import_module(pointcut.module)
            for part in pointcut.attribute.split("."):
                owner = getattr(owner, part)
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
        rows.append(
            {
                "name": pointcut.name,
                "target": f"{pointcut.module}:{pointcut.attribute}",
                "versions": pointcut.versions,
                "resolves": reason is None,
                "reason": reason,
            }
        )
    return rows


def ray_propagation(
    environ: Mapping[str, str], report: list[dict[str, Any]], enabled: list[str]
) -> tuple[dict[str, Any], list[Problem]]:
    section: dict[str, Any] = {"ray_version": None, "active": False, "reason": None, "worker_pointcuts": []}
    problems: list[Problem] = []
    add = adder(problems, "ray")
    try:
        section["worker_pointcuts"] = worker_pointcuts()
    except Exception as error:  # the doctor reports; it never fails on its own checks
        section["worker_pointcuts_error"] = repr(error)
    try:
        import ray

        section["ray_version"] = str(ray.__version__)
    except Exception as error:
        section["reason"] = f"Ray is not importable here ({type(error).__name__})"
        return section, problems
    row = next((r for r in report if r["name"] == "ray.task"), None)
    if row is None or not row["resolved"]:
        section["reason"] = f"pointcut ray.task did not resolve: {row['reason'] if row else 'not in the table'}"
        add(
            WARNING,
            section["reason"],
            f"report the Ray version ({section['ray_version']}); tested with Ray {TESTED_RAY}",
        )
        return section, problems
    try:
        shape = _probe_remote_function()
    except Exception as error:
        shape = f"could not build a RemoteFunction ({type(error).__name__})"
    if shape:
        section["reason"] = shape
        add(
            WARNING,
            f"Ray {section['ray_version']}: {shape}; Ray tasks run untraced",
            f"use a Ray release like {TESTED_RAY}, or report this version",
        )
        return section, problems
    if groups.RAY not in enabled:
        section["reason"] = "span group 'ray' is off"
        add(
            INFO,
            "Ray tasks are not traced: span group 'ray' is off",
            "add 'ray' to GYM_AUTOINSTR_SPAN_GROUPS to follow Gym's Ray tasks into the workers",
        )
        return section, problems
    section["active"] = True
    if not section["ray_version"].startswith(TESTED_RAY):
        add(
            INFO,
            f"Ray {section['ray_version']} is not the release tested ({TESTED_RAY}); its shape checks out",
            "nothing to do; report anything odd with the Ray version",
        )
    return section, problems
