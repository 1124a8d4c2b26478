"""Start-up spans: where the minutes of ``gym env start`` go (span group ``startup``).

Orchestrator: ``gym.startup`` from ``RunHelper.start`` until ``wait_for_spinup`` returns,
with one ``gym.startup.server`` child per server, from its spawn (``run_command``) to the
first health poll that found it ready (``check_http_server_statuses``; Gym polls every
3 s, so the end is as fine as Gym's own polling).  While ``run_command`` spawns a server,
the environment it copies for the child carries that server span's context
(``GYM_AUTOINSTR_STARTUP_TRACEPARENT``) and the spawn time (``GYM_AUTOINSTR_SPAWN_NS``).

Server: when its app's lifespan start-up completes, ``gym.server.startup`` (child of the
orchestrator's span for that server) with the stages, timed after the fact:

* ``gym.server.startup.venv_setup``: spawn to the first Python code of the server
  (OpenTelemetry's sitecustomize): Gym's setup command (``uv venv`` and ``uv pip
  install`` when Gym builds the venv) and the interpreter's own start;
* ``gym.server.startup.interpreter_start``: OpenTelemetry's start-up (SDK and patches);
* ``gym.server.startup.imports``: to ``run_webserver`` (the server module and Gym import);
* ``gym.server.startup.uvicorn_startup``: ``run_webserver`` to the app's lifespan start-up.

Each uvicorn worker (``num_workers > 1``) reports its own, with ``nemo.gym.server.worker``.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.attributes import PROCESS_PID, SERVER_NAME, SERVER_WORKER
from gym_autoinstr.telemetry import groups
from gym_autoinstr.telemetry.spans import STARTUP_MARKS as MARKS
from gym_autoinstr.telemetry.spans import mark_error, tracer
from gym_autoinstr.telemetry.spans import mark_startup as mark

TRACEPARENT_VARIABLE = settings.STARTUP_TRACEPARENT.name
SPAWN_VARIABLE = settings.SPAWN_NS.name


# Orchestrator state: the open gym.startup span and one child per spawned server.
@dataclass(slots=True)
class _StartupRun:
    span: Any = None  # gym.startup
    servers: dict[str, Any] = field(default_factory=dict)  # server name -> its spawn span


_run = _StartupRun()
_CONFIG_PATH = re.compile(r"NEMO_GYM_CONFIG_PATH=('([^']*)'|(\S+))")


def _enabled() -> bool:
    return groups.STARTUP in groups.ENABLED


# -- orchestrator ---------------------------------------------------------------------


def run_start_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``RunHelper.start``: open ``gym.startup`` (ended when all servers are ready)."""
    if _enabled() and _run.span is None:
        try:
            _run.span = tracer().start_span("gym.startup", kind=SpanKind.INTERNAL)
        except Exception as error:
            warn_once("startup:start", "gym.startup span skipped: %r", error)
    try:
        return wrapped(*args, **kwargs)
    except BaseException as error:
        _end_all(error)
        raise


def _server_name(args: tuple, kwargs: dict) -> str | None:
    name = kwargs.get("server_name")
    if isinstance(name, str) and name:
        return name
    command = args[0] if args else kwargs.get("command", "")
    found = _CONFIG_PATH.search(command) if isinstance(command, str) else None
    return (found.group(2) or found.group(3)) if found else None


def run_command_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around ``run_command``: the start-up span of a spawned server, and the process to
    the fleet's memory sampler (opt-in)."""
    process = _spawn(wrapped, args, kwargs)
    try:
        from gym_autoinstr.advice import fleet_memory

        if fleet_memory.memory_sampling_on():
            fleet_memory.watch_server_memory(_server_name(args, kwargs), process)
    except Exception as error:
        warn_once("startup:memory", "server memory is not sampled: %r", error)
    return process


