"""The OpenTelemetry configurator for Gym processes (entry point ``gym_autoinstr``).

It builds the SDK pipeline from the standard ``OTEL_*`` variables with defaults tuned for
Gym, in Gym processes only (others are held back until they import Gym), each under its
own identity; where it differs from the SDK's stock configurator, and why:
docs/architecture.md, "How it works".
"""

from __future__ import annotations

import atexit
import enum
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from gym_autoinstr import settings as env  # the declared variables (a function below takes `settings`)
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.attributes import RAY_NODE_ID, SERVICE_NAME, SHARD
from gym_autoinstr.fastpath import batching, contract, parts
from gym_autoinstr.setup import files, identity, meters, notes, runs, wind_down
from gym_autoinstr.setup.flush import WatchedExporter, flush, start_flusher
from gym_autoinstr.telemetry import sampling

# Batch settings for Gym's scale (thousands of concurrent rollouts): a deep queue so a
# burst is absorbed instead of dropped, large batches, and a short delay so that little
# is left to flush when Gym's one-second shutdown grace starts.
BATCH_DEFAULTS = {
    setting.name: setting.default  # 1000 ms, 65536, 4096
    for setting in (env.BSP_SCHEDULE_DELAY, env.BSP_MAX_QUEUE_SIZE, env.BSP_MAX_EXPORT_BATCH_SIZE)
}

PROTOCOL_HTTP = "http/protobuf"
PROTOCOL_GRPC = "grpc"
OTLP_EXPORTERS = {
    PROTOCOL_HTTP: ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry-exporter-otlp-proto-http"),
    PROTOCOL_GRPC: ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "opentelemetry-exporter-otlp-proto-grpc"),
}


class ConfiguredBy(str, enum.Enum):
    """Who set up this process's pipeline (besides ``foreign(provider)``, another's)."""

    GYM_AUTOINSTR = "gym_autoinstr"  # configure_process: a Gym server or orchestrator
    RAY_WORKER = "gym_autoinstr:ray_worker"  # configure_ray_worker
    RAY_ORCHESTRATOR = "gym_autoinstr:ray_orchestrator"  # a Ray actor running Gym's orchestration
    SKIPPED = "skipped"  # no provider: one of Ray's processes, or OTEL_SDK_DISABLED
    DISABLED = "disabled"  # a Ray worker whose task's settings say OTEL_SDK_DISABLED

    def __str__(self) -> str:
        return self.value


def foreign(provider: Any) -> str:
    """``configured_by`` when another's tracer provider is live here: ``foreign:<its module>``."""
    return f"foreign:{type(provider).__module__}"


@dataclass
class ConfiguratorState:
    # None until configured; a ConfiguredBy, or foreign(provider)'s string
    configured_by: ConfiguredBy | str | None = None
    exporters: list[str] = field(default_factory=list)  # labels of the span exporters
    identity: identity.ProcessIdentity | None = None
    metrics: bool = False  # our request metrics are recorded
    logs: bool = False  # log records are exported
    held_back: bool = False  # not (yet) a Gym process: configured when it imports Gym


# What this process ended up with; `gym-autoinstr doctor` and the tests read it.
STATE = ConfiguratorState()


