"""The OpenTelemetry instrumentor for NeMo Gym (entry point ``nemo_gym``).

``opentelemetry-instrument`` loads it at interpreter start, before the program runs.
It registers one post-import hook per module named in ``pointcuts.POINTCUTS``; each
hook patches its targets the moment Gym's module finishes loading (or at once, if it is
already loaded).  Hook bodies never raise: a target that cannot be patched is skipped
with one warning naming it, and Gym keeps working.

Usage without ``opentelemetry-instrument``::

    from gym_autoinstr.instrumentor import GymInstrumentor
    GymInstrumentor().instrument()
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.advice import ray_actor
from gym_autoinstr.advice.ray_carrier import stand_in
from gym_autoinstr.patching import PatchSet, restore_process_patches
from gym_autoinstr.pointcuts import POINTCUTS, Pointcut
from gym_autoinstr.setup import identity
from gym_autoinstr.telemetry import groups

GYM_PACKAGE = "nemo_gym"


def _at_interpreter_start() -> bool:
    """Loaded by ``opentelemetry-instrument``'s start-up, before the program imported Gym
    (not a manual ``instrument()`` call inside a running program)."""
    return "opentelemetry.instrumentation.auto_instrumentation" in sys.modules and "nemo_gym" not in sys.modules


class GymInstrumentor(BaseInstrumentor):
    """Traces NeMo Gym's hops and seams on unmodified Gym, any version 0.2.0 to 0.7.x."""

    def __init__(self) -> None:
        if not hasattr(self, "patches"):
            self.patches = PatchSet()
            self._hooked_modules: set[str] = set()

    def instrumentation_dependencies(self) -> Collection[str]:
        # Gym is found through post-import hooks; a process without it costs nothing.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        # opentelemetry-instrument stops loading the remaining instrumentors when one
        # raises anything but ImportError: ours never does.
        try:
            gym_process = self._instrument_guarded(**kwargs)
        except Exception as error:
            gym_process = False
            warn_once("instrument", "gym-autoinstr could not instrument this process (%r); Gym runs untraced.", error)
        if gym_process and _at_interpreter_start():
            try:
                from gym_autoinstr.setup.heap import freeze_startup_heap

                freeze_startup_heap()
            except Exception as error:
                warn_once("gc-freeze", "could not freeze the start-up heap: %r", error)
        from gym_autoinstr.telemetry.spans import mark_startup

        mark_startup("instrumented")  # the end of OpenTelemetry's start-up (start-up spans)

    def _instrument_guarded(self, **kwargs: Any) -> bool:
        """Apply the pointcuts; False when this process is one of Ray's (not patched)."""
        who = identity.detect()
        if who.role is identity.Role.RAY and not kwargs.get("force"):
            if identity.is_ray_worker():
                self._watch_ray_worker()
            logger.debug("Ray process: not instrumenting (Gym's work is traced, not Ray's internals)")
            return False
        try:
            from gym_autoinstr.setup.configurator import adopt_foreign_provider

            adopt_foreign_provider()
        except Exception as error:
            warn_once("adopt", "could not check the active tracer provider: %r", error)
        groups.reload()
        _warn_unknown_settings()
        if who.role is identity.Role.ORCHESTRATOR:
            _announce()
        ray_actor.wraps_actor_init(init_wrapper)  # the Ray actor classes we patch boot us in the actor
        self.patches.active = True
        # Gym's own package too: a process held back at start-up (not known as Gym's) is
        # configured as it imports Gym, before any of Gym's code can run.
        for module_name in sorted({p.module for p in POINTCUTS} | {GYM_PACKAGE}):
            if module_name in self._hooked_modules:
                # Hooks are registered once per process; a re-instrument re-applies now.
                if module_name in sys.modules:
                    self._on_import(sys.modules[module_name], late=True)
                continue
            self._hooked_modules.add(module_name)
            late = module_name in sys.modules
            wrapt.register_post_import_hook(self._hook_for(late), module_name)
        return True

    def _uninstrument(self, **kwargs: Any) -> None:
        self.patches.remove_all()
        restore_process_patches()  # pointcuts.PROCESS_PATCHES: encode_spans, aiohttp hooks, semaphore classes
        if hasattr(self, "ray_worker_patches"):
            self.ray_worker_patches.remove_all()

    # -- a Ray worker that runs Gym's orchestration (issue 16) -------------------------
    def _watch_ray_worker(self) -> None:
        """In a Ray worker, apply only the promotion rows (``RAY_WORKER_POINTCUTS``); their
        first call makes this worker Gym's orchestrator and applies every other row."""
        from gym_autoinstr.pointcuts import RAY_WORKER_POINTCUTS

        if not hasattr(self, "ray_worker_patches"):
            self.ray_worker_patches = PatchSet()
            ray_actor.on_promotion(self._on_ray_worker_promoted)
            for module_name in sorted({p.module for p in RAY_WORKER_POINTCUTS}):
                late = module_name in sys.modules
                wrapt.register_post_import_hook(self._ray_worker_hook(late), module_name)
        self.ray_worker_patches.active = True

    def _ray_worker_hook(self, late: bool) -> Any:
        from gym_autoinstr.pointcuts import RAY_WORKER_POINTCUTS

        def hook(module: Any) -> None:
            try:
                for pointcut in RAY_WORKER_POINTCUTS:
                    if pointcut.module == module.__name__:
                        self.ray_worker_patches.apply(pointcut, module, late=late)
                        applied = self.ray_worker_patches.applied.get(pointcut.name)
                        if applied is not None:
                            applied.wrapper._self_gym_autoinstr_stacks = True
            except Exception as error:  # never break Gym's import statement
                warn_once(f"hook:ray:{getattr(module, '__name__', '?')}", "instrumenting %r failed: %r", module, error)

        return hook

    def _on_ray_worker_promoted(self) -> None:
        self._instrument_guarded(force=True)
        _announce()

    def _hook_for(self, late: bool) -> Any:
        def hook(module: Any) -> None:
            self._on_import(module, late=late)

        return hook

    def _on_import(self, module: Any, *, late: bool) -> None:
        try:
            name = module.__name__
            if name == GYM_PACKAGE or name.startswith(GYM_PACKAGE + "."):
                from gym_autoinstr.setup.configurator import configure_gym_process

                configure_gym_process()
            for pointcut in _pointcuts_for(module.__name__):
                self.patches.apply(pointcut, module, late=late)
        except Exception as error:  # never break Gym's import statement
            warn_once(f"hook:{getattr(module, '__name__', '?')}", "instrumenting %r failed: %r", module, error)