def _spawn(wrapped: Any, args: tuple, kwargs: dict) -> Any:
    """``run_command`` while ``gym.startup`` is open: a server span per spawn, whose
    context the child inherits through the environment ``run_command`` copies."""
    parent = _run.span
    if parent is None:
        return wrapped(*args, **kwargs)
    saved: dict[str, str | None] = {}
    try:
        name = _server_name(args, kwargs)
        if name and name not in _run.servers:
            span = tracer().start_span(
                "gym.startup.server",
                context=trace.set_span_in_context(parent),
                kind=SpanKind.INTERNAL,
                attributes={SERVER_NAME: name},
            )
            _run.servers[name] = span
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span))
            for variable, value in (
                (TRACEPARENT_VARIABLE, carrier.get("traceparent")),
                (SPAWN_VARIABLE, str(time.time_ns())),
            ):
                if value:
                    saved[variable] = os.environ.get(variable)
                    os.environ[variable] = value
    except Exception as error:
        warn_once("startup:spawn", "start-up span of a server skipped: %r", error)
    try:
        return wrapped(*args, **kwargs)
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


def statuses_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``RunHelper.check_http_server_statuses``: end the span of each server that
    answered its health poll for the first time."""
    statuses = wrapped(*args, **kwargs)
    if _run.servers:
        try:
            for name, status in statuses:
                span = _run.servers.get(name)
                if span is not None and status == "success" and span.is_recording():
                    span.end()
        except Exception as error:
            warn_once("startup:ready", "start-up span end skipped: %r", error)
    return statuses


def spinup_done(error: BaseException | None = None) -> None:
    """``RunHelper.wait_for_spinup`` returned (every server ready) or raised (from fleet.py,
    which owns that pointcut)."""
    if _run.span is not None:
        _end_all(error)


def _end_all(error: BaseException | None) -> None:
    try:
        for span in list(_run.servers.values()):
            if span.is_recording():
                if isinstance(error, Exception):
                    mark_error(span, error)
                span.end()
        span = _run.span
        if span is not None:
            if isinstance(error, Exception):
                mark_error(span, error)
            span.end()
    except Exception as failure:
        warn_once("startup:end", "start-up spans not ended: %r", failure)
    _run.span = None


# -- server ---------------------------------------------------------------------------


def report_server_startup(server_name: str) -> None:
    """At the app's lifespan start-up: the span of this server's start, with its stages."""
    if not _enabled() or "reported" in MARKS:
        return
    mark("reported")
    try:
        ready = time.time_ns()
        carrier = {"traceparent": settings.STARTUP_TRACEPARENT.raw() or ""}
        parent = propagate.extract(carrier) if carrier["traceparent"] else None
        spawn = _int(settings.SPAWN_NS.raw())
        configured = MARKS.get("configured")
        instrumented = MARKS.get("instrumented")
        webserver = MARKS.get("run_webserver")
        worker = _is_worker()
        attributes: dict[str, Any] = {SERVER_NAME: server_name, PROCESS_PID: os.getpid()}
        name = "gym.server.startup.worker" if worker else "gym.server.startup"
        if worker:
            attributes[SERVER_WORKER] = os.getpid()
        # Stage boundaries in order, clamped so that they never run backwards.  The OS's
        # process creation time is no boundary: Gym's shell execs Python in the process it
        # spawned, so that time is the shell's (before the venv is built).
        marks = [
            ("spawn", None if worker else spawn),
            ("configured", configured),
            ("instrumented", instrumented),
            ("run_webserver", webserver),
            ("ready", ready),
        ]
        known: list[tuple[str, int]] = []
        for label, value in marks:
            if value:
                known.append((label, max(value, known[-1][1]) if known else value))
        span = tracer().start_span(
            name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=known[0][1]
        )
        context = trace.set_span_in_context(span)
        for (label, start), (next_label, end) in zip(known, known[1:]):
            stage = _STAGES.get((label, next_label))
            if stage:
                tracer().start_span(
                    stage, context=context, attributes={SERVER_NAME: server_name}, start_time=start
                ).end(end_time=end)
        span.end(end_time=known[-1][1])
    except Exception as error:
        warn_once("startup:server", "server start-up span skipped: %r", error)


_STAGES = {
    ("spawn", "configured"): "gym.server.startup.venv_setup",
    ("configured", "instrumented"): "gym.server.startup.interpreter_start",
    ("instrumented", "run_webserver"): "gym.server.startup.imports",
    ("run_webserver", "ready"): "gym.server.startup.uvicorn_startup",
}


def _is_worker() -> bool:
    module = __import__("sys").modules.get("nemo_gym.server_utils")
    check = getattr(module, "is_nemo_gym_fastapi_worker", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:
        return False


def _int(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None