def _otlp_protocol() -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``: grpc or http/protobuf."""
    return env.OTLP_TRACES_PROTOCOL.read()


def _otlp_exporter(protocol: str) -> SpanExporter | None:
    order = [protocol] + [p for p in OTLP_EXPORTERS if p != protocol]
    for candidate in order:
        module_name, package = OTLP_EXPORTERS[candidate]
        try:
            module = __import__(module_name, fromlist=["OTLPSpanExporter"])
        except ImportError as error:
            warn_once(
                f"exporter-missing:{candidate}",
                "OTLP %s exporter unavailable (%s): install %s. %s",
                candidate,
                error,
                package,
                "Trying the other OTLP protocol." if candidate == protocol else "",
            )
            continue
        if candidate != protocol:
            warn_once(
                "exporter-fallback",
                "exporting over OTLP %s instead of %s; point OTEL_EXPORTER_OTLP_ENDPOINT at the "
                "collector's %s port (4317 grpc, 4318 http) or install %s.",
                candidate,
                protocol,
                candidate,
                OTLP_EXPORTERS[protocol][1],
            )
        return module.OTLPSpanExporter()
    warn_once(
        "exporter-none",
        "no OTLP exporter could be loaded: spans are created and trace context propagates, but nothing is exported.",
    )
    return None


def _entry_point_exporter(name: str) -> SpanExporter | None:
    from importlib.metadata import entry_points

    installed = {entry_point.name: entry_point for entry_point in entry_points(group="opentelemetry_traces_exporter")}
    if name in installed:
        return installed[name].load()()
    warn_once(
        f"exporter-unknown:{name}",
        "OTEL_TRACES_EXPORTER names %r, which no installed package provides; known here: %s. "
        "Name those (comma-separated) in OTEL_TRACES_EXPORTER, or install the package that provides %r.",
        name,
        ", ".join(dict.fromkeys([*_BUILT_HERE, "files", *sorted(installed)])),
        name,
    )
    return None


def _files_exporter(who: identity.ProcessIdentity | None) -> tuple[str, SpanExporter]:
    """The run directory's OTLP-JSON file of this process (the embedded default, or
    ``files`` among OTEL_TRACES_EXPORTER's names: a local copy beside OTLP)."""
    who = who or identity.detect()
    run_id = identity.run_id()
    directory = files.resolve_output_dir(run_id)
    if who.role is identity.Role.ORCHESTRATOR and run_id and runs.starts_fleet(sys.argv):
        runs.record_run(directory, run_id)  # for a collection process to join (runs.py)
    service = identity.service_name(who)
    exporter = files.OtlpJsonFileExporter(directory, service)
    notes.start(directory, files.process_stem(service), service)
    return f"files:{directory}", exporter


# OTEL_TRACES_EXPORTER's names built here, besides files (others: installed entry points)
_BUILT_HERE: dict[str, Callable[[], SpanExporter | None]] = {
    "otlp": lambda: _otlp_exporter(_otlp_protocol()),
    "otlp_proto_http": lambda: _otlp_exporter(PROTOCOL_HTTP),
    "otlp_proto_grpc": lambda: _otlp_exporter(PROTOCOL_GRPC),
    "console": ConsoleSpanExporter,
    "none": lambda: None,
}


def span_exporters(who: identity.ProcessIdentity | None = None) -> list[tuple[str, SpanExporter]]:
    if files.embedded_default_applies():
        return [_files_exporter(who)]
    names = env.TRACES_EXPORTER.raw()
    names = "otlp" if names is None else names
    exporters: list[tuple[str, SpanExporter]] = []
    for raw in names.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        try:
            if name == "files":
                exporters.append(_files_exporter(who))
                continue
            exporter = _BUILT_HERE.get(name, lambda: _entry_point_exporter(name))()
        except Exception as error:
            warn_once(f"exporter-error:{name}", "trace exporter %r could not be created: %r", name, error)
            continue
        if exporter is not None:
            exporters.append((f"{name}:{type(exporter).__module__}", exporter))
    return exporters


def build_tracer_provider(who: identity.ProcessIdentity, extra: dict[str, Any] | None = None) -> TracerProvider:
    resource = Resource.create({**identity.resource_attributes(who), **(extra or {})})
    exporters = span_exporters(who)
    # the fast parts in play are checked now (their exporters loaded what they work with),
    # before they are used: one that fails leaves its work to the SDK (parts.py)
    parts.check()
    provider = TracerProvider(resource=resource, sampler=sampling.configured_sampler(), shutdown_on_exit=False)
    for label, exporter in exporters:
        kind = label.split(":", 1)[0]  # the exporter's name in the loss counts
        provider.add_span_processor(
            batching.make_processor(
                exporter,
                lambda inner, kind=kind: WatchedExporter(inner, kind),
                label=kind,
                max_queue_size=env.BSP_MAX_QUEUE_SIZE.read(),
                schedule_delay_millis=env.BSP_SCHEDULE_DELAY.read(),
                max_export_batch_size=env.BSP_MAX_EXPORT_BATCH_SIZE.read(),
            )
        )
        STATE.exporters.append(label)
    wind_down.register(identity.service_name(who))  # (before the exit flush is registered: runs after it)
    return provider


