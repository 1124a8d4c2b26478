"""The carrier: the one keyword argument our trace context rides in, from a process that
submits a Ray task or creates a Ray actor to the worker that runs it (``ray_tasks.py``
for tasks and actor methods, ``ray_actor.py`` for an actor's creation), and the stand-in
Ray pickles in place of the function, which takes it off again in the worker.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

CARRIER = "_gym_autoinstr_ctx"


def call_parts(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    # RemoteFunction._remote(self, args=None, kwargs=None, **task_options); Ray passes
    # both by keyword, older callers positionally.
    call_args = kwargs["args"] if "args" in kwargs else (args[0] if args else None)
    call_kwargs = kwargs["kwargs"] if "kwargs" in kwargs else (args[1] if len(args) > 1 else None)
    return call_args, call_kwargs


def with_call_kwargs(args: tuple, kwargs: dict, call_kwargs: dict) -> tuple[tuple, dict]:
    if "kwargs" in kwargs or len(args) < 2:
        kwargs = dict(kwargs)
        kwargs["kwargs"] = call_kwargs
        return args, kwargs
    return (args[0], call_kwargs) + tuple(args[2:]), kwargs


def signature_with_carrier(function: Any) -> inspect.Signature | None:
    signature = inspect.signature(function)
    if CARRIER in signature.parameters:
        return None
    parameters = list(signature.parameters.values())
    carrier = inspect.Parameter(CARRIER, inspect.Parameter.KEYWORD_ONLY, default=None)
    position = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        position -= 1
    parameters.insert(position, carrier)
    return signature.replace(parameters=parameters)


def stand_in(function: Any, missing: list | None = None, *, runner: str, text: str) -> Any:
    """The function Ray pickles and runs instead of ``function``: it takes the carrier off
    and, where gym-autoinstr imports, calls ``runner(function, args, kwargs, carrier)``
    (``runner``: ``module.name``, ``+ "_async"`` for a coroutine function); where it does
    not, calls ``function`` and prints ``text`` once (``missing``: shared by the stand-ins
    of one actor class).  Pickled by value (a closure is never found under its name in a
    module): its code reads only builtins, its closure, and modules it imports itself."""
    missing = [] if missing is None else missing  # per worker process, after unpickling: said once
    module, _, name = (runner + "_async" if inspect.iscoroutinefunction(function) else runner).rpartition(".")

    def runner_here():  # type: ignore[no-untyped-def]
        try:
            return getattr(__import__(module, fromlist=[name]), name)
        except Exception:
            if not missing:
                missing.append(1)
                import sys

                print(text, file=sys.stderr, flush=True)
            return None

    if inspect.iscoroutinefunction(function):

        async def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            carrier = kwargs.pop("_gym_autoinstr_ctx", None)
            run = None if carrier is None else runner_here()
            if run is not None:
                return await run(function, args, kwargs, carrier)
            return await function(*args, **kwargs)

    else:

        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            carrier = kwargs.pop("_gym_autoinstr_ctx", None)
            run = None if carrier is None else runner_here()
            if run is not None:
                return run(function, args, kwargs, carrier)
            return function(*args, **kwargs)

    return functools.wraps(function)(wrapper)
