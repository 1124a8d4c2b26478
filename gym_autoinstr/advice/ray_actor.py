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
prepares an actor whose ``runtime_env`` replaced ``PYTHONPATH`` (booted by
``instrumentor.boot``).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from gym_autoinstr import attributes as attr
from gym_autoinstr import settings
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.advice.guard import guarded_advice
from gym_autoinstr.advice.ray_carrier import CARRIER, call_parts, signature_with_carrier, with_call_kwargs
from gym_autoinstr.attributes import HOST_NAME, PROCESS_PID, SHARD
from gym_autoinstr.telemetry import groups

_lock = threading.Lock()
_callbacks: list[Callable[[], None]] = []
# None: not decided yet; True: this worker is Gym's orchestrator; False: it stays silent.
_promoted: bool | None = None


def on_promotion(callback: Callable[[], None]) -> None:
    """Run ``callback`` (the instrumentor applying every pointcut) once this worker is promoted."""
    _callbacks.append(callback)


def promoted() -> bool | None:
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


_RUNTIME_GETTERS = {
    attr.RAY_TASK_ID: "get_task_id",
    attr.RAY_NODE_ID: "get_node_id",
    attr.RAY_WORKER_ID: "get_worker_id",
    attr.RAY_ACTOR_ID: "get_actor_id",
    attr.RAY_JOB_ID: "get_job_id",
}


def runtime_ids(context: Any, keys: tuple[str, ...]) -> dict[str, str]:
    """The ids Ray's runtime ``context`` has of ``keys`` (``attributes.RAY_*``), as text."""
    found = {}
    for key in keys:
        try:
            value = getattr(context, _RUNTIME_GETTERS[key])()
        except Exception:
            value = None
        if value:
            found[key] = str(value)
    return found


def ray_actor_attributes() -> dict[str, Any]:
    """Which actor, shard and node this worker is: resource attributes (no argument,
    config or environment value of Gym's)."""
    attributes: dict[str, Any] = {PROCESS_PID: os.getpid()}
    try:
        import socket

        attributes[HOST_NAME] = socket.gethostname()
    except Exception:
        pass
    actor_id = actor_name = None
    try:
        import ray

        context = ray.get_runtime_context()
        attributes.update(runtime_ids(context, (attr.RAY_NODE_ID, attr.RAY_JOB_ID, attr.RAY_ACTOR_ID)))
        actor_id = attributes.get(attr.RAY_ACTOR_ID)
        get_name = getattr(context, "get_actor_name", None)
        actor_name = get_name() if get_name is not None and actor_id else None
        if actor_name:
            attributes[attr.RAY_ACTOR_NAME] = str(actor_name)
    except Exception as error:
        warn_once("ray_actor:context", "Ray's runtime context is unavailable here (%r); no actor or node id.", error)

    shard = settings.SHARD.raw() or actor_name or actor_id
    if shard:
        attributes[SHARD] = str(shard)
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
_BOOT_EXTRA = tuple(
    s.name
    for s in (
        settings.PYTHON_DISTRO,
        settings.PYTHON_CONFIGURATOR,
        settings.PYTHON_DISABLED_INSTRUMENTATIONS,
        settings.TRACES_SAMPLER,
        settings.TRACES_SAMPLER_ARG,
        settings.METRICS_EXPORTER,
        settings.LOGS_EXPORTER,
    )
)
_BOOT_EXCLUDED = (settings.SERVICE_NAME.name, settings.GYM_RUN_ID.name)


def _boot_settings() -> dict[str, str]:
    from gym_autoinstr.setup import identity
    from gym_autoinstr.setup.configurator import RAY_WORKER_SETTINGS

    excluded = {*_BOOT_EXCLUDED, identity.RUN_ID_VARIABLE, identity.SHARD_VARIABLE}
    return {
        name: value
        for name, value in os.environ.items()
        if (name in RAY_WORKER_SETTINGS or name in _BOOT_EXTRA or name.startswith(settings.PREFIX))
        and name not in excluded
    }


# The ``__init__`` wrapper that boots the actor (``instrumentor.init_wrapper``): booting
# is the instrumentor's work, a layer above the advice, so it hands the wrapper over
# when it instruments.
_init_wrapper: Callable[[Any, list | None], Any] | None = None


def wraps_actor_init(factory: Callable[[Any, list | None], Any]) -> None:
    """Use ``factory(function, missing)`` for the ``__init__`` ``install_init`` puts on an actor class."""
    global _init_wrapper
    _init_wrapper = factory


def install_init(cls: Any, missing: list | None = None) -> None:
    """Put the carrier on the ``__init__`` of Ray's actor subclass (never the user's class)."""
    if _init_wrapper is None:
        return  # not instrumented: no instrumentor handed its wrapper over
    raw = inspect.getattr_static(cls, "__init__", None)
    if not inspect.isfunction(raw):
        return  # object.__init__ and the like: nothing of the user's runs at creation
    try:
        signature = signature_with_carrier(raw)
    except (TypeError, ValueError):
        return
    if signature is None:
        return  # ray_tasks warns about the name clash for methods; __init__ stays as it is
    wrapper = _init_wrapper(raw, missing)
    wrapper.__signature__ = signature  # what Ray binds the creation arguments against
    cls.__init__ = wrapper


def join_as_driver() -> None:
    """A process held back at start-up (it is not Gym's: nothing set up, nothing written)
    that hands work to Ray is a Ray driver, maybe running Gym in its actors (NeMo RL's
    ``NemoGym`` actor): it gets its pipeline now, before the span of its first submission,
    so its spans join the rollouts its actors run."""
    if _HELD_BACK[0] is None:
        from gym_autoinstr.setup import configurator

        _HELD_BACK[0] = configurator
    if _HELD_BACK[0].STATE.held_back:
        _HELD_BACK[0].configure_gym_process()


_HELD_BACK: list[Any] = [None]  # the configurator module, imported on the first submission


def submission_traced() -> bool:
    """A hand-over of work to Ray (a task, an actor method, an actor's creation): this
    process joins as a Ray driver first, traced or not; traced while the ``ray`` group is on."""
    join_as_driver()
    return groups.RAY in groups.ENABLED


@guarded_advice("ray:actor-create", "Ray actor creation carries no trace context: %r", gate=submission_traced)
def actor_create_advice(instance: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``ActorClass._remote``: the carrier joins the creation arguments when Ray's actor
    class took it (``ray.actor`` pointcut)."""
    from gym_autoinstr.advice import coexistence

    meta = getattr(instance, "__ray_metadata__", None)
    signatures = getattr(getattr(meta, "method_meta", None), "signatures", None) or {}
    if (
        not any(getattr(parameter, "name", None) == CARRIER for parameter in signatures.get("__init__") or ())
        or coexistence.native_telemetry_live()
        or _client_mode()
    ):
        return None
    headers: dict[str, str] = {}
    rootless = caller_is_rootless()
    if not rootless:
        propagate.inject(headers)
    _, call_kwargs = call_parts(args, kwargs)
    new_kwargs = dict(call_kwargs or {})
    new_kwargs[CARRIER] = {"context": headers, "rootless": rootless, "settings": _boot_settings()}
    return with_call_kwargs(args, kwargs, new_kwargs)


def _client_mode() -> bool:
    """This process talks to Ray through Ray's client (``ray://``): actor creation then
    goes through the client's stubs, which carry no creation carrier."""
    try:
        from ray._private.client_mode_hook import client_mode_should_convert

        return bool(client_mode_should_convert())
    except Exception:
        return False