def _flush_at_exit() -> None:
    flush(reason="process exit")


def configure_process() -> TracerProvider | None:
    """Set up the SDK for this process if it is part of a Gym fleet; idempotent."""
    if STATE.configured_by is not None:
        return None
    from gym_autoinstr.telemetry.spans import mark_startup

    mark_startup("configured")
    who = identity.detect()
    STATE.identity = who
    if who.role is identity.Role.RAY or env.SDK_DISABLED.read():
        STATE.configured_by = ConfiguredBy.SKIPPED
        return None
    joined = None
    # a collection process beside a running `gym env start`: one run directory for both
    collects = who.role is identity.Role.PROCESS or (
        who.role is identity.Role.ORCHESTRATOR and not runs.starts_fleet(sys.argv)
    )
    if collects and files.embedded_default_applies():
        joined = runs.join_live_run(Path.cwd() / files.DEFAULT_PARENT)
    provider = build_tracer_provider(who)
    if collects and joined is None and files.embedded_default_applies():
        logger.info(
            "traces of this process go to %s (no `gym env start` runs from this directory to join; "
            "`gym-autoinstr view %s` shows every run there).",
            files.resolve_output_dir(identity.run_id()),
            files.DEFAULT_PARENT,
        )
    trace.set_tracer_provider(provider)
    try:
        STATE.metrics = meters.configure(provider.resource, who)
    except Exception as error:
        warn_once("metrics", "metrics are off: %r", error)
    try:
        from gym_autoinstr.setup import logs

        STATE.logs = logs.configure(provider.resource, who, otlp_protocol=_otlp_protocol)
    except Exception as error:
        warn_once("logs", "log export is off: %r", error)
    start_flusher()
    from gym_autoinstr.setup import quiet

    quiet.install()  # one line per export-failure cause, not one per retry
    atexit.register(_flush_at_exit)
    STATE.configured_by = ConfiguredBy.GYM_AUTOINSTR
    logger.debug("configured %s (%s); exporters: %s", who.name, who.role.value, STATE.exporters or "none")
    return provider


# What a Gym process hands a Ray worker with each task, so that the worker exports where
# the fleet does even when the task's runtime_env or the cluster's own environment
# differs.  Never headers, certificates or keys: those stay in the worker's environment.
RAY_WORKER_SETTINGS = tuple(
    setting.name
    for setting in (
        env.SDK_DISABLED,
        env.SERVICE_NAME,
        env.TRACES_EXPORTER,
        env.OTLP_ENDPOINT,
        env.OTLP_TRACES_ENDPOINT,
        env.OTLP_PROTOCOL,
        env.OTLP_TRACES_PROTOCOL,
        env.OTLP_INSECURE,
        env.OTLP_TRACES_INSECURE,
        env.OTLP_TIMEOUT,
        env.OTLP_TRACES_TIMEOUT,
        env.BSP_SCHEDULE_DELAY,
        env.BSP_MAX_QUEUE_SIZE,
        env.BSP_MAX_EXPORT_BATCH_SIZE,
        env.BSP_EXPORT_TIMEOUT,
        env.SERVICE_NAME_SUFFIX,
        env.OUTPUT_DIR,
        env.SEGMENT_MB,
        env.RUN_MAX_GB,
        env.FLUSH_TIMEOUT_MS,
        env.RUN_ID,
        env.GYM_RUN_ID,
    )
)
_ray_worker_lock = threading.Lock()


def ray_worker_settings() -> dict[str, str]:
    """This process's exporter settings, as handed to the Ray workers running its tasks."""
    return {name: os.environ[name] for name in RAY_WORKER_SETTINGS if name in os.environ}


