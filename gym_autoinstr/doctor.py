"""``gym-autoinstr doctor``: would this environment trace Gym, and if not, what to change.

We never raise into Gym, so a broken setup shows up as an empty backend rather than an
error.  The doctor asks the questions a user would ask then, in the order a Gym process
meets them under ``opentelemetry-instrument``: which Gym is installed (a release we
know?); does every pointcut resolve on it (found by running the real ``GymInstrumentor``
and importing Gym's modules, the path a Gym server takes); which distro, configurator and
instrumentors the start-up would pick; can the exporter's package be imported; which span
groups are on; is Gym's own telemetry live (then we stand down).  Every problem comes
with its fix, and the exit status is non-zero when tracing would not work.

Importing Gym may write Hydra's ``outputs/`` into the working directory, so modules are
imported from a scratch directory, with anything they print sent to stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Mapping

from . import files, groups
from .pointcuts import POINTCUTS, Pointcut, gym_release, version_applies

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

ERROR = "error"  # tracing would not work
WARNING = "warning"  # tracing works, with something missing or surprising
INFO = "info"  # worth knowing, nothing to fix

OUR_DISTRO = "gym_autoinstr"
OUR_CONFIGURATOR = "gym_autoinstr"
OUR_INSTRUMENTOR = "nemo_gym"

# What each known distro sets by default (``os.environ.setdefault``) before the
# configurators run; they decide which configurator and exporter win.
DISTRO_DEFAULTS: dict[str, dict[str, str]] = {
    "gym_autoinstr.distro": {
        "OTEL_PYTHON_CONFIGURATOR": OUR_CONFIGURATOR,
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi",
    },
    "opentelemetry.distro": {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    },
}

# The names Gym 0.7's ``init_telemetry`` imports from nemo-lens; without every one of
# them it logs "nemo-lens is not installed" and its call sites stay inert.
NEMO_LENS_NAMES = (
    ("nemo.lens", ("NemoLensConfig", "TelemetryHandle", "get_meter", "get_tracer", "setup_telemetry", "handle")),
    ("nemo.lens.semconv", ("NV_DL_RANK", "NV_DL_WORLD_SIZE")),
)


@dataclass
class Problem:
    severity: str
    subject: str
    problem: str
    fix: str


def is_gym_module(module: str) -> bool:
    return module.split(".", 1)[0] in GYM_PACKAGES


def is_known_release(gym_version: str) -> bool:
    try:
        release = gym_release(gym_version)
    except ValueError:
        return False
    return KNOWN_RELEASES[0] <= release < KNOWN_RELEASES[1]


# -- Gym and its pointcuts -------------------------------------------------------------


def installed_gym_version() -> "str | None":
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


def _import(module: str) -> "str | None":
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


def _exists_on_disk(module: str) -> "bool | None":
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


def resolve_pointcuts(gym_version: "str | None", pointcuts: "tuple[Pointcut, ...]" = POINTCUTS) -> list[dict[str, Any]]:
    """Apply every pointcut with the real instrumentor, as a Gym process would, and say
    for each whether it resolved, whether the table expects it to on ``gym_version``,
    and why not.  Patches made here are removed again (unless this process was already
    instrumented, e.g. run under ``opentelemetry-instrument``)."""
    from .instrumentor import GymInstrumentor

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
            expected: "bool | None" = version_applies(pointcut.versions, gym_version) if gym_version else None
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


def _pointcut_problems(gym_version: "str | None", report: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for row in report:
        target = f"{row['module']}.{row['attribute']}"
        subject = f"pointcut {row['name']}"
        if row["versions_error"]:
            problems.append(
                Problem(WARNING, subject, f"versions {row['versions']!r} cannot be read ({row['versions_error']})", "fix the row in gym_autoinstr/pointcuts.py")
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
            problems.append(Problem(WARNING, subject, seam + f"; its {row['group'] or 'plumbing'} seam is skipped", _pointcut_fix(row)))
        else:
            problems.append(
                Problem(ERROR, subject, seam + f"; no {row['group'] or 'plumbing'} work is done there", _pointcut_fix(row))
            )
    return problems


def _pointcut_fix(row: dict[str, Any]) -> str:
    if not row["gym_module"]:
        return f"install the library that provides {row['module']} (Gym needs it too)"
    if row["reason"] and "failed" in row["reason"]:
        return f"make `python -c 'import {row['module']}'` work in this environment (a dependency of Gym is missing or broken)"
    return f"use a nemo-gym release gym-autoinstr supports ({KNOWN_RANGE}), or report the Gym version so the pointcut can follow it"


# -- what opentelemetry-instrument's start-up would pick ----------------------------------


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


def _first_found(candidates: list[dict[str, str]], requested: "str | None") -> "dict[str, str] | None":
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
    effective = dict(environ)

    distros = _entry_points("opentelemetry_distro")
    requested_distro = environ.get("OTEL_PYTHON_DISTRO")
    distro = _first_found(distros, requested_distro)
    if distro is not None:
        for name, value in DISTRO_DEFAULTS.get(distro["value"].split(":")[0], {}).items():
            effective.setdefault(name, value)
    elif requested_distro:
        problems.append(
            Problem(
                WARNING,
                "distro",
                f"OTEL_PYTHON_DISTRO={requested_distro!r} names no installed distro; OpenTelemetry's default distro is used",
                f"unset OTEL_PYTHON_DISTRO or set it to one of: {', '.join(d['name'] for d in distros) or 'none installed'}",
            )
        )
    if distro is not None and distro["name"] != OUR_DISTRO:
        problems.append(
            Problem(
                INFO,
                "distro",
                f"the {distro['name']!r} distro is found first, so its defaults apply, not ours",
                f"set OTEL_PYTHON_DISTRO={OUR_DISTRO} to use ours",
            )
        )

    configurators = _entry_points("opentelemetry_configurator")
    requested_configurator = effective.get("OTEL_PYTHON_CONFIGURATOR")
    configurator = _first_found(configurators, requested_configurator)
    if configurator is None:
        problems.append(
            Problem(
                ERROR,
                "configurator",
                (
                    f"OTEL_PYTHON_CONFIGURATOR={requested_configurator!r} names no installed configurator"
                    if requested_configurator
                    else "no OpenTelemetry configurator is installed"
                )
                + ": no tracer provider is built, so no span is recorded",
                f"set OTEL_PYTHON_CONFIGURATOR={OUR_CONFIGURATOR} (pip install gym-autoinstr in the environment that runs Gym)",
            )
        )
    elif configurator["name"] != OUR_CONFIGURATOR:
        problems.append(
            Problem(
                WARNING,
                "configurator",
                f"the {configurator['name']!r} configurator builds the SDK: Gym identity is added to it, but Ray's daemons "
                "export too, a missing exporter package is not worked around, and the exit flush is not time-boxed",
                f"set OTEL_PYTHON_CONFIGURATOR={OUR_CONFIGURATOR}",
            )
        )

    instrumentors = _entry_points("opentelemetry_instrumentor")
    disabled = [name.strip() for name in effective.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",") if name.strip()]
    ours = [i for i in instrumentors if i["name"] == OUR_INSTRUMENTOR]
    if not ours:
        problems.append(
            Problem(
                ERROR,
                "instrumentor",
                f"no {OUR_INSTRUMENTOR!r} instrumentor is installed: Gym is not patched",
                "pip install gym-autoinstr in the environment that runs Gym (and in every Gym server venv)",
            )
        )
    elif OUR_INSTRUMENTOR in disabled or "*" in disabled:
        problems.append(
            Problem(
                ERROR,
                "instrumentor",
                f"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS={effective['OTEL_PYTHON_DISABLED_INSTRUMENTATIONS']!r} turns off the {OUR_INSTRUMENTOR!r} instrumentor",
                f"remove {OUR_INSTRUMENTOR!r} (or '*') from OTEL_PYTHON_DISABLED_INSTRUMENTATIONS",
            )
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


# -- exporters -------------------------------------------------------------------------

# protocol -> (module, package); kept in step with configurator.py
OTLP_EXPORTERS = {
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry-exporter-otlp-proto-http"),
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "opentelemetry-exporter-otlp-proto-grpc"),
}


def _importable(module: str) -> "str | None":
    try:
        importlib.import_module(module)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def _otlp_protocol(environ: Mapping[str, str]) -> str:
    raw = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip().lower()
    return "grpc" if raw == "grpc" else "http/protobuf"


def exporters(environ: Mapping[str, str], configurator: "str | None") -> tuple[list[dict[str, Any]], list[Problem]]:
    """The trace exporters the configurator would build, and whether their packages import."""
    problems: list[Problem] = []
    rows: list[dict[str, Any]] = []
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        problems.append(Problem(ERROR, "exporter", "OTEL_SDK_DISABLED=true: no span is recorded", "unset OTEL_SDK_DISABLED"))
        return rows, problems
    if configurator == OUR_CONFIGURATOR and files.embedded_default_applies(environ):
        return _embedded_default(environ)
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names:
        problems.append(
            Problem(
                ERROR,
                "exporter",
                f"OTEL_TRACES_EXPORTER={environ.get('OTEL_TRACES_EXPORTER')!r}: spans are created but never exported",
                "set OTEL_TRACES_EXPORTER=otlp (or console to see spans on stderr)",
            )
        )
    falls_back = configurator == OUR_CONFIGURATOR
    working = 0
    for name in names:
        if name in ("otlp", "otlp_proto_http", "otlp_proto_grpc"):
            protocol = _otlp_protocol(environ) if name == "otlp" else ("grpc" if name.endswith("grpc") else "http/protobuf")
            module, package = OTLP_EXPORTERS[protocol]
            error = _importable(module)
            row = {"name": name, "protocol": protocol, "module": module, "package": package, "importable": error is None, "error": error, "used": protocol if error is None else None}
            if error is None:
                working += 1
            else:
                other = next(p for p in OTLP_EXPORTERS if p != protocol)
                other_module, other_package = OTLP_EXPORTERS[other]
                if falls_back and _importable(other_module) is None:
                    row["used"] = other
                    working += 1
                    problems.append(
                        Problem(
                            WARNING,
                            "exporter",
                            f"the OTLP {protocol} exporter cannot be imported ({error}); spans go over OTLP {other} instead, to that protocol's port",
                            f"pip install {package}, or set OTEL_EXPORTER_OTLP_PROTOCOL={other} and point "
                            "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's port for it (4317 grpc, 4318 http)",
                        )
                    )
                else:
                    problems.append(
                        Problem(
                            ERROR,
                            "exporter",
                            f"the OTLP {protocol} exporter cannot be imported ({error}): spans are created but never exported",
                            f"pip install {package}",
                        )
                    )
            rows.append(row)
        elif name == "console":
            rows.append({"name": name, "importable": True, "used": "console"})
            working += 1
        else:
            provided = [e for e in _entry_points("opentelemetry_traces_exporter") if e["name"] == name]
            rows.append({"name": name, "importable": bool(provided), "used": name if provided else None})
            if provided:
                working += 1
            else:
                problems.append(
                    Problem(
                        ERROR if len(names) == 1 else WARNING,
                        "exporter",
                        f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides",
                        "set OTEL_TRACES_EXPORTER=otlp, or install the package providing that exporter",
                    )
                )
    return rows, problems


def _embedded_default(environ: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[Problem]]:
    """No exporter configured: our configurator writes OTLP-JSON files to a run directory."""
    configured = environ.get(files.OUTPUT_DIR_VARIABLE)
    directory = configured or os.path.join(".", files.DEFAULT_PARENT, "<run id>")
    existing = os.path.abspath(configured or os.getcwd())
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    writable = os.path.isdir(existing) and os.access(existing, os.W_OK)
    row = {"name": "files", "directory": directory, "importable": True, "writable": writable, "used": "files"}
    if not writable:
        where = f"{files.OUTPUT_DIR_VARIABLE}={configured!r}" if configured else "the working directory"
        return [row], [
            Problem(
                ERROR,
                "exporter",
                f"no exporter is configured, so spans go to local files, but {where} is not writable",
                f"set {files.OUTPUT_DIR_VARIABLE} to a writable directory, or OTEL_EXPORTER_OTLP_ENDPOINT to a collector",
            )
        ]
    return [row], [
        Problem(
            INFO,
            "exporter",
            f"no exporter is configured: each Gym process writes its spans as OTLP-JSON under {directory}"
            + ("" if configured else " (relative to where the orchestrator runs)"),
            "read them with `gym-autoinstr view <run directory>`; set OTEL_EXPORTER_OTLP_ENDPOINT to send to a collector",
        )
    ]


# -- span groups -----------------------------------------------------------------------


def span_groups(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    variable = next((v for v in groups.SPEC_VARIABLES if environ.get(v) is not None), None)
    spec = environ[variable] if variable else None
    enabled: set[str] = set(groups.PRESETS["default"]) if variable is None else set()
    unknown: list[str] = []
    for raw in (spec or "").split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name in groups.PRESETS:
            enabled |= groups.PRESETS[name]
        elif name in groups.ALL_GROUPS:
            enabled.add(name)
        else:
            unknown.append(raw.strip())
    problems = []
    valid = ", ".join(sorted(groups.ALL_GROUPS)) + "; presets: " + ", ".join(p for p in groups.PRESETS if p != "off")
    if unknown:
        problems.append(
            Problem(
                ERROR if not enabled else WARNING,
                "span groups",
                f"{variable}={spec!r}: unknown name(s) {', '.join(repr(u) for u in unknown)} ignored",
                f"use group and preset names only: {valid}",
            )
        )
    elif not enabled:
        problems.append(
            Problem(WARNING, "span groups", f"{variable}={spec!r} turns every span group off: no span is created", f"unset {variable} (preset 'default') or name groups: {valid}")
        )
    section = {"variable": variable, "spec": spec, "enabled": sorted(enabled), "unknown": unknown}
    return section, problems


# -- Gym's own telemetry ---------------------------------------------------------------


def native_telemetry(report: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Problem]]:
    """Whether Gym's own OpenTelemetry call sites (0.7+) would export in a Gym server."""
    from . import coexistence

    section: dict[str, Any] = {"present": False, "call_sites": False, "enabled": False, "nemo_lens": None, "exporting_now": False, "live": False}
    problems: list[Problem] = []
    setup = sys.modules.get("nemo_gym.telemetry.setup")
    server_utils = sys.modules.get("nemo_gym.server_utils")
    if setup is None:
        return section, problems
    section["present"] = True
    try:
        section["call_sites"] = hasattr(getattr(server_utils, "SimpleServer", None), "setup_telemetry")
        section["enabled"] = bool(setup.is_telemetry_env_enabled())
    except Exception:
        pass
    missing = []
    for module, names in NEMO_LENS_NAMES:
        try:
            loaded = importlib.import_module(module)
        except Exception:
            missing.append(module)
            continue
        missing += [f"{module}.{name}" for name in names if not hasattr(loaded, name)]
    section["nemo_lens"] = "usable" if not missing else f"missing {', '.join(missing)}"
    section["exporting_now"] = coexistence._handle_is_exporting()
    section["live"] = section["exporting_now"] or (section["call_sites"] and section["enabled"] and not missing)
    standing_down = next((r for r in report if r["name"] == "coexistence"), None)
    if section["live"]:
        if standing_down is not None and not standing_down["resolved"]:
            problems.append(
                Problem(
                    WARNING,
                    "Gym telemetry",
                    "Gym's own telemetry is live but the coexistence pointcut did not resolve: every span would be doubled",
                    "turn Gym's telemetry off (unset NEMO_GYM_OTEL_ENABLED / NEMO_LENS_ENABLED)",
                )
            )
        else:
            problems.append(
                Problem(
                    INFO,
                    "Gym telemetry",
                    "Gym's own telemetry is live (nemo-lens): gym-autoinstr stands down in Gym servers, traces come from Gym",
                    "to trace with gym-autoinstr instead, unset NEMO_GYM_OTEL_ENABLED / NEMO_LENS_ENABLED",
                )
            )
    elif section["enabled"] and section["call_sites"]:
        problems.append(
            Problem(
                INFO,
                "Gym telemetry",
                f"Gym's own telemetry is enabled but inert (nemo-lens {section['nemo_lens']}): gym-autoinstr traces instead",
                "nothing to do",
            )
        )
    return section, problems


