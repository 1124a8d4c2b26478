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
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .._log import logger, warn_once

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
            from ..pipeline.configurator import configure_ray_orchestrator

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
    from ..pipeline.identity import SHARD_VARIABLE

    shard = os.environ.get(SHARD_VARIABLE) or actor_name or actor_id
    if shard:
        attributes["nemo.gym.shard"] = str(shard)
    return attributes