def _warn_unknown_settings() -> None:
    """A ``GYM_AUTOINSTR_*`` name that is none of ours (a misspelling) is ignored: say so, once
    per process tree.  The names said go into the environment every child inherits
    (``GYM_AUTOINSTR_UNKNOWN_SAID``), so Gym's servers do not repeat the orchestrator; a
    name a child has and its parent had not, the child says."""
    try:
        found = settings.unknown()
        if not found:
            return
        said = set(filter(None, (settings.UNKNOWN_SAID.raw() or "").split(",")))
        for name, closest in found:
            if name not in said:
                problem, fix = settings.unknown_problem(name, closest)
                warn_once(f"setting:unknown:{name}", "%s. %s", problem, fix)
        os.environ[settings.UNKNOWN_SAID.name] = ",".join(sorted(said | {name for name, _ in found}))
    except Exception as error:  # a warning only: never in the way of instrumenting Gym
        logger.debug("could not check the GYM_AUTOINSTR_* names: %r", error)


def _pointcuts_for(module_name: str) -> list[Pointcut]:
    return [p for p in POINTCUTS if p.module == module_name]


def _announce() -> None:
    """One line from the orchestrator saying what is on, so a user can tell at a glance."""
    from gym_autoinstr.setup.configurator import STATE
    from gym_autoinstr.setup.distro import active_distro

    exporters = ", ".join(STATE.exporters) or "none"
    from gym_autoinstr.telemetry.redaction import redact_url

    endpoint = settings.endpoint()
    endpoint = redact_url(endpoint)[0] if endpoint else "default"
    logger.info(
        "tracing Gym: distro=%s configurator=%s exporters=%s endpoint=%s span groups=%s",
        active_distro(),
        STATE.configured_by,
        exporters,
        endpoint,
        ",".join(sorted(groups.ENABLED)) or "none",
    )


# -- a Ray actor whose runtime_env replaced PYTHONPATH: booted from its creation carrier --
#
# (``advice/ray_actor.py`` tells the whole story.)  Ray pickles ``init_wrapper``'s
# ``__init__`` by value into the actor; where gym-autoinstr imports there, it boots the
# instrumentor before the actor's own ``__init__`` runs.

MISSING_ACTOR_MESSAGE = (
    "gym-autoinstr: this Ray actor's Python cannot import gym_autoinstr, so Gym's orchestration in it "
    "is not traced (the actor itself runs as usual). Fix: install gym-autoinstr (and its OpenTelemetry "
    "packages) into the interpreter the actor runs with (its runtime_env's py_executable or pip)."
)
_booted = False
_boot_lock = threading.Lock()


def init_wrapper(function: Any, missing: list | None = None) -> Any:
    """The ``__init__`` Ray pickles and runs in the actor (``ray_carrier.stand_in``): takes
    the carrier off and, where gym-autoinstr imports, boots the actor first (``actor_init``)."""
    wrapper = stand_in(function, missing, runner="gym_autoinstr.instrumentor.actor_init", text=MISSING_ACTOR_MESSAGE)
    del wrapper.__wrapped__  # Ray unwraps before reading the signature
    return wrapper


def actor_init(function: Any, args: tuple, kwargs: dict, carrier: Any) -> Any:
    """In the actor: boot, then run ``__init__`` with the creator's context when an
    embedder's span was current there."""
    token = None
    try:
        if isinstance(carrier, dict):
            boot(dict(carrier.get("settings") or {}))
            headers = carrier.get("context") or {}
            if headers and not carrier.get("rootless"):
                token = otel_context.attach(propagate.extract(headers))
    except Exception as error:
        warn_once("ray_actor:boot", "this Ray actor could not be prepared for tracing: %r", error)
    try:
        return function(*args, **kwargs)  # args[0]: the actor
    finally:
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:
                pass


def boot(settings: dict[str, str]) -> None:
    """Make this actor watch for Gym's orchestration when the sitecustomize did not run in
    it (``runtime_env`` replaced ``PYTHONPATH``); nothing when it did."""
    global _booted
    with _boot_lock:
        if _booted:
            return
        _booted = True
    instrumentor = GymInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return  # opentelemetry-instrument's sitecustomize ran here: it watches already
    for name, value in settings.items():
        os.environ.setdefault(name, value)  # the actor's own environment wins
    ray_actor.on_promotion(_children_get_sitecustomize)
    instrumentor.instrument()
    logger.debug("Ray actor booted from its creation carrier (no sitecustomize in this worker)")


def _children_get_sitecustomize() -> None:
    """The servers a promoted, booted actor spawns start under OpenTelemetry's
    sitecustomize, as they would under ``opentelemetry-instrument`` (its own directory
    first on ``PYTHONPATH``; the runtime_env's entries stay, after it)."""
    from opentelemetry.instrumentation import auto_instrumentation

    directory = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    current = os.environ.get("PYTHONPATH", "")
    if directory not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = directory + (os.pathsep + current if current else "")
