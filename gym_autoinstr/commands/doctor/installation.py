"""Which Gym is installed, and does every pointcut resolve on it.

Found by running the real ``GymInstrumentor`` and importing Gym's modules, the path a
Gym server takes.  Importing Gym may write Hydra's ``outputs/`` into the working
directory, so modules are imported from a scratch directory, with anything they print
sent to stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from gym_autoinstr.commands.doctor.report import ERROR, WARNING, Problem, adder
from gym_autoinstr.pointcuts import POINTCUTS, PROCESS_PATCHES, Pointcut, gym_release, version_applies

# Top-level packages the nemo-gym distribution ships (0.2.0 - 0.7.0).
GYM_PACKAGES = frozenset(
    {
        "nemo_gym",
        "resources_servers",
        "responses_api_agents",
        "responses_api_models",
        "environment_servers",
        "environments",
        "benchmarks",
    }
)
KNOWN_RELEASES = ((0, 2, 0), (0, 8, 0))  # first known, first unknown
KNOWN_RANGE = "0.2.0 - 0.7.x"


def is_gym_module(module: str) -> bool:
    return module.split(".", 1)[0] in GYM_PACKAGES


def is_known_release(gym_version: str) -> bool:
    try:
        release = gym_release(gym_version)
    except ValueError:
        return False
    return KNOWN_RELEASES[0] <= release < KNOWN_RELEASES[1]


def installed_gym_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nemo-gym")
    except Exception:
        return None


@contextlib.contextmanager
def _scratch_directory() -> Iterator[None]:
    """Run Gym imports where their side effects (Hydra's outputs/) cannot land in the cwd."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="gym-autoinstr-doctor-") as scratch:
        os.chdir(scratch)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            os.chdir(here)


def _import(module: str) -> str | None:
    """Import ``module``; return why it could not be, or None."""
    try:
        importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as error:
        if error.name and (module == error.name or module.startswith(error.name + ".")):
            return f"no module {error.name!r}"
        failure = f"importing {module} failed: {error!r}"
    except BaseException as error:  # Gym's import-time code may even sys.exit()
        failure = f"importing {module} failed: {error!r}"
    else:
        return None
    # A parent package that fails to import hides whether the module exists at all.
    return f"no module {module!r}" if _exists_on_disk(module) is False else failure


def _exists_on_disk(module: str) -> bool | None:
    """Whether ``module``'s source is installed, found without importing any package."""
    import importlib.machinery
    import importlib.util

    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except Exception:
        return None
    if spec is None:
        return False
    locations = list(spec.submodule_search_locations or [])
    for part in rest:
        found = None
        for location in locations:  # empty when the parent is a plain module
            package = os.path.join(location, part)
            if os.path.isfile(os.path.join(package, "__init__.py")):
                found = [package]
            elif any(os.path.isfile(package + suffix) for suffix in importlib.machinery.all_suffixes()):
                found = []
            elif os.path.isdir(package):
                found = [package]  # a namespace package
            if found is not None:
                break
        if found is None:
            return False
        locations = found
    return True


def resolve_pointcuts(gym_version: str | None, pointcuts: tuple[Pointcut, ...] = POINTCUTS) -> list[dict[str, Any]]:
    """Apply every pointcut with the real instrumentor, as a Gym process would, and say
    for each whether it resolved, whether the table expects it to on ``gym_version``,
    and why not.  Patches made here are removed again (unless this process was already
    instrumented, e.g. run under ``opentelemetry-instrument``)."""
    from gym_autoinstr.instrumentor import GymInstrumentor

    instrumentor = GymInstrumentor()
    started_here = not instrumentor.is_instrumented_by_opentelemetry
    import_errors: dict[str, str] = {}
    try:
        if started_here:
            instrumentor.instrument()
        with _scratch_directory():
            for module in sorted({p.module for p in pointcuts}):
                reason = _import(module)
                if reason:
                    import_errors[module] = reason
        applied = set(instrumentor.patches.applied)
        absent = dict(instrumentor.patches.absent)
    finally:
        if started_here and instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
    report = []
    for pointcut in pointcuts:
        resolved = pointcut.name in applied
        reason = None
        if not resolved:
            reason = import_errors.get(pointcut.module) or absent.get(pointcut.name) or "not applied"
        try:
            expected: bool | None = version_applies(pointcut.versions, gym_version) if gym_version else None
            versions_error = None
        except ValueError as error:
            expected, versions_error = None, str(error)
        report.append(
            {
                "name": pointcut.name,
                "module": pointcut.module,
                "attribute": pointcut.attribute,
                "versions": pointcut.versions,
                "optional": pointcut.optional,
                "group": pointcut.group,
                "gym_module": is_gym_module(pointcut.module),
                "resolved": resolved,
                "expected": expected,
                "reason": reason,
                "versions_error": versions_error,
            }
        )
    return report


def process_patches() -> list[dict[str, Any]]:
    """The process-wide patches (``pointcuts.PROCESS_PATCHES``): whether each target exists
    in this environment, and whether it is applied in this process (the doctor's own: in
    a Gym process they apply at the moment each row's ``when`` says)."""
    from gym_autoinstr.patching import applied_process_patches, resolve_process_target

    here = applied_process_patches()
    rows = []
    for row in PROCESS_PATCHES:
        try:
            with _scratch_directory():
                resolve_process_target(row)
            reason = None
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            reason = f"{type(error).__name__}: {error}"
        rows.append(
            {
                "name": row.name,
                "module": row.module,
                "attribute": row.attribute,
                "scope": row.scope,
                "replaced_by": row.replaced_by,
                "purpose": row.purpose,
                "applied_by": row.applied_by,
                "when": row.when,
                "restore": row.restore,
                "pointcut": row.pointcut,
                "reversible": row.reversible,
                "optional": row.optional,
                "resolved": reason is None,
                "reason": reason,
                "applied_here": here.get(row.name, 0),
            }
        )
    return rows


def pointcut_problems(gym_version: str | None, report: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for row in report:
        target = f"{row['module']}.{row['attribute']}"
        subject = f"pointcut {row['name']}"
        if row["versions_error"]:
            problems.append(
                Problem(
                    WARNING,
                    subject,
                    f"versions {row['versions']!r} cannot be read ({row['versions_error']})",
                    "fix the row in gym_autoinstr/pointcuts.py",
                )
            )
        if row["resolved"]:
            if row["expected"] is False:
                problems.append(
                    Problem(
                        WARNING,
                        subject,
                        f"{target} exists in nemo-gym {gym_version}, but the table says {row['versions']!r}",
                        "update that pointcut's versions in gym_autoinstr/pointcuts.py",
                    )
                )
            continue
        if row["expected"] is False:
            continue  # absent where the table says it is: nothing to fix
        where = f"nemo-gym {gym_version}" if row["gym_module"] else "this environment"
        seam = f"{target} not found in {where} ({row['reason']})"
        if row["optional"]:
            problems.append(
                Problem(
                    WARNING, subject, seam + f"; its {row['group'] or 'plumbing'} seam is skipped", _pointcut_fix(row)
                )
            )
        else:
            problems.append(
                Problem(
                    ERROR, subject, seam + f"; no {row['group'] or 'plumbing'} work is done there", _pointcut_fix(row)
                )
            )
    return problems


def _pointcut_fix(row: dict[str, Any]) -> str:
    if not row["gym_module"]:
        return f"install the library that provides {row['module']} (Gym needs it too)"
    if row["reason"] and "failed" in row["reason"]:
        return (
            f"make `python -c 'import {row['module']}'` work in this environment "
            "(a dependency of Gym is missing or broken)"
        )
    return (
        f"use a nemo-gym release gym-autoinstr supports ({KNOWN_RANGE}), "
        "or report the Gym version so the pointcut can follow it"
    )


def gym_section(version: str | None) -> tuple[dict[str, Any], list[Problem]]:
    """The installed release, and whether it is one we know."""
    problems: list[Problem] = []
    add = adder(problems, "nemo-gym")
    gym: dict[str, Any] = {
        "version": version,
        "known": bool(version and is_known_release(version)),
        "known_range": KNOWN_RANGE,
    }
    if version is None:
        add(
            ERROR,
            "nemo-gym is not installed in this environment",
            "pip install nemo-gym (in the environment gym-autoinstr runs in)",
        )
    elif not gym["known"]:
        add(
            WARNING,
            f"nemo-gym {version} is outside the releases gym-autoinstr was built against ({KNOWN_RANGE})",
            "check the pointcuts in this report: where they resolve, tracing works",
        )
    return gym, problems