def configure_ray_worker(server_name: str, settings: dict[str, str], node_id: str | None) -> bool:
    """Give this Ray worker a tracer provider, the first time it runs a task a Gym process
    submitted; True when spans from here are exported.  Idempotent and thread-safe.

    Ray workers start silent, like Ray's daemons (``configure_process`` skips role
    ``ray``); a worker becomes part of the fleet only when Gym's work arrives, under the
    identity of the Gym server that submitted it and with that server's exporter settings
    (they win over the worker's environment, which a task's runtime_env may replace).
    """
    with _ray_worker_lock:
        configured = STATE.configured_by
        if configured not in (None, ConfiguredBy.SKIPPED):
            return configured != ConfiguredBy.DISABLED
        who = identity.ray_worker(server_name)
        STATE.identity = who
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            if env.SDK_DISABLED.read():
                STATE.configured_by = ConfiguredBy.DISABLED
                return False
            provider = build_tracer_provider(who, extra={RAY_NODE_ID: node_id} if node_id else None)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
            STATE.configured_by = ConfiguredBy.RAY_WORKER
        else:  # someone else's provider is already live here: use it, as elsewhere
            STATE.configured_by = foreign(trace.get_tracer_provider())
        start_flusher()
        from gym_autoinstr.setup import quiet

        quiet.install()
        atexit.register(_flush_at_exit)
        logger.debug("Ray worker configured for %s; exporters: %s", server_name, STATE.exporters or "none")
        return True


def configure_ray_orchestrator(extra: dict[str, Any]) -> bool:
    """Make this Ray worker a Gym orchestrator, the first time it runs Gym's orchestration
    (starts a fleet or collects rollouts: NeMo RL's ``NemoGym`` actor); True when it is one
    now.  Idempotent and thread-safe.

    ``extra`` says which actor, shard and node (resource attributes).  An embedder's own
    tracer provider, already live in the actor, is adopted (our identity merged into its
    resource), never doubled.  The shard goes into the environment so that every server
    the actor spawns carries it, and the orchestrator's run id is minted as under
    ``gym env start``.
    """
    with _ray_worker_lock:
        configured = STATE.configured_by
        if configured == ConfiguredBy.RAY_WORKER:
            return _ray_worker_becomes_orchestrator(extra)
        if configured not in (None, ConfiguredBy.SKIPPED):
            who = STATE.identity
            return who is not None and who.role is identity.Role.ORCHESTRATOR
        if env.SDK_DISABLED.read():
            STATE.configured_by = ConfiguredBy.DISABLED
            return False
        shard = extra.get(SHARD)
        if shard and not env.SHARD.raw():
            os.environ[identity.SHARD_VARIABLE] = str(shard)
        who = identity.ray_orchestrator()
        STATE.identity = who
        current = trace.get_tracer_provider()
        resource = getattr(current, contract.PROVIDER_RESOURCE, None)
        if isinstance(current, trace.ProxyTracerProvider) or not isinstance(resource, Resource):
            provider = build_tracer_provider(who, extra={k: v for k, v in extra.items() if v is not None})
            if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
                trace.set_tracer_provider(provider)
                STATE.configured_by = ConfiguredBy.RAY_ORCHESTRATOR
            else:  # not an SDK provider we can add our identity to: use it as it is
                STATE.configured_by = foreign(current)
        else:
            # The embedder's provider: our identity joins its resource; its service.name
            # stays unless OTEL_SERVICE_NAME says otherwise (as adopt_foreign_provider).
            attributes = {**identity.resource_attributes(who), **{k: v for k, v in extra.items() if v is not None}}
            _add_identity(current, resource, attributes)
            STATE.configured_by = foreign(current)
        start_flusher()
        from gym_autoinstr.setup import quiet

        quiet.install()
        atexit.register(_flush_at_exit)
        logger.debug("Ray worker runs Gym's orchestration: configured as %s (%s)", who.name, STATE.configured_by)
        return True


