"""Ray tasks and actors: the trace follows Gym's work across ``.remote()`` into the Ray worker.

Gym's verifiers hand their real work to Ray (``code_gen`` runs the model's code in a
``@ray.remote`` task with ``scheduling_strategy="SPREAD"`` and a ``runtime_env`` that
replaces ``PYTHONPATH``).  Two halves:

* **Submission** (a Gym process, pointcut ``ray.task``): ``RemoteFunction._remote``
  opens a PRODUCER span ``ray.submit <function>`` around the submission and hands the
  context to the task in one extra keyword argument, the *carrier*
  (``_gym_autoinstr_ctx``: W3C ``traceparent``/``tracestate``, the submitting server's
  name, the submission time, the exporter settings; never the task's arguments).
  Actor method calls (pointcut ``ray.actor_method``) the same way, for actors whose
  class a Gym process created (pointcut ``ray.actor``, see "actors" below).
* **Execution** (the Ray worker): the function Ray pickles is a small stand-in for
  Gym's that takes the carrier off again (``ray_carrier.stand_in``).  It is pickled *by
  value* and needs nothing but the standard library to unpickle and run: in a worker
  whose interpreter lacks gym-autoinstr the task runs exactly as before (one message
  says so and names the fix).  Where our package imports, the task runs inside a
  CONSUMER span ``ray.execute <function>`` (``ray_worker.py``).  ``ray.kill`` (pointcut
  ``ray.kill``) kills an actor at once, export thread included, so before it kills an
  actor whose methods we trace it has the actor flush first (``__ray_call__``), waiting
  at most the flush timeout: the spans of the actor's last calls are not lost to the kill.

Why a carrier argument rather than Ray's own tracing hooks: Ray's
(``_ray_trace_ctx``) only work when tracing is switched on for the whole cluster at
``ray.init`` and crash a task whose worker lacks OpenTelemetry; a wrapper pickled by
reference would make unpickling depend on our package; a per-task ``runtime_env``
would cost a new worker per trace.  The carrier rides inside Ray's own argument
passing, so ``.options(...)``, ``num_returns``, SPREAD scheduling and retries are
untouched, and a function's own parameters (positional-only, keyword-only,
``*args``/``**kwargs``) keep their meaning: the carrier is a keyword-only parameter added
to the signature Ray checks calls against.  Not traced (the task runs as before):
generators, cross-language functions, a function that already has a parameter of the
carrier's name (one warning), functions with an invocation decorator.

Ray client mode (``ray.init("ray://...")``): a remote function or actor class declared
before the connection (at import time, as Gym's servers do) is a ``RemoteFunction`` /
``ActorClass`` that Ray converts to its client stub at the first call; the stub pickles
our wrapper, so the carrier rides along and the worker traces as usual (pointcut
``ray.client_call`` adds it to actor method calls, which in client mode never reach
``ActorMethod._remote``).  A client stub made without the carrier (by Ray's client API
directly, ``ray.util.client.ray.remote``) runs untraced, and one message says so and how to
fix it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from gym_autoinstr import attributes as attr
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.advice import coexistence, ray_actor
from gym_autoinstr.advice.guard import guarded_advice
from gym_autoinstr.advice.ray_carrier import CARRIER, call_parts, signature_with_carrier, stand_in, with_call_kwargs
from gym_autoinstr.advice.ray_worker import function_name as _function_name
from gym_autoinstr.fastpath import context_ops
from gym_autoinstr.telemetry import groups
from gym_autoinstr.telemetry.spans import mark_error, tracer

INSTALLED = "_gym_autoinstr_carrier"  # on a RemoteFunction: True traced, False not
_SEND = {"messaging.system": "ray", "messaging.operation.type": "send"}  # on every ray.submit span

MISSING_MESSAGE = (
    "gym-autoinstr: this Ray worker's Python cannot import gym_autoinstr, so the Gym task "
    "it runs is not traced (the task itself runs as usual). Fix: install gym-autoinstr "
    "(and its OpenTelemetry packages) into the interpreter Ray runs the task with, or "
    "into the task's runtime_env."
)


# --- the submitting side -------------------------------------------------------------


# carrier_wrapper(function, missing=None): the stand-in Ray pickles for a task or an actor method
carrier_wrapper = functools.partial(stand_in, runner="gym_autoinstr.advice.ray_worker.execute", text=MISSING_MESSAGE)


def _install(remote_function: Any) -> bool:
    """Swap the carrier wrapper in for the function Ray pickles, once per remote function."""
    installed = remote_function.__dict__.get(INSTALLED)
    if installed is not None:
        return installed
    lock = remote_function.__dict__.get("_inject_lock")
    if lock is None:
        return _install_locked(remote_function)
    with lock:
        return _install_locked(remote_function)


def _install_locked(remote_function: Any) -> bool:
    installed = remote_function.__dict__.get(INSTALLED)
    if installed is not None:
        return installed
    result = False
    function = remote_function.__dict__.get("_function")
    if function is None or not all(
        name in remote_function.__dict__ for name in ("_function_signature", "_last_export_cluster_and_job")
    ):
        warn_once(
            "ray:unknown-remote-function",
            "this Ray version's RemoteFunction (ray %s) is not one gym-autoinstr knows; Ray tasks run untraced. "
            "Run `gym-autoinstr doctor` and report the Ray version.",
            _ray_version(),
        )
    elif (
        remote_function.__dict__.get("_is_cross_language")
        or remote_function.__dict__.get("_is_generator")
        or remote_function.__dict__.get("_decorator") is not None
        or inspect.isgeneratorfunction(function)
        or inspect.isasyncgenfunction(function)
    ):
        logger.debug("Ray task %s: generator, cross-language or decorated; not traced", _function_name(function))
    else:
        try:
            signature = signature_with_carrier(function)
        except (TypeError, ValueError):
            signature = None
            logger.debug("Ray task %s: no signature; not traced", _function_name(function))
        else:
            if signature is None:
                warn_once(
                    f"ray:collision:{_function_name(function)}",
                    "Ray task %s has a parameter named %s, which gym-autoinstr uses to carry trace context; "
                    "this task runs untraced. Rename the parameter to trace it.",
                    _function_name(function),
                    CARRIER,
                )
        if signature is not None:
            wrapper = carrier_wrapper(function)
            wrapper.__signature__ = signature  # what Ray binds calls against
            remote_function._function = wrapper
            # Ray extracts the signature and pickles the function on the next call
            # (again, if an earlier call already did).
            remote_function._function_signature = None
            remote_function._last_export_cluster_and_job = None
            result = True
    remote_function.__dict__[INSTALLED] = result
    return result


def _ray_version() -> str:
    try:
        import ray

        return str(ray.__version__)
    except Exception:
        return "unknown"


def _carrier(span: Any) -> dict:
    from gym_autoinstr.setup import configurator

    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    who = configurator.STATE.identity
    return {
        "context": headers,
        "server": getattr(who, "name", None) or "unknown",
        "submitted": time.time(),
        "settings": _settings(),
    }


_settings_cache: dict[str, str] | None = None


def _settings() -> dict:
    global _settings_cache
    if _settings_cache is None:
        from gym_autoinstr.setup.configurator import ray_worker_settings

        _settings_cache = ray_worker_settings()
    return _settings_cache


def _refs_task_id(result: Any) -> str | None:
    first = result[0] if isinstance(result, list) and result else result
    # Ray client mode: a ref's id arrives from the client server later; reading it now
    # would wait for that round trip, so the submit span goes without it.
    pending = getattr(first, "__dict__", {}).get("_id_future")
    if pending is not None and not pending.done():
        return None
    task_id = getattr(first, "task_id", None)
    if task_id is None:
        return None
    return task_id().hex()


def _submit(wrapped: Any, prepared: tuple[Any, tuple, dict]) -> Any:
    span, args, kwargs = prepared
    try:
        entered = context_ops.enter(span)
        try:
            result = wrapped(*args, **kwargs)
        finally:
            context_ops.leave(entered)
    except BaseException as error:
        if isinstance(error, Exception):
            mark_error(span, error)
        span.end()
        raise
    try:
        task_id = _refs_task_id(result)
        if task_id:
            span.set_attribute(attr.RAY_TASK_ID, task_id)
    except Exception:
        pass
    span.end()
    return result


def _submission_advice(key: str, message: str, *, stub: bool = False) -> Any:
    """Make ``describe(instance)``, which names what a submission runs (``(name,
    attributes)``; None: not traced), the advice on one of Ray's submission calls: a PRODUCER
    span ``ray.submit <name>`` around the call, the carrier among the task's keyword
    arguments.  ``stub``: a Ray client stub's ``remote``, which takes them itself (and one
    that has the carrier came through ``_remote``'s advice); else ``_remote(args=, kwargs=)``."""

    def decorate(describe: Any) -> Any:
        @guarded_advice(key, message, gate=ray_actor.submission_traced, then=_submit)
        @functools.wraps(describe)
        def prepare(instance: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
            if (stub and CARRIER in kwargs) or coexistence.native_telemetry_live():
                return None
            described = describe(instance)
            if described is None:
                return None
            call_kwargs = kwargs if stub else call_parts(args, kwargs)[1]
            rootless = ray_actor.caller_is_rootless()  # before our own ray.submit is current
            name, attributes = described  # a dict of describe's own: completed in place
            attributes.update(_SEND)
            span = tracer().start_span(f"ray.submit {name}", kind=SpanKind.PRODUCER, attributes=attributes)
            call_kwargs = dict(call_kwargs or {})
            call_kwargs[CARRIER] = {**_carrier(span), "rootless": rootless}
            return (span, args, call_kwargs) if stub else (span, *with_call_kwargs(args, kwargs, call_kwargs))

        return prepare

    return decorate


@_submission_advice("ray:submit", "Ray task submission not traced: %r")
def remote_function_advice(instance: Any) -> tuple[str, dict] | None:
    """``RemoteFunction._remote``: a PRODUCER span around the submission, the carrier added."""
    if not _install(instance):
        return None
    function = instance._function
    name = _function_name(getattr(function, "__wrapped__", function))
    return getattr(function, "__qualname__", name), {attr.RAY_TASK_FUNCTION: name}


# --- actors ---------------------------------------------------------------------------
#
# ``ray.remote(SomeClass)`` hands ``ray.actor._modify_class`` the class; it returns a
# subclass defined inside Ray (so Ray pickles it by value), which the worker loads and
# instantiates.  The carrier wrappers go into that subclass, one per method, never
# touching the user's class: inherited methods are shadowed, dunders (``__init__``,
# Ray's ``__ray_ready__``, ...), static and class methods and generators are left alone.
# Ray reads each method's signature (``inspect.unwrap`` first) to check calls against,
# so the wrappers carry no ``__wrapped__`` and declare the carrier in ``__signature__``.


def modify_class_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``ray.actor._modify_class``: the actor's methods take the carrier."""
    modified = wrapped(*args, **kwargs)
    if groups.RAY not in groups.ENABLED:
        return modified
    try:
        _install_on_class(modified)
    except Exception as error:
        warn_once("ray:actor-class", "Ray actor %r runs untraced: %r", getattr(modified, "__name__", "?"), error)
    return modified


def _install_on_class(cls: Any) -> None:
    if not isinstance(cls, type) or "__ray_actor_class__" not in cls.__dict__ or INSTALLED in cls.__dict__:
        return
    missing: list = []  # one message per actor whose Python lacks our package
    ray_actor.install_init(cls, missing)  # the creation carrier (advice/ray_actor.py)
    for name in dir(cls):
        if name.startswith("__"):
            continue
        raw = inspect.getattr_static(cls, name)
        if not inspect.isfunction(raw) or inspect.isgeneratorfunction(raw) or inspect.isasyncgenfunction(raw):
            continue
        try:
            signature = signature_with_carrier(raw)
        except (TypeError, ValueError):
            continue
        if signature is None:
            warn_once(
                f"ray:collision:{_function_name(raw)}",
                "Ray actor method %s has a parameter named %s, which gym-autoinstr uses to carry trace "
                "context; calls to it run untraced. Rename the parameter to trace it.",
                _function_name(raw),
                CARRIER,
            )
            continue
        wrapper = carrier_wrapper(raw, missing)
        del wrapper.__wrapped__  # Ray unwraps before reading the signature
        wrapper.__signature__ = signature
        setattr(cls, name, wrapper)
    setattr(cls, INSTALLED, True)


@guarded_advice("ray:kill-flush", "could not have a Ray actor export its spans before ray.kill: %r", group=groups.RAY)
def kill_advice(instance: Any, args: tuple, kwargs: dict) -> None:
    """``ray.kill(actor)``: an actor whose methods we trace exports what it has ended
    first.  The kill itself is Ray's, unchanged, only later by at most the flush timeout
    (and a little for the round trip); an actor that cannot answer in time (busy, hung,
    gone) is killed when the wait runs out.  Called on an event loop (a coroutine of a Gym
    server), nothing waits: the flush is asked for and the kill sent right after it, which
    leaves the actor the few milliseconds the kill takes to reach it."""
    _flush_actor(args[0] if args else kwargs.get("actor"))


def _traced_actor(handle: Any) -> bool:
    signatures = getattr(handle, "_ray_method_signatures", None) or {}
    return any(
        getattr(parameter, "name", None) == CARRIER
        for signature in signatures.values()
        for parameter in (signature or ())
    )


def _flush_actor(handle: Any) -> None:
    import ray

    from gym_autoinstr.setup.flush import flush_timeout_seconds

    if not isinstance(handle, ray.actor.ActorHandle) or not _traced_actor(handle):
        return  # Ray client handles and actors we do not trace: the kill as ever
    call = getattr(handle, "__ray_call__", None)  # Ray releases before it lack this
    if call is None:
        return
    timeout = flush_timeout_seconds()
    answer = call.remote(_actor_flusher(timeout))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # never block an event loop: the flush is asked for, and the kill follows it at once
        return
    try:  # ray.get, not ray.wait: an answer that is an error (the actor died) counts as read
        ray.get(answer, timeout=timeout + 0.25)
    except Exception as error:  # busy, hung or dead already: killed as ever
        logger.debug("ray.kill: the actor did not flush (%r); killing it now", error)


def _actor_flusher(timeout: float) -> Any:
    # A closure, so cloudpickle sends it by value: the actor needs only the standard
    # library to run it, and a worker lacking our package just answers False.
    def flush_before_kill(actor_instance):  # type: ignore[no-untyped-def]
        try:
            from gym_autoinstr.setup.flush import flush
        except Exception:
            return False
        return flush(timeout, reason="ray.kill")

    return flush_before_kill


@_submission_advice("ray:actor-submit", "Ray actor call not traced: %r")
def actor_method_advice(instance: Any) -> tuple[str, dict] | None:
    """``ActorMethod._remote``: as for tasks, when the actor's class took the carrier."""
    signature = instance.__dict__.get("_signature") or ()
    if instance.__dict__.get("_is_generator") or not any(
        getattr(parameter, "name", None) == CARRIER for parameter in signature
    ):
        return None
    handle = instance.__dict__.get("_actor")
    descriptor = getattr(handle, "_ray_actor_creation_function_descriptor", None)
    class_name = getattr(descriptor, "class_name", None) or "actor"
    method = f"{class_name}.{instance.__dict__.get('_method_name', '?')}"
    attributes = {attr.RAY_TASK_FUNCTION: f"{getattr(descriptor, 'module_name', '?')}.{method}"}
    actor_id = getattr(handle, "_ray_actor_id", None)
    if actor_id is not None:
        attributes[attr.RAY_ACTOR_ID] = actor_id.hex()
    return method, attributes


# --- Ray client mode ----------------------------------------------------------------
#
# With ``ray.init("ray://...")`` a call goes through Ray's client stubs
# (``ray.util.client.common``): ``ClientRemoteMethod.remote`` for an actor method,
# ``ClientRemoteFunc.remote`` for a remote function declared after the connection, and
# ``OptionWrapper.remote`` after ``.options(...)``.  A stub whose signature takes the
# carrier (its actor class or function went through our advice before the connection)
# gets it here, unless it has it already (a ``RemoteFunction`` converted at its first
# call, whose own advice added it).  The worker's side is the same wrapper as ever.

CLIENT_UNTRACED_MESSAGE = (
    "Ray client mode (ray://): %s is a Ray client stub made without gym-autoinstr's carrier (by "
    "Ray's client API, or declared after ray.init connected), so its calls run untraced. Fix: "
    "declare remote functions and actor classes with ray.remote at import time, before ray.init "
    "(as Gym's own servers do)."
)


@_submission_advice("ray:client-submit", "Ray client call not traced: %r", stub=True)
def client_call_advice(instance: Any) -> tuple[str, dict] | None:
    """``ClientRemoteMethod.remote`` / ``ClientRemoteFunc.remote`` / ``OptionWrapper.remote``
    (Ray client mode): a PRODUCER span and the carrier, when the stub takes it."""
    stub = instance.__dict__.get("_remote_stub", instance)  # OptionWrapper: the stub it wraps
    kind = type(stub).__name__
    if kind not in ("ClientRemoteMethod", "ClientRemoteFunc"):
        return None
    signature = stub.__dict__.get("_signature")
    if signature is None or CARRIER not in signature.parameters:
        if kind == "ClientRemoteFunc":
            function = stub.__dict__.get("_func")
            if not str(getattr(function, "__module__", "")).startswith("ray."):  # Ray's own helpers
                warn_once(
                    f"ray:client-stub:{_function_name(function)}",
                    CLIENT_UNTRACED_MESSAGE,
                    f"remote function {_function_name(function)}",
                )
        else:
            # Methods we never wrap (dunders, static methods, generators) of an actor
            # class that took the carrier are not news; a class none of whose methods did is.
            handle = stub.__dict__.get("_actor_handle")
            signatures = getattr(handle, "__dict__", {}).get("_method_signatures") or {}
            if not any(CARRIER in getattr(s, "parameters", ()) for s in signatures.values()):
                method = stub.__dict__.get("_method_name", "?")
                warn_once("ray:client-stub:actor", CLIENT_UNTRACED_MESSAGE, f"the actor class of method {method!r}")
        return None
    if kind == "ClientRemoteFunc":
        function = stub.__dict__.get("_func")
        unwrapped = getattr(function, "__wrapped__", function)
        attributes = {attr.RAY_TASK_FUNCTION: _function_name(unwrapped)}
        name = getattr(unwrapped, "__qualname__", "?")
    else:
        # The client's actor handle knows its methods, not its class's name.
        name = stub.__dict__.get("_method_name", "?")
        attributes = {attr.RAY_TASK_FUNCTION: name}
        try:
            attributes[attr.RAY_ACTOR_ID] = stub.__dict__["_actor_handle"].actor_ref.id.hex()
        except Exception:
            pass
    return name, attributes


# --- the caller's side: a task's exception surfacing ------------------------------
#
# Ray raises a task's exception in the caller as ``RayTaskError(<Cause>)``, a subclass of
# both ``RayTaskError`` and the cause's class, made by ``RayTaskError.as_instanceof_cause``.
# ``ray.get`` (one ref or a list) calls that in the caller's own thread just before it
# raises: the span current there gets ERROR and ``error.type`` of the cause (pointcut
# ``ray.get_error``).  ``await ref`` builds its future in the awaiting coroutine
# (``asyncio.wrap_future(ref.future())``) but Ray settles it from its own thread, where no
# span is current: so the awaiter's current span is noted when the future is wrapped, and
# marked if the future ends with a task's exception (pointcut ``ray.await_error``).
# Nothing runs on the success path but a check; what the caller receives is untouched.


def task_error_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``RayTaskError.as_instanceof_cause``: the caller's current span is marked."""
    if groups.RAY not in groups.ENABLED:
        return wrapped(*args, **kwargs)
    surfaced = wrapped(*args, **kwargs)
    try:
        _mark_caller(trace.get_current_span(), instance)
    except Exception as error:
        warn_once("ray:get-error", "Ray task error not recorded on the caller's span: %r", error)
    return surfaced


def wrap_future_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``asyncio.wrap_future`` as Ray's ``ObjectRef.__await__`` calls it: the awaiter's span
    is marked if the ref's future ends with a task's exception."""
    if groups.RAY not in groups.ENABLED:
        return wrapped(*args, **kwargs)
    try:
        source = args[0] if args else kwargs.get("future")
        if getattr(source, "object_ref", None) is not None and hasattr(source, "add_done_callback"):
            span = trace.get_current_span()
            if span.is_recording():
                # Before asyncio chains its own callback: the span is marked before the
                # awaiter can resume (and end it).
                source.add_done_callback(functools.partial(_mark_on_task_error, span))
    except Exception as error:
        warn_once("ray:await-error", "Ray task errors at `await ref` not recorded: %r", error)
    return wrapped(*args, **kwargs)


def client_get_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Ray client mode's ``ray.get`` (``ray.util.client.worker.Worker.get``): the task's
    exception, unpickled and re-raised here in the caller's thread, marks its current span
    (``as_instanceof_cause`` ran on the client server, not here)."""
    if groups.RAY not in groups.ENABLED:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    except Exception as error:
        try:
            _mark_caller(trace.get_current_span(), error)
        except Exception as failure:
            warn_once("ray:client-get-error", "Ray task error not recorded on the caller's span: %r", failure)
        raise


def _mark_on_task_error(span: Any, future: Any) -> None:
    try:
        if future.cancelled():
            return
        error = future.exception(timeout=0)
        if error is not None:
            _mark_caller(span, error)
    except Exception:
        pass


def _mark_caller(span: Any, error: Any) -> None:
    from ray.exceptions import RayTaskError

    if not isinstance(error, RayTaskError) or not span.is_recording():
        return
    cause = getattr(error, "cause", None)
    mark_error(span, cause if isinstance(cause, BaseException) else error)
