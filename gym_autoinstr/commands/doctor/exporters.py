"""Can the exporters the start-up would use be imported, and where would spans go."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import ERROR, INFO, WARNING, Problem, adder
from gym_autoinstr.commands.doctor.startup import OUR_CONFIGURATOR, _entry_points
from gym_autoinstr.fastpath import contract
from gym_autoinstr.setup import files
from gym_autoinstr.setup.configurator import OTLP_EXPORTERS  # protocol -> (module, package)


def _importable(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def _otlp_protocol(environ: Mapping[str, str]) -> str:
    raw = (settings.OTLP_TRACES_PROTOCOL.raw(environ) or "").strip().lower()
    return "grpc" if raw == "grpc" else "http/protobuf"


def exporters(environ: Mapping[str, str], configurator: str | None) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The trace exporters the configurator would build, and whether their packages import."""
    problems: list[Problem] = []
    add = adder(problems, "exporter")
    rows: list[dict[str, Any]] = []
    if settings.SDK_DISABLED.read(environ):
        add(ERROR, "OTEL_SDK_DISABLED=true: no span is recorded", "unset OTEL_SDK_DISABLED")
        return rows, problems
    if configurator == OUR_CONFIGURATOR and files.embedded_default_applies(environ):
        return _embedded_default(environ)
    configured = settings.TRACES_EXPORTER.raw(environ)
    names = [n.strip().lower() for n in ("otlp" if configured is None else configured).split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names:
        add(
            ERROR,
            f"OTEL_TRACES_EXPORTER={configured!r}: spans are created but never exported",
            "set OTEL_TRACES_EXPORTER=otlp (or console to see spans on stderr)",
        )
    falls_back = configurator == OUR_CONFIGURATOR
    working = 0
    for name in names:
        if name in ("otlp", "otlp_proto_http", "otlp_proto_grpc"):
            protocol = (
                _otlp_protocol(environ) if name == "otlp" else ("grpc" if name.endswith("grpc") else "http/protobuf")
            )
            module, package = OTLP_EXPORTERS[protocol]
            error = _importable(module)
            row = {
                "name": name,
                "protocol": protocol,
                "module": module,
                "package": package,
                "importable": error is None,
                "error": error,
                "used": protocol if error is None else None,
            }
            if error is None:
                working += 1
            else:
                other = next(p for p in OTLP_EXPORTERS if p != protocol)
                other_module, other_package = OTLP_EXPORTERS[other]
                if falls_back and _importable(other_module) is None:
                    row["used"] = other
                    working += 1
                    add(
                        WARNING,
                        f"the OTLP {protocol} exporter cannot be imported ({error}); "
                        f"spans go over OTLP {other} instead, to that protocol's port",
                        f"pip install {package}, or set OTEL_EXPORTER_OTLP_PROTOCOL={other} and point "
                        "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's port for it (4317 grpc, 4318 http)",
                    )
                else:
                    add(
                        ERROR,
                        f"the OTLP {protocol} exporter cannot be imported ({error}): "
                        "spans are created but never exported",
                        f"pip install {package}",
                    )
            rows.append(row)
        elif name == "console" or (name == "files" and configurator == OUR_CONFIGURATOR):
            # files: our configurator's run directory (GYM_AUTOINSTR_OUTPUT_DIR), as the embedded default
            rows.append({"name": name, "importable": True, "used": name})
            working += 1
        else:
            provided = [e for e in _entry_points("opentelemetry_traces_exporter") if e["name"] == name]
            rows.append({"name": name, "importable": bool(provided), "used": name if provided else None})
            if provided:
                working += 1
            else:
                add(
                    ERROR if len(names) == 1 else WARNING,
                    f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides",
                    "set OTEL_TRACES_EXPORTER=otlp, or install the package providing that exporter",
                )
    return rows, problems


def _embedded_default(environ: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[Problem]]:
    """No exporter configured: our configurator writes OTLP-JSON files to a run directory."""
    configured = settings.OUTPUT_DIR.raw(environ)
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
                f"set {files.OUTPUT_DIR_VARIABLE} to a writable directory, "
                "or OTEL_EXPORTER_OTLP_ENDPOINT to a collector",
            )
        ]
    return [row], [
        Problem(
            INFO,
            "exporter",
            f"no exporter is configured: each Gym process writes its spans as OTLP-JSON under {directory}"
            + ("" if configured else " (relative to where the orchestrator runs)"),
            "read them with `gym-autoinstr view <run directory>`; "
            "set OTEL_EXPORTER_OTLP_ENDPOINT to send to a collector",
        )
    ]


# signal -> protocol -> OTLP exporter module; kept in step with configurator.py and logs.py
OTLP_SIGNAL_EXPORTERS = {
    "metrics": {
        "http/protobuf": "opentelemetry.exporter.otlp.proto.http.metric_exporter",
        "grpc": "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    },
    "logs": {
        "http/protobuf": contract.OTLP_HTTP_LOG_EXPORTER,
        "grpc": contract.OTLP_GRPC_LOG_EXPORTER,
    },
}
SIGNAL_VARIABLES = {"metrics": settings.METRICS_EXPORTER.name, "logs": settings.LOGS_EXPORTER.name}
_SIGNAL_PROTOCOLS = {"metrics": settings.OTLP_METRICS_PROTOCOL, "logs": settings.OTLP_LOGS_PROTOCOL}


def signal_exporters(environ: Mapping[str, str], signal: str) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The metric or log exporters every Gym process would build (``signal``: metrics, logs)."""
    from gym_autoinstr.setup import logs

    if settings.SDK_DISABLED.read(environ):
        return [], []
    variable = SIGNAL_VARIABLES[signal]
    if signal == "metrics":
        default = "files" if files.embedded_default_applies(environ) else "otlp"
        configured = settings.METRICS_EXPORTER.raw(environ)
        names = [n.strip().lower() for n in (default if configured is None else configured).split(",") if n.strip()]
        names = [n for n in names if n != "none"]
    else:
        names = logs.requested(environ)
    rows: list[dict[str, Any]] = []
    problems: list[Problem] = []
    add = adder(problems, "exporter")
    for name in names:
        if name == "otlp":
            raw = _SIGNAL_PROTOCOLS[signal].raw(environ) or settings.OTLP_PROTOCOL.raw(environ) or ""
            protocol = "grpc" if raw.strip().lower() == "grpc" else "http/protobuf"
            error = _importable(OTLP_SIGNAL_EXPORTERS[signal][protocol])
            rows.append(
                {
                    "name": name,
                    "protocol": protocol,
                    "importable": error is None,
                    "error": error,
                    "used": protocol if error is None else None,
                }
            )
            if error is not None:
                add(
                    WARNING,
                    f"the OTLP {protocol} {signal} exporter cannot be imported ({error}): no {signal} are exported",
                    f"pip install opentelemetry-exporter-otlp-proto-{'grpc' if protocol == 'grpc' else 'http'}",
                )
        elif name in ("console", "files"):
            row: dict[str, Any] = {"name": name, "importable": True, "used": name}
            if name == "files":
                row["directory"] = settings.OUTPUT_DIR.raw(environ) or os.path.join(
                    ".", files.DEFAULT_PARENT, "<run id>"
                )
            rows.append(row)
        else:
            rows.append({"name": name, "importable": False, "used": None})
            add(
                WARNING,
                f"{variable} names {name!r}, which gym-autoinstr does not build: no {signal} from it",
                f"set {variable} to otlp, console, files or none",
            )
    return rows, problems
