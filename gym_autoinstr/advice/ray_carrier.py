"""The carrier: the one keyword argument our trace context rides in, from a process that
submits a Ray task or creates a Ray actor to the worker that runs it (``ray_tasks.py``
for tasks and actor methods, ``ray_actor.py`` for an actor's creation).
"""

from __future__ import annotations

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
