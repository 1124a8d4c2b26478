"""Who this process is in a Gym fleet, and the resource that says so.

Every Python process started under ``opentelemetry-instrument`` runs our start-up code,
Ray's daemons and the server venvs' children included.  Gym names its servers by the
top-level config key, which every spawned server finds in ``NEMO_GYM_CONFIG_PATH`` from
interpreter start, so identity is known before any Gym module is imported.
"""

from __future__ import annotations

import enum
import os
import sys
import uuid
from dataclasses import dataclass

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings

# What the orchestrator sets so that every process it starts shares one run id.
RUN_ID_VARIABLE = settings.RUN_ID.name
DEFAULT_SERVICE_NAMESPACE = "nemo-gym"

ORCHESTRATOR_COMMANDS = frozenset({"gym", "ng"})
ORCHESTRATOR_PREFIXES = ("ng_", "nemo_gym_")


class Role(str, enum.Enum):
    """A process's role in the fleet; its value is ``nemo.gym.process.role``."""

    SERVER = "server"  # a Gym server (it finds NEMO_GYM_CONFIG_PATH)
    ORCHESTRATOR = "orchestrator"  # `gym`/`ng_*`, or a Ray actor running Gym's orchestration
    RAY = "ray"  # any Ray process at start-up: silent
    RAY_WORKER = "ray_worker"  # a Ray worker running a Gym process's tasks
    PROCESS = "process"  # any other Python process

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProcessIdentity:
    role: Role
    # the Gym server name, "orchestrator", or the program's name; for a ray_worker, the
    # Gym server whose tasks it runs
    name: str

    def __post_init__(self) -> None:
        if type(self.role) is not Role:  # a role given by its value
            object.__setattr__(self, "role", Role(self.role))

    @property
    def is_gym(self) -> bool:
        return self.role in (Role.SERVER, Role.ORCHESTRATOR)


def _command_line() -> list[str]:
    return list(getattr(sys, "orig_argv", None) or sys.argv)


def _is_ray_process(argv: list[str]) -> bool:
    # Ray's daemons and workers run scripts from inside the ray package
    # (.../site-packages/ray/_private/workers/default_worker.py, dashboard.py, ...),
    # or `python -m ray...`.
    for i, arg in enumerate(argv[:4]):
        normalized = arg.replace("\\", "/")
        if "/site-packages/ray/" in normalized or "/dist-packages/ray/" in normalized:
            return True
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1].split(".")[0] == "ray":
            return True
    return False


RAY_WORKER_SCRIPT = "/ray/_private/workers/default_worker.py"


def is_ray_worker(argv: list[str] | None = None) -> bool:
    """A Ray worker process (it runs tasks and actors), as opposed to Ray's daemons (GCS,
    raylet, dashboard and its agents, log monitor), which run other scripts."""
    argv = _command_line() if argv is None else argv
    return any(arg.replace("\\", "/").endswith(RAY_WORKER_SCRIPT) for arg in argv[:4])


def ray_worker(server_name: str) -> ProcessIdentity:
    """The identity a Ray worker takes on when it runs the first task a Gym process
    submitted with our context: it does that server's work."""
    return ProcessIdentity(Role.RAY_WORKER, server_name or "unknown")


def _program_name(argv: list[str]) -> str:
    script = sys.argv[0] if sys.argv else ""
    if script in ("", "-c"):
        return "python"
    if script == "-m":
        # orig_argv: [python, -m, module, ...]
        try:
            return argv[argv.index("-m") + 1]
        except (ValueError, IndexError):
            return "python"
    base = os.path.basename(script)
    return base[:-3] if base.endswith(".py") else base


def detect(environ: dict[str, str] | os._Environ[str] | None = None) -> ProcessIdentity:
    environ = os.environ if environ is None else environ
    argv = _command_line()
    if _is_ray_process(argv):
        return ProcessIdentity(Role.RAY, "ray")
    server_name = settings.GYM_CONFIG_PATH.raw(environ)
    if server_name:
        return ProcessIdentity(Role.SERVER, server_name)
    program = _program_name(argv)
    if program in ORCHESTRATOR_COMMANDS or program.startswith(ORCHESTRATOR_PREFIXES):
        return ProcessIdentity(Role.ORCHESTRATOR, "orchestrator")
    return ProcessIdentity(Role.PROCESS, program)


def run_id(environ: dict[str, str] | os._Environ[str] | None = None, *, mint: bool = False) -> str | None:
    """The fleet's run id: explicit settings first, then one the orchestrator minted.

    With ``mint`` (the orchestrator), a new id is created when none is set and exported
    in the environment so that every process Gym spawns inherits it.
    """
    environ = os.environ if environ is None else environ
    for setting in (settings.GYM_RUN_ID, settings.SLURM_JOB_ID, settings.RUN_ID):
        value = setting.raw(environ)
        if value:
            return value
    if mint:
        value = uuid.uuid4().hex[:16]
        environ[RUN_ID_VARIABLE] = value
        return value
    return None