def _ray_worker_becomes_orchestrator(extra: dict[str, Any]) -> bool:
    """An actor that ran a traced method call first (our provider, built for a Ray worker
    doing a Gym server's work) and then starts Gym: the provider stays (it is the global
    one), its resource becomes the orchestrator's, for the tracers it handed out too."""
    shard = extra.get(SHARD)
    if shard and not env.SHARD.raw():
        os.environ[identity.SHARD_VARIABLE] = str(shard)
    who = identity.ray_orchestrator()
    provider = trace.get_tracer_provider()
    resource = Resource.create(
        {**identity.resource_attributes(who), **{k: v for k, v in extra.items() if v is not None}}
    )
    try:
        setattr(provider, contract.PROVIDER_RESOURCE, resource)
        for handed_out in list(getattr(provider, contract.PROVIDER_TRACERS, {}).values()):  # SDKs after 1.39 keep them
            handed_out.resource = resource
    except Exception as error:
        warn_once("ray-orchestrator-upgrade", "this Ray actor's spans keep the Ray worker's identity: %r", error)
        return False
    from gym_autoinstr.telemetry import spans

    spans._tracer = None  # our tracer is fetched again, with the new resource
    STATE.identity = who
    STATE.configured_by = ConfiguredBy.RAY_ORCHESTRATOR
    logger.debug("Ray worker that ran Gym tasks now runs Gym's orchestration: configured as %s", who.name)
    return True


def configure_at_start() -> None:
    """``opentelemetry-instrument``'s start-up: configure a Gym process now; hold any other
    process back (nothing set up, nothing written) until ``configure_gym_process``."""
    if STATE.configured_by is not None or STATE.held_back:
        return
    who = identity.detect()
    if who.role is identity.Role.PROCESS:
        from gym_autoinstr.telemetry.spans import mark_startup

        mark_startup("configured")  # start-up stages still count from here
        STATE.identity = who
        STATE.held_back = True
        logger.debug("%s is not a Gym process (yet): nothing exported until it imports Gym", who.name)
        return
    configure_process()


_held_back_lock = threading.Lock()


def configure_gym_process() -> None:
    """Gym is being imported: a process held back at start-up is a Gym process now and
    gets its pipeline, before any of Gym's code runs (its spans and metrics are kept)."""
    with _held_back_lock:  # two threads importing Gym's modules at once: one configures
        if not STATE.held_back:
            return
        STATE.held_back = False
    try:
        configure_process()
    except Exception as error:  # never break Gym's import statement
        warn_once("configure", "could not configure OpenTelemetry (%r); this process runs untraced.", error)


class GymConfigurator(contract.base_configurator()):
    def _configure(self, **kwargs: Any) -> None:
        try:
            configure_at_start()
        except Exception as error:  # never stop the program from starting
            warn_once("configure", "could not configure OpenTelemetry (%r); this process runs untraced.", error)


def adopt_foreign_provider() -> None:
    """Another configurator built the SDK provider (e.g. opentelemetry-distro's, picked
    first): give it our per-process identity before any tracer is handed out."""
    if STATE.configured_by is not None:
        return
    who = identity.detect()
    STATE.identity = who
    if not who.is_gym:
        return
    provider = trace.get_tracer_provider()
    resource = getattr(provider, contract.PROVIDER_RESOURCE, None)
    if not isinstance(resource, Resource):
        return
    STATE.configured_by = foreign(provider)
    _add_identity(provider, resource, identity.resource_attributes(who))


def _add_identity(provider: Any, resource: Resource, attributes: dict[str, Any]) -> None:
    """Merge our identity into another's provider resource; its own service.name stays
    unless OTEL_SERVICE_NAME says otherwise."""
    current = resource.attributes.get(SERVICE_NAME)
    if current and not str(current).startswith("unknown_service") and not env.SERVICE_NAME.raw():
        attributes = {k: v for k, v in attributes.items() if k != SERVICE_NAME}
    try:
        setattr(provider, contract.PROVIDER_RESOURCE, resource.merge(Resource(attributes)))
    except Exception as error:
        warn_once("adopt-provider", "could not add Gym identity to the active tracer provider: %r", error)
