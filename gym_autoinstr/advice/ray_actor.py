"""Gym's orchestration inside a Ray worker: the worker becomes Gym's orchestrator.

NeMo RL runs Gym from a Ray actor (``NemoGym``): the actor starts the whole fleet
(``RunHelper().start(...)``) and collects rollouts (``RolloutCollectionHelper().
run_examples(...)``).  Every Ray worker starts silent, like Ray's daemons (no provider,
no patches); in a Ray worker the instrumentor applies only the rows of
``pointcuts.RAY_WORKER_POINTCUTS``, which wrap those entry points with
``promote_advice``.  The first call of one of them is where the line is crossed: the
process takes the orchestrator's identity, with which actor, shard and node it is
(``configurator.configure_ray_orchestrator``; an embedder's provider already live in the
actor is adopted), every pointcut is applied (the callbacks registered by the
instrumentor), and the call re-enters through them, so that very call is traced.

A worker that imports Gym's modules but never calls these (a Gym server's Ray task
unpickling its function) stays silent.

Below: whose span is upstream of an actor call (our own ``ray.execute`` is not an
embedder's: ``rootless_call``, read by ``advice/job.py``), and the creation carrier that
prepares an actor whose ``runtime_env`` replaced ``PYTHONPATH`` (``boot``).
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Callable

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once

_lock = threading.Lock()
_callbacks: list[Callable[[], None]] = []
# None: not decided yet; True: this worker is Gym's orchestrator; False: it stays silent.
_promoted: "bool | None" = None


def on_promotion(callback: Callable[[], None]) -> None:
    """Run ``callback`` (the instrumentor applying every pointcut) once this worker is promoted."""
    _callbacks.append(callback)


def promoted() -> "bool | None":
    return _promoted


def promote_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _promoted is not None:
        return wrapped(*args, **kwargs)
    if not _promote():
        return wrapped(*args, **kwargs)
    # Re-enter through whatever stands on the class now (e.g. the job pointcut on the
    # same method), so the call that promoted this worker is traced like every later one.
    try:
        current = getattr(instance, getattr(wrapped, "__name__", ""), None) if instance is not None else None
    except Exception:
        current = None
    if current is None:
        return wrapped(*args, **kwargs)
    return current(*args, **kwargs)


def _promote() -> bool:
    global _promoted
    with _lock:
        if _promoted is not None:
            return _promoted
        try:
            from gym_autoinstr.setup.configurator import configure_ray_orchestrator

            _promoted = bool(configure_ray_orchestrator(ray_actor_attributes()))
        except Exception as error:
            _promoted = False
            warn_once("ray_actor:promote", "Gym's orchestration in this Ray worker is not traced: %r", error)
            return False
    if _promoted:
        for callback in list(_callbacks):
            try:
                callback()
            except Exception as error:
                warn_once("ray_actor:instrument", "instrumenting Gym in this Ray worker failed: %r", error)
        logger.debug("Ray worker promoted to Gym orchestrator")
    return _promoted


def ray_actor_attributes() -> dict[str, Any]:
    """Which actor, shard and node this worker is: resource attributes (no argument,
    config or environment value of Gym's)."""
    attributes: dict[str, Any] = {"process.pid": os.getpid()}
    try:
        import socket

        attributes["host.name"] = socket.gethostname()
    except Exception:
        pass
    actor_id = actor_name = None
    try:
        import ray

        context = ray.get_runtime_context()
        for key, getter in (("ray.node.id", "get_node_id"), ("ray.job.id", "get_job_id"),
                            ("ray.actor.id", "get_actor_id")):
            try:
                value = getattr(context, getter)()
            except Exception:
                value = None
            if value:
                attributes[key] = str(value)
        actor_id = attributes.get("ray.actor.id")
        get_name = getattr(context, "get_actor_name", None)
        actor_name = get_name() if get_name is not None and actor_id else None
        if actor_name:
            attributes["ray.actor.name"] = str(actor_name)
    except Exception as error:
        warn_once("ray_actor:context", "Ray's runtime context is unavailable here (%r); no actor or node id.", error)
    from gym_autoinstr.setup.identity import SHARD_VARIABLE

    shard = settings.SHARD.raw() or actor_name or actor_id
    if shard:
        attributes["nemo.gym.shard"] = str(shard)
    return attributes


# --- whose span is upstream of an actor call (issue 16) -----------------------------
#
# Our Ray propagation carries the caller's context into the actor: the method runs in a
# ``ray.execute`` CONSUMER span, the child of the caller's ``ray.submit``.  Those two are
# ours, not an embedder's: when nothing else was current at the submission (or only a
# ``ray.execute`` that was itself rootless, an actor calling an actor), the carrier says
# ``rootless`` and the worker marks its ``ray.execute`` span so in the context.  Gym's
# collection in the actor then applies the job-traces rules as if nothing were upstream
# (``advice/job.py``): ``gym.job`` starts a trace of its own, linked to the actor call.
# Any other span upstream (a span the driver opened, NeMo RL's ``rl.gym.run_rollouts``
# carried by its decorator, a span the actor opened itself) is an embedder's: it wins.

_ROOTLESS = otel_context.create_key("gym_autoinstr.ray_rootless_execute")


def mark_rootless(span: Any, context: Any) -> Any:
    """``context`` with ``span`` (a ``ray.execute`` whose caller had nothing upstream) marked."""
    return otel_context.set_value(_ROOTLESS, span, context)


def rootless_call() -> Any:
    """The current span when it is a ``ray.execute`` with nothing upstream but our own
    Ray spans, else None."""
    span = trace.get_current_span()
    marked = otel_context.get_value(_ROOTLESS)
    return span if marked is not None and marked is span else None


def caller_is_rootless() -> bool:
    """At a Ray submission: nothing upstream of it but our own Ray spans."""
    return not trace.get_current_span().get_span_context().is_valid or rootless_call() is not None


# --- actor creation: the carrier reaches ``__init__`` (issue 16) ----------------------
#
# An actor whose ``runtime_env`` replaces ``PYTHONPATH`` runs without
# ``opentelemetry-instrument``'s sitecustomize: no instrumentor, so Gym's orchestration in
# it would never be noticed.  As for tasks, the context rides in a carrier keyword
# argument, here of ``__init__`` (added at ``ActorClass._remote``, pointcut
# ``ray.actor_create``), taken off again by a wrapper Ray pickles by value.  Where
# gym-autoinstr imports in the actor, the wrapper *boots* it first: the exporter
# settings of the creating process fill what the actor's environment lacks, and the
# instrumentor watches for Gym's orchestration as the sitecustomize would have; on
# promotion, the servers the actor spawns get the sitecustomize back on ``PYTHONPATH``.
# Where it does not import (a ``py_executable`` without our package), ``__init__`` runs
# as before and one message says so.  ``__init__`` runs with the creator's context when
# an embedder's span was current there; no span of ours is opened for the creation.

# What the creator hands the actor to boot with: exporter settings and our own switches,
# never the creator's service name, run id or shard (the actor is its own orchestrator).
_BOOT_EXTRA = tuple(s.name for s in (settings.PYTHON_DISTRO, settings.PYTHON_CONFIGURATOR,
                                      settings.PYTHON_DISABLED_INSTRUMENTATIONS, settings.TRACES_SAMPLER,
                                      settings.TRACES_SAMPLER_ARG, settings.METRICS_EXPORTER, settings.LOGS_EXPORTER))
_BOOT_EXCLUDED = (settings.SERVICE_NAME.name, settings.GYM_RUN_ID.name)

MISSING_ACTOR_MESSAGE = (
    "gym-autoinstr: this Ray actor's Python cannot import gym_autoinstr, so Gym's orchestration in it "
    "is not traced (the actor itself runs as usual). Fix: install gym-autoinstr (and its OpenTelemetry "
    "packages) into the interpreter the actor runs with (its runtime_env's py_executable or pip)."
)
_booted = False


def _boot_settings() -> dict[str, str]:
    from gym_autoinstr.setup import identity
    from gym_autoinstr.setup.configurator import RAY_WORKER_SETTINGS

    excluded = {*_BOOT_EXCLUDED, identity.RUN_ID_VARIABLE, identity.SHARD_VARIABLE}
    return {
        name: value for name, value in os.environ.items()
        if (name in RAY_WORKER_SETTINGS or name in _BOOT_EXTRA or name.startswith(settings.PREFIX))
        and name not in excluded
    }


def init_wrapper(function: Any, missing: "list | None" = None) -> Any:
    """The ``__init__`` Ray pickles and runs in the actor: takes the carrier off and, where
    gym-autoinstr imports, boots the actor first.  Pickled by value, like
    ``ray_tasks.carrier_wrapper``: builtins, its closure and its own imports only."""
    missing = [] if missing is None else missing

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        carrier = kwargs.pop("_gym_autoinstr_ctx", None)
        if carrier is not None:
            try:
                from gym_autoinstr.advice.ray_actor import actor_init
            except Exception:
                actor_init = None
                if not missing:
                    missing.append(1)
                    import sys

                    print(MISSING_ACTOR_TEXT, file=sys.stderr, flush=True)
            if actor_init is not None:
                return actor_init(function, self, args, kwargs, carrier)
        return function(self, *args, **kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(__init__, name, getattr(function, name))
        except (AttributeError, TypeError):
            pass
    return __init__


MISSING_ACTOR_TEXT = MISSING_ACTOR_MESSAGE  # global the wrapper names: carried by value


def install_init(cls: Any, missing: "list | None" = None) -> None:
    """Put the carrier on the ``__init__`` of Ray's actor subclass (never the user's class)."""
    from gym_autoinstr.advice.ray_tasks import _signature_with_carrier

    raw = inspect.getattr_static(cls, "__init__", None)
    if not inspect.isfunction(raw):
        return  # object.__init__ and the like: nothing of the user's runs at creation
    try:
        signature = _signature_with_carrier(raw)
    except (TypeError, ValueError):
        return
    if signature is None:
        return  # ray_tasks warns about the name clash for methods; __init__ stays as it is
    wrapper = init_wrapper(raw, missing)
    wrapper.__signature__ = signature  # what Ray binds the creation arguments against
    setattr(cls, "__init__", wrapper)


def actor_create_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``ActorClass._remote``: the carrier joins the creation arguments when Ray's actor
    class took it (``ray.actor`` pointcut)."""
    from gym_autoinstr.telemetry import groups

    if groups.RAY not in groups.ENABLED:
        return wrapped(*args, **kwargs)
    try:
        args, kwargs = _with_creation_carrier(instance, args, kwargs)
    except Exception as error:
        warn_once("ray:actor-create", "Ray actor creation carries no trace context: %r", error)
    return wrapped(*args, **kwargs)


def _with_creation_carrier(instance: Any, args: tuple, kwargs: dict) -> "tuple[tuple, dict]":
    from gym_autoinstr.advice import coexistence
    from gym_autoinstr.advice.ray_tasks import CARRIER, _call_parts, _with_call_kwargs

    meta = getattr(instance, "__ray_metadata__", None)
    signatures = getattr(getattr(meta, "method_meta", None), "signatures", None) or {}
    if (
        not any(getattr(parameter, "name", None) == CARRIER for parameter in signatures.get("__init__") or ())
        or coexistence.native_telemetry_live()
        or _client_mode()
    ):
        return args, kwargs
    headers: dict[str, str] = {}
    rootless = caller_is_rootless()
    if not rootless:
        propagate.inject(headers)
    _, call_kwargs = _call_parts(args, kwargs)
    new_kwargs = dict(call_kwargs or {})
    new_kwargs[CARRIER] = {"context": headers, "rootless": rootless, "settings": _boot_settings()}
    return _with_call_kwargs(args, kwargs, new_kwargs)


def _client_mode() -> bool:
    """This process talks to Ray through Ray's client (``ray://``): actor creation then
    goes through the client's stubs, which carry no creation carrier."""
    try:
        from ray._private.client_mode_hook import client_mode_should_convert

        return bool(client_mode_should_convert())
    except Exception:
        return False


def actor_init(function: Any, instance: Any, args: tuple, kwargs: dict, carrier: Any) -> Any:
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
        return function(instance, *args, **kwargs)
    finally:
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:
                pass


def boot(settings: "dict[str, str]") -> None:
    """Make this actor watch for Gym's orchestration when the sitecustomize did not run in
    it (``runtime_env`` replaced ``PYTHONPATH``); nothing when it did."""
    global _booted
    with _lock:
        if _booted:
            return
        _booted = True
    from gym_autoinstr.instrumentor import GymInstrumentor

    instrumentor = GymInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return  # opentelemetry-instrument's sitecustomize ran here: it watches already
    for name, value in settings.items():
        os.environ.setdefault(name, value)  # the actor's own environment wins
    on_promotion(_children_get_sitecustomize)
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