# -- the whole diagnosis -----------------------------------------------------------------


def server_venvs(report: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Problem]]:
    """Would ``gym env start`` put our packages into the server venvs it builds?"""
    resolved = any(row["name"] == "venvs.requirements" and row["resolved"] for row in report)
    section: dict[str, Any] = {"will_install": False, "requirements": []}
    if not resolved:
        return section, [Problem(
            WARNING, "server venvs",
            "Gym's head_server_deps could not be patched here, so server venvs Gym builds get no OpenTelemetry "
            "and those servers run untraced",
            "run the servers from one venv with gym-autoinstr installed (+skip_venv_if_present=true), "
            "or install gym-autoinstr into each server venv",
        )]
    try:
        from .venvs import server_requirements

        section["requirements"] = list(server_requirements())
    except Exception as error:
        return section, [Problem(
            WARNING, "server venvs", f"the pinned requirements for server venvs could not be derived ({error!r})",
            "reinstall gym-autoinstr (pip install --force-reinstall gym-autoinstr) so its metadata is complete",
        )]
    section["will_install"] = bool(section["requirements"])
    return section, []


def diagnose(environ: "Mapping[str, str] | None" = None) -> dict[str, Any]:
    """Everything the doctor knows, as one JSON-ready dict; ``ok`` is False when tracing
    would not work."""
    environ = dict(os.environ if environ is None else environ)
    from .configurator import STATE
    from .version import __version__

    problems: list[Problem] = []
    version = installed_gym_version()
    gym: dict[str, Any] = {"version": version, "known": bool(version and is_known_release(version)), "known_range": KNOWN_RANGE}
    if version is None:
        problems.append(Problem(ERROR, "nemo-gym", "nemo-gym is not installed in this environment", "pip install nemo-gym (in the environment gym-autoinstr runs in)"))
    elif not gym["known"]:
        problems.append(
            Problem(
                WARNING,
                "nemo-gym",
                f"nemo-gym {version} is outside the releases gym-autoinstr was built against ({KNOWN_RANGE})",
                "check the pointcuts in this report: where they resolve, tracing works",
            )
        )

    report = resolve_pointcuts(version)
    problems += _pointcut_problems(version, report)
    start, effective, found = startup(environ)
    problems += found
    exporter_rows, found = exporters(effective, start["configurator"]["selected"])
    problems += found
    group_section, found = span_groups(effective)
    problems += found
    native, found = native_telemetry(report)
    problems += found
    venvs_section, found = server_venvs(report)
    problems += found

    ok = not any(p.severity == ERROR for p in problems)
    return {
        "ok": ok,
        "gym_autoinstr": __version__,
        "python": sys.version.split()[0],
        "gym": gym,
        "pointcuts": report,
        "startup": start,
        "exporters": exporter_rows,
        "span_groups": group_section,
        "native_telemetry": native,
        "server_venvs": venvs_section,
        "this_process": {"configured_by": STATE.get("configured_by"), "exporters": list(STATE.get("exporters") or [])},
        "problems": [asdict(p) for p in problems],
    }


