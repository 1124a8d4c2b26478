"""Every place gym-autoinstr touches, as data.

Reading this table tells the whole footprint of the instrumentor: which module and
attribute, the advice applied, the Gym versions it exists in, and the span group it
serves.  ``instrumentor.py`` applies it through post-import hooks; ``gym-autoinstr
doctor`` prints it against the installed Gym.

Advice functions have wrapt's wrapper signature ``(wrapped, instance, args, kwargs)``.

``versions`` is machine-checked (``version_applies``; the version-matrix test resolves
every Gym pointcut against every release).  It is a comma-separated list of ranges of
nemo-gym releases, any of which may match:

* ``0.4.0+``: that release and every later one;
* ``0.5.0-0.6.x``: from the first to the second, both included; ``x`` matches any
  number, so ``0.6.x`` ends before 0.7.0;
* ``0.5.1`` or ``0.5.x``: that release, or that release line;
* ``any <library>`` (``any uvicorn``): the target lives in another library, not in
  Gym, so every Gym version applies.

Pre-releases and local versions count as their release (``0.7.0rc1`` is ``0.7.0``).
``optional`` says the target is missing from some supported releases (those outside
``versions``); a pointcut that is not optional must resolve on every release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from gym_autoinstr.advice import coexistence, egress, fleet, ingress, job, ray_actor, ray_tasks, routes, sandbox, startup, venvs
from gym_autoinstr.telemetry import groups


@dataclass(frozen=True)
class Pointcut:
    name: str
    module: str
    attribute: str  # dotted path inside the module: "request", "SimpleServer.run_webserver"
    advice: Callable[[Any, Any, tuple, dict], Any]
    versions: str  # the nemo-gym releases where the target exists
    group: "str | None"  # the span group its spans belong to (None: plumbing)
    purpose: str
    rebind_copies: bool = False  # modules copy it by name (`from m import f`)
    optional: bool = False  # absent in some supported Gym versions: not a warning
    # Parameters the advice relies on; a target whose signature lacks them has drifted
    # away from what the advice understands, and is skipped with a warning.
    parameters: tuple[str, ...] = ()


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
        "dispatches become root traces linked to it (egress), or nest (GYM_AUTOINSTR_JOB_TRACE=single, an embedder's span)",
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
        name="sandbox.start",
        module="nemo_gym.sandbox.api",
        attribute="AsyncSandbox.start",
        advice=sandbox.start_advice,
        versions="0.4.0+",
        group=groups.SANDBOX,
        purpose="gym.sandbox.start with provider and sandbox id",
        optional=True,
    ),
    Pointcut(
        name="sandbox.exec",
        module="nemo_gym.sandbox.api",
        attribute="AsyncSandbox.exec",
        advice=sandbox.exec_advice,
        versions="0.4.0+",
        group=groups.SANDBOX,
        purpose="gym.sandbox.exec with return code and error type, never the command, cwd, env or output",
        optional=True,
    ),
    Pointcut(
        name="sandbox.stop",
        module="nemo_gym.sandbox.api",
        attribute="AsyncSandbox.stop",
        advice=sandbox.stop_advice,
        versions="0.4.0+",
        group=groups.SANDBOX,
        purpose="gym.sandbox.stop of a running sandbox",
        optional=True,
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
    Pointcut(
        name="fleet.ready",
        module="nemo_gym.cli.env",
        attribute="RunHelper.wait_for_spinup",
        advice=fleet.servers_ready_advice,
        versions="0.4.0+",
        group=None,
        purpose="gym.servers.active = N once every server is ready (orchestrator)",
        optional=True,
    ),
    Pointcut(
        name="fleet.shutdown",
        module="nemo_gym.cli.env",
        attribute="RunHelper.shutdown",
        advice=fleet.fleet_shutdown_advice,
        versions="0.4.0+",
        group=None,
        purpose="gym.servers.active = 0 after Gym's shutdown, then flush (orchestrator)",
        optional=True,
    ),
    Pointcut(
        name="startup.run",
        module="nemo_gym.cli.env",
        attribute="RunHelper.start",
        advice=startup.run_start_advice,
        versions="0.4.0+",
        group=groups.STARTUP,
        purpose="gym.startup from the start of `gym env start` until every server is ready (fleet.ready ends it)",
        optional=True,
    ),
    Pointcut(
        name="startup.spawn",
        module="nemo_gym.cli.setup_command",
        attribute="run_command",
        advice=startup.run_command_advice,
        versions="0.4.0+",
        group=groups.STARTUP,
        purpose="gym.startup.server per spawned server; its context and spawn time go to the child's environment",
        rebind_copies=True,
        optional=True,
    ),
    Pointcut(
        name="startup.ready",
        module="nemo_gym.cli.env",
        attribute="RunHelper.check_http_server_statuses",
        advice=startup.statuses_advice,
        versions="0.4.0+",
        group=groups.STARTUP,
        purpose="a server's gym.startup.server ends at its first good health poll",
        optional=True,
    ),
    Pointcut(
        name="startup.run.legacy",
        module="nemo_gym.cli",
        attribute="RunHelper.start",
        advice=startup.run_start_advice,
        versions="0.2.0-0.3.x",
        group=groups.STARTUP,
        purpose="as startup.run, where the CLI was one module",
        optional=True,
    ),
    Pointcut(
        name="startup.spawn.legacy",
        module="nemo_gym.cli_setup_command",
        attribute="run_command",
        advice=startup.run_command_advice,
        versions="0.2.0-0.3.x",
        group=groups.STARTUP,
        purpose="as startup.spawn (0.2 names the server only in the command's NEMO_GYM_CONFIG_PATH=)",
        rebind_copies=True,
        optional=True,
    ),
    Pointcut(
        name="startup.ready.legacy",
        module="nemo_gym.cli",
        attribute="RunHelper.check_http_server_statuses",
        advice=startup.statuses_advice,
        versions="0.2.0-0.3.x",
        group=groups.STARTUP,
        purpose="as startup.ready, where the CLI was one module",
        optional=True,
    ),
    Pointcut(
        name="fleet.ready.legacy",
        module="nemo_gym.cli",
        attribute="RunHelper.wait_for_spinup",
        advice=fleet.servers_ready_advice,
        versions="0.2.0-0.3.x",
        group=None,
        purpose="as fleet.ready, where the CLI was one module",
        optional=True,
    ),
    Pointcut(
        name="fleet.shutdown.legacy",
        module="nemo_gym.cli",
        attribute="RunHelper.shutdown",
        advice=fleet.fleet_shutdown_advice,
        versions="0.2.0-0.3.x",
        group=None,
        purpose="as fleet.shutdown, where the CLI was one module",
        optional=True,
    ),
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
    Pointcut(
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
    ),
    Pointcut(
        name="venvs.reused.legacy",
        module="nemo_gym.cli_setup_command",
        attribute="setup_env_command",
        advice=venvs.setup_env_command_advice,
        versions="0.2.0-0.3.x",
        group=None,
        purpose="as venvs.reused, where setup_command was a top-level module",
        rebind_copies=True,
        optional=True,
    ),
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
