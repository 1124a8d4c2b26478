"""Every place gym-autoinstr touches, as data.

``POINTCUTS``: the module and attribute, the advice applied (wrapt's wrapper signature
``(wrapped, instance, args, kwargs)``), the Gym versions it exists in (``versions``,
checked by ``version_applies``; its syntax: docs/architecture.md, "Layout") and the span
group it serves.  ``PROCESS_PATCHES``: what is patched at other moments for every user in
the process.  ``instrumentor.py`` applies both; ``gym-autoinstr doctor`` prints them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gym_autoinstr.advice import (
    coexistence,
    egress,
    fleet,
    ingress,
    job,
    outcome,
    ray_actor,
    ray_tasks,
    routes,
    sandbox,
    slurm,
    startup,
    venvs,
)
from gym_autoinstr.telemetry import groups


@dataclass(frozen=True)
class Pointcut:
    name: str
    module: str
    attribute: str  # dotted path inside the module: "request", "SimpleServer.run_webserver"
    advice: Callable[[Any, Any, tuple, dict], Any]
    versions: str  # the nemo-gym releases where the target exists
    group: str | None  # the span group its spans belong to (None: plumbing)
    purpose: str
    rebind_copies: bool = False  # modules copy it by name (`from m import f`)
    optional: bool = False  # absent in some supported Gym versions: not a warning
    # Parameters the advice relies on; a target whose signature lacks them has drifted
    # away from what the advice understands, and is skipped with a warning.
    parameters: tuple[str, ...] = ()


# Rows with a twin on Gym 0.2.0-0.3.x (``_legacy``), where the CLI was one module
# (``nemo_gym.cli``) and setup_command a top-level one: the same advice, there.
_FLEET_READY = Pointcut(
    name="fleet.ready",
    module="nemo_gym.cli.env",
    attribute="RunHelper.wait_for_spinup",
    advice=fleet.servers_ready_advice,
    versions="0.4.0+",
    group=None,
    purpose="gym.servers.active = N once every server is ready (orchestrator)",
    optional=True,
)
_FLEET_SHUTDOWN = Pointcut(
    name="fleet.shutdown",
    module="nemo_gym.cli.env",
    attribute="RunHelper.shutdown",
    advice=fleet.fleet_shutdown_advice,
    versions="0.4.0+",
    group=None,
    purpose="gym.servers.active = 0 after Gym's shutdown, then flush (orchestrator)",
    optional=True,
)
_STARTUP_RUN = Pointcut(
    name="startup.run",
    module="nemo_gym.cli.env",
    attribute="RunHelper.start",
    advice=startup.run_start_advice,
    versions="0.4.0+",
    group=groups.STARTUP,
    purpose="gym.startup from the start of `gym env start` until every server is ready (fleet.ready ends it)",
    optional=True,
)
_STARTUP_SPAWN = Pointcut(
    name="startup.spawn",
    module="nemo_gym.cli.setup_command",
    attribute="run_command",
    advice=startup.run_command_advice,
    versions="0.4.0+",
    group=groups.STARTUP,
    purpose="gym.startup.server per spawned server; its context and spawn time go to the child's environment",
    rebind_copies=True,
    optional=True,
)
_STARTUP_READY = Pointcut(
    name="startup.ready",
    module="nemo_gym.cli.env",
    attribute="RunHelper.check_http_server_statuses",
    advice=startup.statuses_advice,
    versions="0.4.0+",
    group=groups.STARTUP,
    purpose="a server's gym.startup.server ends at its first good health poll",
    optional=True,
)
_VENVS_REUSED = Pointcut(
    name="venvs.reused",
    module="nemo_gym.cli.setup_command",
    attribute="setup_env_command",
    advice=venvs.setup_env_command_advice,
    versions="0.4.0+",
    group=None,
    purpose="a venv reused under skip_venv_if_present without our packages: one message naming the "
    "server, the venv and the command that fixes it (orchestrator)",
    rebind_copies=True,
    optional=True,
)


def _legacy(row: Pointcut, module: str, purpose: str = "") -> Pointcut:
    return replace(
        row,
        name=f"{row.name}.legacy",
        module=module,
        versions="0.2.0-0.3.x",
        purpose=purpose or f"as {row.name}, where the CLI was one module",
    )


POINTCUTS: tuple[Pointcut, ...] = (
    Pointcut(
        name="egress",
        module="nemo_gym.server_utils",
        attribute="request",
        advice=egress.request_advice,
        versions="0.2.0+",
        group=groups.HTTP_CLIENT,
        purpose="CLIENT span per logical request, traceparent injected into a copy of the headers",
        rebind_copies=True,
        parameters=("method", "url"),
    ),
    Pointcut(
        name="outcome",
        module="nemo_gym.server_utils",
        attribute="get_response_json",
        advice=outcome.get_response_json_advice,
        versions="0.2.0+",
        group=groups.HTTP_CLIENT,
        purpose="a rollout's reward, tokens and failure from the answers Gym parses (/run, /verify, model calls) "
        "onto their CLIENT spans, which end then (no second parse)",
        rebind_copies=True,
        parameters=("response",),
    ),
    Pointcut(
        name="ingress",
        module="nemo_gym.server_utils",
        attribute="SimpleServer.run_webserver",
        advice=ingress.run_webserver_advice,
        versions="0.2.0+",
        group=groups.SERVER,
        purpose="scope the uvicorn advice to Gym servers; instrument the app each uvicorn worker serves",
    ),
    Pointcut(
        name="ingress.uvicorn",
        module="uvicorn",
        attribute="run",
        advice=ingress.uvicorn_run_advice,
        versions="any uvicorn",
        group=groups.SERVER,
        purpose="SERVER-span middleware on the app before it starts; flush when serving ends",
    ),
    Pointcut(
        name="ingress.limits",
        module="nemo_gym.server_utils",
        attribute="SimpleServer.set_ulimit",
        advice=ingress.server_limits_advice,
        versions="0.2.0+",
        group=None,  # metrics only
        purpose="metrics: observe the asyncio semaphores of the Gym server run_webserver built, where it serves "
        "(the single process, or each uvicorn worker)",
    ),
    Pointcut(
        name="ingress.head_server",
        module="nemo_gym.server_utils",
        attribute="HeadServer.setup_webserver",
        advice=ingress.head_server_advice,
        versions="0.2.0+",
        group=None,
        purpose="keep FastAPI's built-in telemetry off the head server (orchestrator plumbing, not rollout work)",
    ),
    Pointcut(
        name="egress.pool",
        module="nemo_gym.server_utils",
        attribute="set_global_aiohttp_client",
        advice=egress.global_client_advice,
        versions="0.2.0+",
        group=None,
        purpose="count the attempts inside one traced request (http.request.resend_count) on Gym's client; "
        "metrics: time waits for an aiohttp connection slot on it, by destination server",
        rebind_copies=True,
    ),
    Pointcut(
        name="coexistence",
        module="nemo_gym.telemetry.setup",
        attribute="init_telemetry",
        advice=coexistence.init_telemetry_advice,
        versions="0.6.0+",
        group=None,
        purpose="stand down where Gym's own telemetry is live",
        optional=True,
    ),
    Pointcut(
        name="routes",
        module="fastapi.routing",
        attribute="APIRouter.add_api_route",
        advice=routes.add_api_route_advice,
        versions="any fastapi",
        group=None,  # per route: rollout, agent, model_call or verify, checked per request
        purpose="seam spans (gym.rollout, gym.agent.responses, gym.model.*, gym.verify) around the "
        "handlers a Gym server's setup_webserver registers",
    ),
    Pointcut(
        name="routes.rollout_id",
        module="nemo_gym.rollout_correlation",
        attribute="rollout_context",
        advice=routes.rollout_context_advice,
        versions="0.5.0+",
        group=groups.ROLLOUT,
        purpose="tag the open seam span with nemo.gym.rollout.id when the agent's /run enters rollout_context",
        rebind_copies=True,
        optional=True,
    ),
    Pointcut(
        name="job",
        module="nemo_gym.rollout_collection",
        attribute="RolloutCollectionHelper.run_from_config",
        advice=job.run_from_config_advice,
        versions="0.2.0+",
        group=groups.JOB,
        purpose="gym.job around a rollout collection run (ng_collect_rollouts, gym eval run); the rollouts it "
        "dispatches become root traces linked to it (egress), "
        "or nest (GYM_AUTOINSTR_JOB_TRACE=single, an embedder's span)",
    ),
    Pointcut(
        name="job.examples",
        module="nemo_gym.rollout_collection",
        attribute="RolloutCollectionHelper.run_examples",
        advice=job.run_examples_advice,
        versions="0.2.0+",
        group=groups.JOB,
        purpose="gym.job per run_examples call (the entry an embedder such as NeMo RL's NemoGym actor calls); "
        "its rollouts root traces linked to it, or nested, as for job; none inside run_from_config's",
        optional=True,
    ),
    Pointcut(
        name="slurm.submit",
        module="nemo_gym.orchestration.executors.slurm",
        attribute="SlurmExecutor.run",
        advice=slurm.executor_run_advice,
        versions="0.6.0+",
        group=groups.JOB,
        purpose="gym.submit PRODUCER span around `gym eval submit` on Slurm: cluster, benchmarks, the submission "
        "id and each job id; the jobs' gym.job spans link to it",
        optional=True,
        parameters=("config",),
    ),
    Pointcut(
        name="slurm.script",
        module="nemo_gym.orchestration.executors.slurm_script",
        attribute="build_sbatch_script",
        advice=slurm.sbatch_script_advice,
        versions="0.6.0+",
        group=None,  # plumbing: what the job needs to be traced rides in its driver command
        purpose="the sbatch script's driver command starts under opentelemetry-instrument where the job's "
        "environment has gym-autoinstr, with this process's settings and gym.submit's context",
        rebind_copies=True,
        optional=True,
        parameters=("config", "benchmark_name", "remote_bench_dir"),
    ),
    *(
        Pointcut(
            name=f"sandbox.{method}",
            module="nemo_gym.sandbox.api",
            attribute=f"AsyncSandbox.{method}",
            advice=advice,
            versions="0.4.0+",
            group=groups.SANDBOX,
            purpose=f"gym.sandbox.{method} {what}",
            optional=True,
        )
        for method, advice, what in (
            ("start", sandbox.start_advice, "with provider and sandbox id"),
            ("exec", sandbox.exec_advice, "with return code and error type, never the command, cwd, env or output"),
            ("stop", sandbox.stop_advice, "of a running sandbox"),
        )
    ),
    Pointcut(
        name="sandbox.create_retry.opensandbox",
        module="nemo_gym.sandbox.providers.opensandbox.provider",
        attribute="_log_create_retry",
        advice=sandbox.create_retry_advice,
        versions="0.4.0+",
        group=None,  # metrics only
        purpose="metrics: gym.sandbox.create_retry_total, one per create attempt the provider retries "
        "(tenacity's before_sleep, looked up in the module at each create)",
        optional=True,
    ),
    Pointcut(
        name="sandbox.create_retry.daytona",
        module="nemo_gym.sandbox.providers.daytona.provider",
        attribute="_log_create_retry",
        advice=sandbox.create_retry_advice,
        versions="0.5.0+",
        group=None,  # metrics only
        purpose="metrics: gym.sandbox.create_retry_total, one per create attempt the provider retries",
        optional=True,
    ),
    Pointcut(
        name="ray.task",
        module="ray.remote_function",
        attribute="RemoteFunction._remote",
        advice=ray_tasks.remote_function_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="ray.submit PRODUCER span around a task submission from a Gym process; the trace context "
        "rides to the worker, which runs the task in a ray.execute span and exports as the Gym server's",
        parameters=("args", "kwargs"),
    ),
    Pointcut(
        name="ray.actor",
        module="ray.actor",
        attribute="_modify_class",
        advice=ray_tasks.modify_class_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="the methods of an actor class a Gym process creates take the trace context (in Ray's own "
        "subclass, never the user's class)",
        parameters=("cls",),
    ),
    Pointcut(
        name="ray.actor_create",
        module="ray.actor",
        attribute="ActorClass._remote",
        advice=ray_actor.actor_create_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="an actor's creation carries the creator's context and exporter settings to its __init__, so an "
        "actor whose runtime_env replaces PYTHONPATH still watches for Gym's orchestration",
        parameters=("args", "kwargs"),
    ),
    Pointcut(
        name="ray.actor_method",
        module="ray.actor",
        attribute="ActorMethod._remote",
        advice=ray_tasks.actor_method_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="ray.submit PRODUCER span around an actor method call from a Gym process; the actor runs it in "
        "a ray.execute span",
        parameters=("args", "kwargs"),
    ),
    Pointcut(
        name="ray.kill",
        module="ray",
        attribute="kill",
        advice=ray_tasks.kill_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="before ray.kill kills an actor whose methods are traced, the actor exports its ended spans "
        "(waiting at most the flush timeout), so the spans of its last calls are not lost to the kill",
        parameters=("actor",),
    ),
    *(
        Pointcut(
            name=f"ray.client_call.{stub}",
            module="ray.util.client.common",
            attribute=f"{stub}.remote",
            advice=ray_tasks.client_call_advice,
            versions="any ray",
            group=groups.RAY,
            purpose="Ray client mode (ray://): ray.submit PRODUCER span and the trace context for a call through "
            "Ray's client stub (an actor method, a remote function, after .options(...)); a stub declared after "
            "the connection cannot carry it: one message",
            optional=True,
        )
        for stub in ("ClientRemoteMethod", "ClientRemoteFunc", "OptionWrapper")
    ),
    Pointcut(
        name="ray.get_error",
        module="ray.exceptions",
        attribute="RayTaskError.as_instanceof_cause",
        advice=ray_tasks.task_error_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="a Ray task's exception surfacing at ray.get marks the caller's current span ERROR with "
        "error.type of the task's exception",
    ),
    Pointcut(
        name="ray.client_get_error",
        module="ray.util.client.worker",
        attribute="Worker.get",
        advice=ray_tasks.client_get_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="Ray client mode (ray://): a task's exception surfacing at ray.get marks the caller's current "
        "span as ray.get_error does in normal mode",
        optional=True,
    ),
    Pointcut(
        name="ray.await_error",
        module="ray._raylet",
        attribute="asyncio.wrap_future",
        advice=ray_tasks.wrap_future_advice,
        versions="any ray",
        group=groups.RAY,
        purpose="`await ref` (ObjectRef.__await__ wraps ref.future()): the awaiter's current span is marked "
        "ERROR with error.type when the task's exception surfaces there",
    ),
    _FLEET_READY,
    _FLEET_SHUTDOWN,
    _STARTUP_RUN,
    _STARTUP_SPAWN,
    _STARTUP_READY,
    _legacy(_STARTUP_RUN, "nemo_gym.cli"),
    _legacy(
        _STARTUP_SPAWN,
        "nemo_gym.cli_setup_command",
        "as startup.spawn (0.2 names the server only in the command's NEMO_GYM_CONFIG_PATH=)",
    ),
    _legacy(_STARTUP_READY, "nemo_gym.cli"),
    _legacy(_FLEET_READY, "nemo_gym.cli"),
    _legacy(_FLEET_SHUTDOWN, "nemo_gym.cli"),
    Pointcut(
        name="venvs.requirements",
        module="nemo_gym.global_config",
        attribute="GlobalConfigDictParser.parse",
        advice=venvs.head_server_deps_advice,
        versions="0.2.0+",
        group=None,
        purpose="every server venv Gym builds installs gym-autoinstr and its OpenTelemetry stack, pinned to "
        "the orchestrator's (appended to head_server_deps, orchestrator only)",
    ),
    _VENVS_REUSED,
    _legacy(_VENVS_REUSED, "nemo_gym.cli_setup_command", "as venvs.reused, where setup_command was a top-level module"),
)


# Where a Ray worker becomes a Gym orchestrator (issue 16).  Applied only in Ray workers,
# which get none of the rows above until one of these runs: the first call promotes the
# process (identity, provider: ``advice/ray_actor.py``), applies every row above, and
# re-enters the call through them.  Ray's daemons get neither table.
RAY_WORKER_POINTCUTS: tuple[Pointcut, ...] = (
    Pointcut(
        name="ray_actor.start",
        module="nemo_gym.cli.env",
        attribute="RunHelper.start",
        advice=ray_actor.promote_advice,
        versions="0.4.0+",
        group=None,
        purpose="a Ray worker that starts a Gym fleet is Gym's orchestrator (NeMo RL's NemoGym actor)",
        optional=True,
    ),
    Pointcut(
        name="ray_actor.examples",
        module="nemo_gym.rollout_collection",
        attribute="RolloutCollectionHelper.run_examples",
        advice=ray_actor.promote_advice,
        versions="0.4.0+",
        group=None,
        purpose="a Ray worker that collects rollouts with run_examples is Gym's orchestrator",
        optional=True,
    ),
    Pointcut(
        name="ray_actor.collect",
        module="nemo_gym.rollout_collection",
        attribute="RolloutCollectionHelper.run_from_config",
        advice=ray_actor.promote_advice,
        versions="0.2.0+",
        group=None,
        purpose="a Ray worker that runs a rollout collection is Gym's orchestrator",
    ),
)


@dataclass(frozen=True)
class ProcessPatch:
    """A patch outside ``POINTCUTS`` that changes something every user in the process
    shares: an attribute of another library's module, or of Gym's objects of another
    library's class.  Applied where its moment comes, through ``_footprint`` (by
    ``name``), restored by ``GymInstrumentor.uninstrument()``; a row with ``pointcut``
    is applied and restored as that pointcut row."""

    name: str
    module: str
    attribute: str  # dotted path inside the module, as for a Pointcut
    replaced_by: str  # what stands there while it is applied
    purpose: str  # why
    applied_by: str  # which module and function
    when: str  # at which moment of a Gym process
    restore: str  # how uninstrument undoes it
    scope: str = "process"  # "process": every caller in the process; "instances": Gym's objects of that class
    pointcut: str | None = None  # applied and restored as this POINTCUTS row (patching.PatchSet)
    reversible: bool = True  # uninstrument restores it (False: the row says why not)
    optional: bool = False  # the target is missing from some supported environments


_AIOHTTP_HOOK_WHEN = (
    "when Gym's set_global_aiohttp_client makes its session (egress.pool pointcut), on an aiohttp "
    "whose methods have the names and parameters the hooks expect (3.14 does), "
    "GYM_AUTOINSTR_AIOHTTP_HOOKS not 0"
)
_AIOHTTP_HOOK_RESTORE = "uninstrument deletes the instance attribute: the class's own method shows through again"

# Every process-wide patch, as data, beside the pointcut rows (``gym-autoinstr doctor``
# prints both; ``tests/test_process_patches.py`` resolves these and restores them).
PROCESS_PATCHES: tuple[ProcessPatch, ...] = (
    ProcessPatch(
        name="otlp.http.encode_spans",
        module="opentelemetry.exporter.otlp.proto.http.trace_exporter",
        attribute="encode_spans",
        replaced_by="a function that passes a batch already in wire form (fastpath.batching.EncodedBatch) "
        "through and calls the original for anything else",
        purpose="our encoding span processor hands the SDK's OTLP/HTTP span exporter spans already encoded; the "
        "exporter keeps its endpoint, headers, TLS, compression, timeout and retry",
        applied_by="fastpath/batching.py accepts_encoded (make_processor)",
        when="configuration, when the pipeline puts our encoding span processor in front of this exporter "
        "(GYM_AUTOINSTR_ENCODE_ON_END not 0)",
        restore="uninstrument puts the original back; while an encoding span processor of ours still exports "
        "through it, at that processor's shutdown",
    ),
    ProcessPatch(
        name="otlp.grpc.encode_spans",
        module="opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        attribute="encode_spans",
        replaced_by="a function that parses a batch already in wire form into an ExportTraceServiceRequest and "
        "calls the original for anything else",
        purpose="as otlp.http.encode_spans, for the SDK's OTLP/gRPC span exporter",
        applied_by="fastpath/batching.py accepts_encoded (make_processor)",
        when="configuration, when the pipeline puts our encoding span processor in front of this exporter "
        "(GYM_AUTOINSTR_ENCODE_ON_END not 0)",
        restore="as otlp.http.encode_spans",
        optional=True,  # the gRPC exporter is an optional install
    ),
    ProcessPatch(
        name="aiohttp.session_request",
        module="aiohttp",
        attribute="ClientSession._request",
        replaced_by="an instance attribute on Gym's one client session: the session's own _request, counting "
        "retries (gym.http.retry_total) and timeouts (gym.http.timeout_total) of its attempts",
        purpose="retry and timeout metrics at about 1 us a request, where aiohttp's TraceConfig costs about 15",
        applied_by="advice/pool.py attach (egress.pool advice)",
        when=_AIOHTTP_HOOK_WHEN,
        restore=_AIOHTTP_HOOK_RESTORE,
        scope="instances",
        optional=True,
    ),
    ProcessPatch(
        name="aiohttp.connector_wait",
        module="aiohttp",
        attribute="BaseConnector._wait_for_available_connection",
        replaced_by="an instance attribute on the connector of Gym's session: its own method, timing the wait "
        "(gym.http.connection_pool.queue_duration_ms)",
        purpose="connection-pool waits by destination server, one record per acquisition that waited",
        applied_by="advice/pool.py attach (egress.pool advice)",
        when=_AIOHTTP_HOOK_WHEN,
        restore=_AIOHTTP_HOOK_RESTORE,
        scope="instances",
        optional=True,
    ),
    ProcessPatch(
        name="aiohttp.connector_create",
        module="aiohttp",
        attribute="BaseConnector._create_connection",
        replaced_by="an instance attribute on the connector of Gym's session: its own method, counting the "
        "connections it opens (gym.http.connection_pool.connect_total)",
        purpose="new connections by destination server",
        applied_by="advice/pool.py attach (egress.pool advice)",
        when=_AIOHTTP_HOOK_WHEN,
        restore=_AIOHTTP_HOOK_RESTORE,
        scope="instances",
        optional=True,
    ),
    ProcessPatch(
        name="aiohttp.trace_config",
        module="aiohttp",
        attribute="ClientSession._trace_configs",
        replaced_by="our frozen TraceConfig, appended to the list of Gym's session",
        purpose="the same pool, connection, retry and timeout metrics where the hooks cannot go",
        applied_by="advice/pool.py attach (egress.pool advice)",
        when="when Gym's set_global_aiohttp_client makes its session, on an aiohttp the hooks do not fit, or "
        "GYM_AUTOINSTR_AIOHTTP_HOOKS=0",
        restore="uninstrument removes it from the session's list",
        scope="instances",
    ),
    ProcessPatch(
        name="aiohttp.session_attempts",
        module="aiohttp",
        attribute="ClientSession.request",
        replaced_by="an instance attribute on Gym's one client session: its own request, adding one to the "
        "attempt count of the traced request's CLIENT span",
        purpose="http.request.resend_count on the CLIENT span around Gym's retries",
        applied_by="advice/pool.py count_attempts (egress.pool advice)",
        when="when Gym's set_global_aiohttp_client makes its session (egress.pool pointcut)",
        restore=_AIOHTTP_HOOK_RESTORE,
        scope="instances",
    ),
    ProcessPatch(
        name="asyncio.semaphore_class",
        module="asyncio",
        attribute="Semaphore",
        replaced_by="the __class__ of each asyncio semaphore found on a Gym server about to serve: a subclass of "
        "its own class whose acquire times only acquisitions that wait",
        purpose="gym.concurrency.queue_wait_duration_ms without a cost on a free acquisition",
        applied_by="advice/concurrency.py watch_server (ingress.limits advice), then each metrics collection",
        when="first server start: in each process that serves, from the moment it is about to serve; "
        "semaphores the server makes later, at the next collection",
        restore="uninstrument gives every observed semaphore still alive its own class back and stops looking at "
        "the servers (semaphores are held weakly: one already gone needs nothing)",
        scope="instances",
    ),
    ProcessPatch(
        name="asyncio.wrap_future",
        module="asyncio",
        attribute="wrap_future",
        replaced_by="a wrapt wrapper (the target of ray.await_error is ray._raylet's asyncio: the asyncio module "
        "itself, so every caller in the process goes through it)",
        purpose="`await ref` of a failed Ray task marks the awaiter's current span ERROR",
        applied_by="patching.PatchSet, as the pointcut row ray.await_error",
        when="instrumentation, once ray._raylet is imported",
        restore="uninstrument removes it with the pointcut rows",
        pointcut="ray.await_error",
    ),
    ProcessPatch(
        name="ray.task_function",
        module="ray.remote_function",
        attribute="RemoteFunction._function",
        replaced_by="the carrier wrapper, on each RemoteFunction whose task a Gym process submits",
        purpose="the trace context rides to the worker in one keyword argument",
        applied_by="advice/ray_tasks.py (ray.task advice), at the task's first submission",
        when="instrumentation: a Gym process's first submission of each task",
        restore="not restored: Ray has pickled the wrapper for its workers already; once uninstrumented no "
        "carrier is sent, and without one the wrapper calls the task's function as it is",
        scope="instances",
        pointcut="ray.task",
        reversible=False,
    ),
    ProcessPatch(
        name="ray.actor_methods",
        module="ray.actor",
        attribute="_modify_class",
        replaced_by="the carrier wrapper, on the methods and __init__ of the subclass Ray makes of an actor class "
        "a Gym process creates (never the user's class)",
        purpose="an actor's methods and creation take the trace context and exporter settings",
        applied_by="advice/ray_tasks.py modify_class_advice and advice/ray_actor.py install_init (ray.actor advice)",
        when="instrumentation: when Ray makes the actor class",
        restore="not restored, as ray.task_function: inert without a carrier",
        scope="instances",
        pointcut="ray.actor",
        reversible=False,
    ),
)


_RELEASE = re.compile(r"\d+(?:\.(?:\d+|x)){0,2}")


def _release(text: str, *, bound: str) -> tuple[int, int, int]:
    """``"0.6.x"`` -> ``(0, 6, 0)`` as a lower bound, ``(0, 6, inf)`` as an upper one."""
    parts = text.split(".")
    if not _RELEASE.fullmatch(text) or "x" in parts[:-1] and parts[-1] != "x":
        raise ValueError(f"not a release: {text!r}")
    wildcard = 10**9 if bound == "upper" else 0
    numbers = [wildcard if part == "x" else int(part) for part in parts]
    numbers += [wildcard if bound == "upper" and "x" in parts else 0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def gym_release(gym_version: str) -> tuple[int, int, int]:
    """The release a nemo-gym version string belongs to (``"0.7.0rc1+g1"`` -> ``(0, 7, 0)``)."""
    found = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", gym_version)
    if not found:
        raise ValueError(f"not a nemo-gym version: {gym_version!r}")
    return tuple(int(part or 0) for part in found.groups())  # type: ignore[return-value]


def version_applies(versions: str, gym_version: str) -> bool:
    """Whether a pointcut's ``versions`` covers ``gym_version``; ``ValueError`` if malformed."""
    release = gym_release(gym_version)
    ranges = [item.strip() for item in versions.split(",")]
    if not any(ranges):
        raise ValueError(f"empty versions: {versions!r}")
    for item in ranges:
        if item.startswith("any "):
            if not item[4:].strip():
                raise ValueError(f"'any' names no library: {versions!r}")
            return True
        if item.endswith("+"):
            low, high = _release(item[:-1], bound="lower"), None
        elif "-" in item:
            first, _, last = item.partition("-")
            low, high = _release(first.strip(), bound="lower"), _release(last.strip(), bound="upper")
        else:
            low, high = _release(item, bound="lower"), _release(item, bound="upper")
        if low <= release and (high is None or release <= high):
            return True
    return False