def render(diagnosis: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = []
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
    start = diagnosis["startup"]
    lines.append("")
    lines.append(f"distro        {start['distro']['selected'] or 'default'}  (installed: {_names(start['distro']['installed'])})")
    lines.append(f"configurator  {start['configurator']['selected'] or 'none'}  (installed: {_names(start['configurator']['installed'])})")
    lines.append(f"instrumentors {', '.join(start['instrumentors']['enabled']) or 'none'}")
    for row in diagnosis["exporters"]:
        detail = f" over {row['used']}" if row.get("used") and row.get("protocol") else ""
        detail += f" to {row['directory']}" if row.get("directory") else ""
        lines.append(f"exporter      {row['name']}{detail}  ({'importable' if row['importable'] else 'NOT importable'})")
    if not diagnosis["exporters"]:
        lines.append("exporter      none")
    groups_section = diagnosis["span_groups"]
    source = groups_section["variable"] or "default"
    lines.append(f"span groups   {', '.join(groups_section['enabled']) or 'none'}  (from {source})")
    native = diagnosis["native_telemetry"]
    lines.append(
        "Gym telemetry "
        + ("live: we stand down" if native["live"] else "not in this Gym" if not native["present"] else "inert: we trace")
    )
    venvs = diagnosis["server_venvs"]
    lines.append(
        "server venvs  "
        + (f"gym env start installs {len(venvs['requirements'])} pinned packages into each"
           if venvs["will_install"] else "NOT given our packages")
    )
    lines.append("")
    for problem in diagnosis["problems"]:
        lines.append(f"{problem['severity'].upper()}: {problem['subject']}: {problem['problem']}")
        lines.append(f"  fix: {problem['fix']}")
    lines.append("tracing would work" if diagnosis["ok"] else "tracing would NOT work")
    return "\n".join(lines)


def _names(rows: list[dict[str, str]]) -> str:
    return ", ".join(row["name"] for row in rows) or "none"


def main(*, as_json: bool = False) -> int:
    import json

    diagnosis = diagnose()
    if as_json:
        print(json.dumps(diagnosis, indent=1, default=str))
    else:
        print(render(diagnosis))
    return 0 if diagnosis["ok"] else 1