def service_name(identity: ProcessIdentity, environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    base = settings.SERVICE_NAME.raw(environ) or DEFAULT_SERVICE_NAMESPACE
    if not settings.SERVICE_NAME_SUFFIX.read(environ):
        return f"{base}/ray" if identity.role is Role.RAY_WORKER else base
    if identity.role is Role.RAY_WORKER:
        return f"{base}/{identity.name}/ray"
    return f"{base}/{identity.name}"


def gym_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nemo-gym")
    except Exception:
        return None


def resource_attributes(
    identity: ProcessIdentity, environ: dict[str, str] | os._Environ[str] | None = None
) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    attributes = {
        attr.SERVICE_NAME: service_name(identity, environ),
        "service.instance.id": uuid.uuid4().hex,
        attr.PROCESS_ROLE: identity.role.value,
        # Which venv this process reports from (Gym gives each server its own).
        "process.executable.path": sys.executable,
    }
    if identity.role is Role.SERVER:
        attributes[attr.SERVER_NAME] = identity.name
        attributes[attr.SERVICE_GROUP] = _unsuffixed(identity.name)
        server_type = _server_type_from_directory()
        if server_type:
            attributes[attr.SERVER_TYPE] = server_type
    elif identity.role is Role.ORCHESTRATOR:
        attributes[attr.SERVER_NAME] = "orchestrator"
        attributes[attr.SERVER_TYPE] = "orchestrator"
    elif identity.role is Role.RAY_WORKER:
        # Whose work it does, and where: the Ray node id is added by the configurator.
        attributes[attr.SERVER_NAME] = identity.name
        attributes[attr.SERVICE_GROUP] = _unsuffixed(identity.name)
        attributes[attr.HOST_NAME] = _host_name()
        attributes[attr.PROCESS_PID] = os.getpid()  # type: ignore[assignment]
    shard = settings.SHARD.raw(environ)
    if shard:
        attributes[attr.SHARD] = shard
    rid = run_id(environ, mint=identity.role is Role.ORCHESTRATOR)
    if rid:
        attributes[attr.RUN_ID] = rid
    version = gym_version()
    if version:
        attributes[attr.GYM_VERSION] = version
    attributes.update(slurm_attributes(environ))
    return attributes


# Where a process of a Slurm job runs.  OpenTelemetry has no semantic convention for Slurm:
# ``slurm.*`` are ours, named after Slurm's own terms; the node is ``host.name``.
_SLURM = (
    (settings.SLURM_JOB_ID, "slurm.job.id"),
    (settings.SLURM_STEP_ID, "slurm.step.id"),
    (settings.SLURM_JOB_NAME, "slurm.job.name"),
    (settings.SLURM_ARRAY_JOB_ID, "slurm.array.job.id"),
    (settings.SLURM_ARRAY_TASK_ID, "slurm.array.task.id"),
    (settings.SLURM_CLUSTER_NAME, "slurm.cluster.name"),
    (settings.SLURM_JOB_PARTITION, "slurm.partition"),
)


def slurm_attributes(environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """The Slurm job, step, array index and node of a process in a Slurm job; none outside."""
    environ = os.environ if environ is None else environ
    if not settings.SLURM_JOB_ID.raw(environ):
        return {}
    attributes = {key: value for setting, key in _SLURM if (value := setting.raw(environ))}
    attributes[attr.HOST_NAME] = settings.SLURMD_NODENAME.raw(environ) or _host_name()
    return attributes


def _host_name() -> str:
    import socket

    try:
        return socket.gethostname()
    except OSError:
        return "unknown"


SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


def _server_type_from_directory() -> str | None:
    # Gym starts every server from its own directory, <type>/<implementation>/.
    try:
        parent = os.path.basename(os.path.dirname(os.getcwd()))
    except OSError:
        return None
    return parent if parent in SERVER_TYPES else None


def _unsuffixed(name: str) -> str:
    # Gym suffixes replicated server names with a number ("math_0", "math-1"); the
    # service group is the name without it.
    stem, sep, tail = name.rpartition("_")
    if not sep:
        stem, sep, tail = name.rpartition("-")
    return stem if sep and tail.isdigit() and stem else name


# --- Gym's orchestration inside a Ray actor (issue 16) ----------------------------------
#
# A Ray worker that starts a Gym fleet or collects rollouts (NeMo RL's ``NemoGym`` actor)
# is Gym's orchestrator.  Its shard (the actor's name, else its id) is exported in the
# environment, so every server the actor spawns says which shard it belongs to.
SHARD_VARIABLE = settings.SHARD.name


def ray_orchestrator() -> ProcessIdentity:
    """The identity a Ray worker takes on when it runs Gym's orchestration."""
    return ProcessIdentity(Role.ORCHESTRATOR, "orchestrator")
