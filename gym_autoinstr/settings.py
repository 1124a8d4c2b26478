"""Every environment variable gym-autoinstr reads, declared once: name, kind, default, meaning.

Each setting is parsed one way, here: ``settings.LEAN_SPANS.read()`` (or ``.read(environ)``
with a mapping of one's own) returns a typed value.  A value that does not parse falls
back to the default with one warning (``warn_once``) that names the variable, the bad
value and the fix; Gym keeps running.  ``check`` gives the same verdict without logging,
for ``gym-autoinstr doctor``.

When a setting is read is the caller's business and stays where it was: at import, once
per process, or at call time.  Nothing here caches.

``ALL`` maps every name to its declaration (the doctor flags a ``GYM_AUTOINSTR_*`` name
that is not in it).  The ``OTEL_*`` variables are OpenTelemetry's; they are declared here
as we read them, parsed as the SDK parses them.  Writes (a distro default, a value handed
to child processes) stay with their writers, through ``Setting.name``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gym_autoinstr._log import warn_once

PREFIX = "GYM_AUTOINSTR_"

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


class Setting:
    """One declared variable; its kind (a subclass) says how its text parses.

    ``raw``: the text as set (None when unset); ``read``: the typed value, the default when
    unset or blank, or when bad (with one warning); ``check``: the same without logging."""

    kind = ""

    def __init__(self, name: str, default: Any, description: str, *, fallback: str = "", fix: str = "") -> None:
        self.name = name
        self.default = default
        self.description = description
        self.fallback = fallback  # what happens with a bad value ("it stays on")
        self.fix = fix  # what to set instead
        ALL[name] = self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} default={self.default!r}>"

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value as set, or None when unset."""
        return (os.environ if environ is None else environ).get(self.name)

    def parse(self, raw: str) -> Any:
        """The typed value of a set ``raw``; ValueError(what was expected) when it does not parse."""
        return raw

    def check(self, environ: Mapping[str, str] | None = None) -> tuple[Any, str | None]:
        """(value, message): the value ``read`` would return, and why a set value was not
        taken (None when it was, or when unset)."""
        raw = self.raw(environ)
        if raw is None or not raw.strip():
            return self.empty(raw), None
        try:
            return self.parse(raw), None
        except ValueError as error:
            return self.default, self.message(raw, str(error), self.holder(environ))

    def empty(self, raw: str | None) -> Any:
        """The value when unset (None) or set to blanks."""
        return self.default

    def holder(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable the value comes from."""
        return self.name

    def message(self, raw: str, expected: str, holder: str | None = None) -> str:
        fallback = self.fallback or f"using {self.default!r}"
        text = f"{holder or self.name}={raw!r} is not {expected}; {fallback}."
        return f"{text} {self.fix}" if self.fix else text

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        value, message = self.check(environ)
        if message is not None:
            warn_once(f"setting:{self.name}:{self.raw(environ)}", "%s", message)
        return value


class Text(Setting):
    """Free text, as set (``read``: blanks count as unset); callers that must tell unset
    from empty use ``raw``."""

    kind = "string"


class Switch(Setting):
    """On/off: 1, true, yes, on or 0, false, no, off (any case, blanks around); unset or
    empty keeps the default; anything else keeps it too, with a warning."""

    kind = "switch"

    def __init__(self, name: str, default: bool, description: str) -> None:
        if default:
            fallback, fix = "it stays on", "Set it to 'false' (or 0, no, off) to turn it off, 'true' to keep it on."
        else:
            fallback, fix = "it stays off", "Set it to 'true' (or 1, yes, on) to turn it on, 'false' to keep it off."
        super().__init__(name, default, description, fallback=fallback, fix=fix)

    def parse(self, raw: str) -> bool:
        value = raw.strip().lower()
        if value in ON:
            return True
        if value in OFF:
            return False
        raise ValueError("an on/off value")


class OtelFlag(Setting):
    """OpenTelemetry's boolean: true only when the value is ``true`` (any case); as the SDK
    reads it, so no value is ever bad."""

    kind = "otel boolean"

    def __init__(self, name: str, description: str) -> None:
        super().__init__(name, False, description)

    def parse(self, raw: str) -> bool:
        return raw.strip().lower() == "true"


class Number(Setting):
    """A number within [minimum, maximum] (``above``: strictly greater than ``minimum``);
    ``integer`` truncates it (``int(float(raw))``, as the SDK's batch settings do)."""

    kind = "number"

    def __init__(
        self,
        name: str,
        default: float,
        description: str,
        *,
        minimum: float = 0,
        above: bool = False,
        maximum: float | None = None,
        integer: bool = False,
        expected: str = "",
        fallback: str = "",
        fix: str = "",
    ) -> None:
        self.minimum, self.above, self.maximum, self.integer = minimum, above, maximum, integer
        self.expected = expected or ("a positive number" if above else "a non-negative number")
        fix = fix or f"Set it to e.g. {default} (or unset it)."
        super().__init__(name, default, description, fallback=fallback or f"using {default}", fix=fix)

    def parse(self, raw: str) -> float:
        try:
            value = float(raw)
            if self.integer:
                value = int(value)
        except (ValueError, OverflowError):
            raise ValueError(self.expected) from None
        if value != value or (value <= self.minimum if self.above else value < self.minimum):
            raise ValueError(self.expected)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(self.expected)
        return value


class Choice(Setting):
    """One of ``choices`` (any case, blanks around); ``aliases`` map other spellings to one.
    ``inherits``: when this one is unset, the more general setting's value is read."""

    kind = "choice"

    def __init__(
        self,
        name: str,
        default: str,
        choices: tuple[str, ...],
        description: str,
        *,
        aliases: Mapping[str, str] | None = None,
        inherits: Setting | None = None,
        fallback: str = "",
        fix: str = "",
    ) -> None:
        self.choices, self.aliases, self.inherits = choices, dict(aliases or {}), inherits
        fix = fix or f"Set it to {' or '.join(choices)} (or unset it)."
        super().__init__(name, default, description, fallback=fallback, fix=fix)

    def holder(self, environ: Mapping[str, str] | None = None) -> str:
        if self.inherits is not None and not super().raw(environ):
            return self.inherits.name
        return self.name

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        own = super().raw(environ)
        if self.inherits is not None and not own:
            return self.inherits.raw(environ)
        return own

    def parse(self, raw: str) -> str:
        value = raw.strip().lower()
        value = self.aliases.get(value, value)
        if value in self.choices:
            return value
        raise ValueError("one of " + ", ".join(self.choices))


class CommaList(Setting):
    """Comma-separated names, blanks dropped; unset gives the default, set but empty gives ().
    ``starts_with``: what each name must start with (a name without it does not parse)."""

    kind = "comma list"

    def __init__(
        self, name: str, default: tuple[str, ...], description: str, *, starts_with: str = "", example: str = ""
    ) -> None:
        self.starts_with = starts_with
        fallback = f"using the default, {','.join(default)}"
        fix = f"Set names that start with {starts_with!r}, e.g. {example}." if starts_with else ""
        super().__init__(name, default, description, fallback=fallback, fix=fix)

    def empty(self, raw: str | None) -> Any:
        return self.default if raw is None else ()

    def parse(self, raw: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in raw.split(",") if part.strip())
        bad = [name for name in names if not name.startswith(self.starts_with)]
        if bad:
            offenders = ", ".join(map(repr, bad))
            raise ValueError(f"a list of names that each start with {self.starts_with!r} (not: {offenders})")
        return names


ALL: dict[str, Setting] = {}

# -- gym-autoinstr's own ----------------------------------------------------------------

SPAN_GROUPS = Text(
    PREFIX + "SPAN_GROUPS",
    None,
    "span groups to record: names and presets, comma-separated (default, all, off, ...); "
    "a spec with an unknown name: the default preset, with a warning (parsed in telemetry/groups.py)",
)
JOB_TRACE = Choice(
    PREFIX + "JOB_TRACE",
    "per_rollout",
    ("per_rollout", "single"),
    "per_rollout: each rollout its own trace, linked to gym.job; single: one trace per job",
    fallback="using per_rollout (each rollout its own trace, linked to gym.job)",
    fix=f"Set {PREFIX}JOB_TRACE=single for one trace per job.",
)
SAMPLING_UNIT = Choice(
    PREFIX + "SAMPLING_UNIT",
    "rollout",
    ("rollout", "task"),
    "what a ratio sampler keeps or drops whole: each rollout (its trace id), or each task of a collection job "
    "(every repeat of a sampled task kept: GRPO-style groups side by side)",
    fallback="each rollout is sampled on its own ('rollout')",
    fix=f"Set {PREFIX}SAMPLING_UNIT=task to keep or drop every repeat of a task together.",
)
TRACE_TAGS = Choice(
    PREFIX + "TRACE_TAGS",
    "none",
    ("none", "mlflow"),
    "none; mlflow: a rollout's root also carries its reward, task and repeat index (and failure kind) as "
    "mlflow.traceTag.* attributes (MLflow's trace tags) and as mlflow.spanInputs/spanOutputs (its trace "
    "list's Input and Output columns)",
    fallback="no backend's tags ('none')",
    fix=f"Set {PREFIX}TRACE_TAGS=mlflow when the traces go to MLflow.",
)
CLIENT_SPANS = Choice(
    PREFIX + "CLIENT_SPANS",
    "all",
    ("all", "failures"),
    "all: a CLIENT span per call between Gym servers; failures: only for calls that fail",
    fallback="every call keeps its CLIENT span ('all')",
    fix="Set 'failures' for CLIENT spans only on calls between Gym servers that fail.",
)
EXCLUDED_PATHS = CommaList(
    PREFIX + "EXCLUDED_PATHS",
    ("/", "/health", "/healthz", "/livez", "/readyz", "/metrics", "/favicon.ico"),
    "request paths that get no SERVER span, comma-separated (empty: none excluded)",
    starts_with="/",
    example="/health,/metrics",
)
ACCEPT_BAGGAGE = Switch(PREFIX + "ACCEPT_BAGGAGE", False, "read W3C baggage sent from outside the fleet")
SERVICE_NAME_SUFFIX = Switch(
    PREFIX + "SERVICE_NAME_SUFFIX",
    True,
    "service.name is <OTEL_SERVICE_NAME>/<server name>; off: OTEL_SERVICE_NAME alone",
)
FAST_PATH = Switch(
    PREFIX + "FAST_PATH",
    True,
    "the fast parts that replace SDK machinery (off: the stock SDK everywhere; see fastpath/contract.py)",
)
LEAN_SPANS = Switch(PREFIX + "LEAN_SPANS", True, "lean spans behind our own pipeline (off: the SDK's spans)")
ENCODE_ON_END = Switch(
    PREFIX + "ENCODE_ON_END", True, "encode a span to OTLP bytes when it ends (off: the SDK's batch processor)"
)
FAST_HISTOGRAMS = Switch(PREFIX + "FAST_HISTOGRAMS", True, "request histograms aggregated by us (off: the SDK's)")
DROPPED_FAST_PATH = Switch(PREFIX + "DROPPED_FAST_PATH", True, "skip building spans the sampler would drop anyway")
AIOHTTP_HOOKS = Switch(
    PREFIX + "AIOHTTP_HOOKS", True, "connection-pool metrics from hooks on Gym's client (off: aiohttp's TraceConfig)"
)
GC_FREEZE = Switch(PREFIX + "GC_FREEZE", True, "freeze OpenTelemetry's start-up objects out of the garbage collector")
LOG_CORRELATION = Switch(PREFIX + "LOG_CORRELATION", True, "add trace and span ids to log lines when logs are exported")
FLEET_MEMORY = Switch(PREFIX + "FLEET_MEMORY", False, "the orchestrator observes each spawned server's memory")
FLUSH_TIMEOUT_MS = Number(
    PREFIX + "FLUSH_TIMEOUT_MS",
    500,
    "how long a flush at shutdown waits, in ms",
    expected="a non-negative number of milliseconds",
    fix="Set it to e.g. 500.",
)
LOOP_LAG_INTERVAL_MS = Number(
    PREFIX + "LOOP_LAG_INTERVAL_MS",
    1000,
    "how often the event-loop lag probe wakes, in ms",
    minimum=1,
    maximum=3_600_000,
    expected="a number of milliseconds from 1 to 3600000",
    fallback="the event-loop lag probe wakes every 1000 ms",
)
SEGMENT_MB = Number(
    PREFIX + "SEGMENT_MB",
    16,
    "size at which the run directory's open file of a process is closed and gzipped, in MB",
    above=True,
    expected="a positive number of megabytes",
    fallback="using 16",
)
RUN_MAX_GB = Number(
    PREFIX + "RUN_MAX_GB",
    20,
    "disk budget of one run directory (every process's files together), in GB; past it spans are dropped, counted",
    above=True,
    expected="a positive number of gigabytes",
    fallback="using 20",
)
OUTPUT_DIR = Text(
    PREFIX + "OUTPUT_DIR",
    None,
    "directory of the embedded file exporter (default "
    "./gym-autoinstr-runs/<run id>); set by the orchestrator for its children",
)
CACHE_DIR = Text(
    PREFIX + "CACHE_DIR",
    None,
    "where view, compare and export keep what they read of runs (default $XDG_CACHE_HOME/gym-autoinstr, "
    "else ~/.cache/gym-autoinstr); read by those commands, not by Gym's processes",
)
RUN_ID = Text(PREFIX + "RUN_ID", None, "this run's id (nemo.gym.run.id); minted by the orchestrator for its children")
SHARD = Text(PREFIX + "SHARD", None, "the shard (NeMo RL actor) a server belongs to; set for its children")
SERVER_REQUIREMENT = Text(
    PREFIX + "SERVER_REQUIREMENT",
    None,
    "what to install into Gym's server venvs instead of this machine's gym-autoinstr (one requirement, or -e PATH)",
)
STARTUP_TRACEPARENT = Text(PREFIX + "STARTUP_TRACEPARENT", None, "internal: a spawned server's start-up span context")
SPAWN_NS = Text(PREFIX + "SPAWN_NS", None, "internal: when the orchestrator spawned this server (time.time_ns)")
SUBMIT_TRACEPARENT = Text(
    PREFIX + "SUBMIT_TRACEPARENT", None, "internal: the gym.submit span a Slurm job's gym.job links to"
)
DISTRO_DEFAULTS = Text(
    PREFIX + "DISTRO_DEFAULTS",
    None,
    "internal: the OTEL_* variables whose value is our distro's default, not the user's (set for children too)",
)
UNKNOWN_SAID = Text(
    PREFIX + "UNKNOWN_SAID",
    None,
    "internal: the unknown GYM_AUTOINSTR_* names a parent process warned about (its children do not repeat it)",
)

# -- NeMo Gym's (and the cluster's) -----------------------------------------------------

GYM_SPAN_GROUPS = Text(
    "NEMO_GYM_OTEL_SPAN_GROUPS", None, f"Gym's own span-group knob, read when {PREFIX}SPAN_GROUPS is unset"
)
GYM_RUN_ID = Text("NEMO_GYM_OTEL_RUN_ID", None, "Gym's run id; wins over SLURM_JOB_ID and ours")
GYM_LOGS_ENABLED = Switch(
    "NEMO_GYM_OTEL_LOGS_ENABLED", False, "Gym's knob: export logs (when OTEL_LOGS_EXPORTER is unset)"
)
GYM_CONFIG_PATH = Text("NEMO_GYM_CONFIG_PATH", None, "set by Gym in each server it spawns: the server's name")
GYM_FASTAPI_WORKER = Text(
    "IS_NEMO_GYM_FASTAPI_WORKER", None, "set by Gym in each uvicorn worker of a multi-worker server"
)
SLURM_JOB_ID = Text("SLURM_JOB_ID", None, "the Slurm job, a run id when Gym's is unset")
# Read for the resource of a process in a Slurm job (``slurm.*``, ``host.name``).
SLURM_STEP_ID = Text("SLURM_STEP_ID", None, "the Slurm job step (slurm.step.id)")
SLURM_JOB_NAME = Text("SLURM_JOB_NAME", None, "the Slurm job's name (slurm.job.name)")
SLURM_ARRAY_JOB_ID = Text("SLURM_ARRAY_JOB_ID", None, "the job array's id (slurm.array.job.id)")
SLURM_ARRAY_TASK_ID = Text("SLURM_ARRAY_TASK_ID", None, "the index in the job array (slurm.array.task.id)")
SLURM_CLUSTER_NAME = Text("SLURM_CLUSTER_NAME", None, "the Slurm cluster (slurm.cluster.name)")
SLURM_JOB_PARTITION = Text("SLURM_JOB_PARTITION", None, "the job's partition (slurm.partition)")
SLURMD_NODENAME = Text("SLURMD_NODENAME", None, "the node Slurm runs this step on (host.name)")

# -- OpenTelemetry's --------------------------------------------------------------------

SDK_DISABLED = OtelFlag("OTEL_SDK_DISABLED", "true: no provider, nothing recorded")
SERVICE_NAME = Text("OTEL_SERVICE_NAME", None, "service.name (ours: nemo-gym/<server name>)")
PYTHON_DISTRO = Text("OTEL_PYTHON_DISTRO", None, "the distro opentelemetry-instrument uses")
PYTHON_CONFIGURATOR = Text(
    "OTEL_PYTHON_CONFIGURATOR", None, "the configurator opentelemetry-instrument uses (ours: gym_autoinstr)"
)
PYTHON_DISABLED_INSTRUMENTATIONS = Text(
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", None, "instrumentors not to load, comma-separated (ours sets fastapi)"
)
PYTHON_SDK_INTERNAL_METRICS = OtelFlag(
    "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "the SDK's self-metrics (they turn lean spans off)"
)
TRACES_EXPORTER = Text("OTEL_TRACES_EXPORTER", None, "span exporters, comma-separated (otlp, console, none, ...)")
METRICS_EXPORTER = Text("OTEL_METRICS_EXPORTER", None, "metric exporters, comma-separated (otlp, console, files, none)")
LOGS_EXPORTER = Text(
    "OTEL_LOGS_EXPORTER", None, "log exporters, comma-separated (otlp, console, files, none; default off)"
)
TRACES_SAMPLER = Text("OTEL_TRACES_SAMPLER", None, "the sampler (read by the SDK)")
TRACES_SAMPLER_ARG = Text("OTEL_TRACES_SAMPLER_ARG", None, "the sampler's argument (read by the SDK)")
METRICS_EXEMPLAR_FILTER = Text("OTEL_METRICS_EXEMPLAR_FILTER", None, "exemplar filter (set: the SDK's; unset: none)")
METRIC_EXPORT_INTERVAL = Number(
    "OTEL_METRIC_EXPORT_INTERVAL", 10_000, "metric export interval, in ms", above=True, integer=True
)
BSP_SCHEDULE_DELAY = Number(
    "OTEL_BSP_SCHEDULE_DELAY", 1000, "span batch delay, in ms (ours: 1000)", above=True, integer=True
)
BSP_MAX_QUEUE_SIZE = Number(
    "OTEL_BSP_MAX_QUEUE_SIZE", 65536, "span queue bound (ours: 65536)", above=True, integer=True
)
BSP_MAX_EXPORT_BATCH_SIZE = Number(
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 4096, "spans per export (ours: 4096)", above=True, integer=True
)
BSP_EXPORT_TIMEOUT = Text("OTEL_BSP_EXPORT_TIMEOUT", None, "span export timeout, in ms (read by the SDK)")

_OTLP = "OTEL_EXPORTER_OTLP_"
_PROTOCOLS = ("http/protobuf", "grpc")
_PROTOCOL_ALIASES = {"http": "http/protobuf"}
_PROTOCOL_FIX = "using http/protobuf"
OTLP_PROTOCOL = Choice(
    _OTLP + "PROTOCOL",
    "http/protobuf",
    _PROTOCOLS,
    "OTLP transport: grpc or http/protobuf",
    aliases=_PROTOCOL_ALIASES,
    fallback=_PROTOCOL_FIX,
)
OTLP_TRACES_PROTOCOL = Choice(
    _OTLP + "TRACES_PROTOCOL",
    "http/protobuf",
    _PROTOCOLS,
    "OTLP transport for spans",
    aliases=_PROTOCOL_ALIASES,
    inherits=OTLP_PROTOCOL,
    fallback=_PROTOCOL_FIX,
)
OTLP_METRICS_PROTOCOL = Text(_OTLP + "METRICS_PROTOCOL", None, "OTLP transport for metrics (else the spans')")
OTLP_LOGS_PROTOCOL = Text(_OTLP + "LOGS_PROTOCOL", None, "OTLP transport for logs (else the spans')")
OTLP_ENDPOINT = Text(_OTLP + "ENDPOINT", None, "the collector's base URL (the exporter appends /v1/<signal>)")
OTLP_TRACES_ENDPOINT = Text(_OTLP + "TRACES_ENDPOINT", None, "the span receiver's URL, used as-is")
OTLP_INSECURE = Text(_OTLP + "INSECURE", None, "gRPC without TLS")
OTLP_TRACES_INSECURE = Text(_OTLP + "TRACES_INSECURE", None, "gRPC without TLS, for spans")
OTLP_HEADERS = Text(_OTLP + "HEADERS", None, "headers sent with each export")
OTLP_TRACES_HEADERS = Text(_OTLP + "TRACES_HEADERS", None, "headers sent with each span export")
OTLP_CERTIFICATE = Text(_OTLP + "CERTIFICATE", None, "CA file for TLS")
OTLP_TRACES_CERTIFICATE = Text(_OTLP + "TRACES_CERTIFICATE", None, "CA file for TLS, for spans")
OTLP_TIMEOUT = Text(_OTLP + "TIMEOUT", None, "export timeout (read by the exporter)")
OTLP_TRACES_TIMEOUT = Text(_OTLP + "TRACES_TIMEOUT", None, "span export timeout (read by the exporter)")
OTLP_METRICS_TEMPORALITY = Text(
    _OTLP + "METRICS_TEMPORALITY_PREFERENCE",
    None,
    "metric temporality (read by the exporter; not cumulative: the SDK's histograms)",
)
PROPAGATORS = Text("OTEL_PROPAGATORS", None, "propagators (read by the API; not the default: no W3C fast path)")
PYTHON_CONTEXT = Text("OTEL_PYTHON_CONTEXT", None, "the context implementation (read by the API)")


def endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The span endpoint as configured: the signal's own, else the generic one."""
    return OTLP_TRACES_ENDPOINT.raw(environ) or OTLP_ENDPOINT.raw(environ)


def unknown(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(name, closest known name or None) for each ``GYM_AUTOINSTR_*`` variable set in
    ``environ`` that is none of ours: a misspelling, ignored."""
    import difflib

    environ = os.environ if environ is None else environ
    # compared without the prefix all of them share (else every name is "close")
    ours = [name.removeprefix(PREFIX) for name in ALL if name.startswith(PREFIX)]
    found = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in ALL:
            close = difflib.get_close_matches(name.removeprefix(PREFIX), ours, n=1, cutoff=0.6)
            found.append((name, PREFIX + close[0] if close else None))
    return found


def unknown_problem(name: str, closest: str | None) -> tuple[str, str]:
    """(problem, fix) for a ``GYM_AUTOINSTR_*`` name that is none of ours, worded the same at
    run time (one warning, the two joined) and by the doctor."""
    problem = f"{name} is not a gym-autoinstr setting, so it is ignored"
    if closest:
        return f"{problem} (did you mean {closest}?)", f"Rename it to {closest}."
    ours = ", ".join(n for n, s in ALL.items() if n.startswith(PREFIX) and not s.description.startswith("internal:"))
    return problem, f"Remove it, or use one of: {ours}."
