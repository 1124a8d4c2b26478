"""Applying and removing pointcuts, reversibly and without ever raising into Gym.

A patch replaces one attribute with a wrapt ``FunctionWrapper`` around the original
(resolved through the class ``__dict__``, so classmethods stay classmethods; a
module-level function through a twin of it, see ``_answering_self``) and keeps the
original object, so that removing it restores Gym by identity.  Targets that other
modules copy by name (``from nemo_gym.server_utils import request``) are patched in a
post-import hook, which runs before any importer can bind the name; when we arrive
late (the module was imported before instrumentation), the copies already made are
found by identity and rebound, and each of them is restored on removal too.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

import wrapt

from gym_autoinstr import _footprint
from gym_autoinstr._log import logger, warn_once
from gym_autoinstr.pointcuts import Pointcut, ProcessPatch


@dataclass
class AppliedPatch:
    pointcut: Pointcut
    owner: Any  # the module or class holding the attribute
    name: str
    original: Any  # exactly what stood in owner.__dict__[name]
    wrapper: Any
    copies: list[tuple[ModuleType, str]] = field(default_factory=list)
    inherited: bool = False  # the original lives on a base class: removing deletes ours


class PatchSet:
    """The patches one instrumentor applied; thread-safe, idempotent per pointcut."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.applied: dict[str, AppliedPatch] = {}
        self.absent: dict[str, str] = {}  # pointcut name -> why it could not apply
        self.active = False

    # -- applying ---------------------------------------------------------------
    def apply(self, pointcut: Pointcut, module: ModuleType, *, late: bool) -> None:
        """Patch ``pointcut`` in ``module``; log once and carry on if it cannot be done."""
        with self._lock:
            if not self.active or pointcut.name in self.applied:
                return
            try:
                patch = _patch(pointcut, module)
            except _Absent as absent:
                self.absent[pointcut.name] = str(absent)
                if not pointcut.optional:
                    warn_once(
                        f"absent:{pointcut.name}",
                        "%s: %s.%s not found in this Gym (%s); skipping that seam, everything else is traced.",
                        pointcut.name,
                        pointcut.module,
                        pointcut.attribute,
                        absent,
                    )
                return
            except Exception as error:
                self.absent[pointcut.name] = f"failed: {error!r}"
                warn_once(
                    f"failed:{pointcut.name}",
                    "%s: patching %s.%s failed (%r); skipping that seam, Gym runs unchanged there.",
                    pointcut.name,
                    pointcut.module,
                    pointcut.attribute,
                    error,
                )
                return
            if late and pointcut.rebind_copies:
                _rebind_copies(patch)
            self.applied[pointcut.name] = patch
            logger.debug("applied %s to %s.%s", pointcut.name, pointcut.module, pointcut.attribute)

    # -- removing ---------------------------------------------------------------
    def remove_all(self) -> None:
        with self._lock:
            self.active = False
            for name in list(self.applied):
                patch = self.applied.pop(name)
                try:
                    if patch.inherited:
                        delattr(patch.owner, patch.name)
                    else:
                        setattr(patch.owner, patch.name, patch.original)
                    for module, attribute in patch.copies:
                        if getattr(module, attribute, None) is patch.wrapper:
                            setattr(module, attribute, _original_callable(patch))
                except Exception as error:
                    warn_once(f"unpatch:{name}", "could not remove %s: %r", name, error)
            self.absent.clear()


class _Absent(Exception):
    pass


def _resolve(module: ModuleType, path: str) -> tuple[Any, str, Any]:
    owner: Any = module
    parts = path.split(".")
    for part in parts[:-1]:
        # A module's own namespace, not getattr: a module-level __getattr__ (Gym uses
        # them for deprecated names) would hand us an object that lives elsewhere.
        namespace = vars(owner) if isinstance(owner, ModuleType) else None
        if namespace is not None and part not in namespace:
            raise _Absent(f"no {part!r} in {owner.__name__!r}")
        try:
            owner = namespace[part] if namespace is not None else getattr(owner, part)
        except AttributeError:
            raise _Absent(f"no {part!r} in {getattr(owner, '__name__', owner)!r}") from None
    name = parts[-1]
    if isinstance(owner, type):
        # Through the MRO's __dict__s, not getattr: keep the descriptor itself.
        for klass in owner.__mro__:
            if name in vars(klass):
                return owner, name, vars(klass)[name]
        raise _Absent(f"no attribute {name!r} on {owner.__name__}")
    if isinstance(owner, ModuleType):
        if name not in vars(owner):
            raise _Absent(f"no attribute {name!r} in {owner.__name__!r}")
        return owner, name, vars(owner)[name]
    if not hasattr(owner, name):
        raise _Absent(f"no attribute {name!r} in {getattr(owner, '__name__', owner)!r}")
    return owner, name, getattr(owner, name)


def _check_parameters(pointcut: Pointcut, original: Any) -> None:
    if not pointcut.parameters:
        return
    import inspect

    function = getattr(original, "__func__", original)  # classmethod / staticmethod
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin): trust the table
    missing = [p for p in pointcut.parameters if p not in names]
    if missing:
        raise _Absent(f"its signature changed: no parameter {', '.join(missing)} (has {', '.join(names)})")


def _patch(pointcut: Pointcut, module: ModuleType) -> AppliedPatch:
    owner, name, original = _resolve(module, pointcut.attribute)
    _check_parameters(pointcut, original)
    # A Ray worker's promotion wrapper (RAY_WORKER_POINTCUTS) is meant to be wrapped again.
    if getattr(original, "_self_gym_autoinstr", False) and not getattr(original, "_self_gym_autoinstr_stacks", False):
        raise RuntimeError("already wrapped by another gym-autoinstr instrumentor")
    wrapper = wrap(original, pointcut.advice, module_level=isinstance(owner, ModuleType))
    inherited = isinstance(owner, type) and name not in vars(owner)
    setattr(owner, name, wrapper)
    return AppliedPatch(pointcut, owner, name, original, wrapper, inherited=inherited)


def wrap(original: Any, advice: Any, *, module_level: bool) -> Any:
    """The wrapper a pointcut puts in place of ``original`` (also used by the benchmarks)."""
    wrapper = wrapt.FunctionWrapper(_answering_self(original) if module_level else original, advice)
    wrapper._self_gym_autoinstr = True
    return wrapper


def _answering_self(function: Any) -> Any:
    """For a module-level function: a twin that answers ``__self__`` with None.

    Called unbound, wrapt's wrapper asks what it wraps for ``__self__`` on every call
    (a bound method has one); a plain function has none, so each call raised and
    cleared an AttributeError, about half of what the egress costs with its group off.
    The twin shares the original's code, globals, defaults, closure and attributes, so
    it behaves as the original; Gym's own function is left as it was, and is what
    removing the patch restores.
    """
    if type(function) is not FunctionType or "__self__" in vars(function):
        return function
    twin = FunctionType(
        function.__code__, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    twin.__kwdefaults__ = function.__kwdefaults__
    for name in ("__module__", "__qualname__", "__doc__", "__annotations__", "__type_params__"):
        if hasattr(function, name):
            setattr(twin, name, getattr(function, name))
    twin.__dict__.update(vars(function))
    twin.__self__ = None
    return twin


def _original_callable(patch: AppliedPatch) -> Any:
    # Module-level copies hold the plain function, never a descriptor.
    return patch.original


def _rebind_copies(patch: AppliedPatch) -> None:
    """Late instrumentation: rebind ``from m import f`` copies made before we patched."""
    target = patch.original
    for module in list(sys.modules.values()):
        if module is None or module is patch.owner:
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for attribute, value in list(namespace.items()):
            if value is target:
                try:
                    setattr(module, attribute, patch.wrapper)
                    patch.copies.append((module, attribute))
                except Exception:
                    warn_once(
                        f"rebind:{module.__name__}.{attribute}",
                        "%s: could not rebind %s.%s; calls through it are not traced.",
                        patch.pointcut.name,
                        module.__name__,
                        attribute,
                    )
    if patch.copies:
        logger.debug(
            "%s: rebound %d copies made before instrumentation: %s",
            patch.pointcut.name,
            len(patch.copies),
            ", ".join(f"{m.__name__}.{a}" for m, a in patch.copies),
        )


# -- process-wide patches (pointcuts.PROCESS_PATCHES) -------------------------------------
# Applied where their moment comes, by name, through ``_footprint`` (code below the map
# cannot import this module); a row with a ``pointcut`` is applied by that row's PatchSet.


def restore_process_patches() -> list[str]:
    """Put back everything the ``PROCESS_PATCHES`` rows replaced in this process, by
    identity; a patch still in use by our pipeline is restored when that use ends.  The
    names of the rows restored now."""
    return _footprint.restore_all()


def applied_process_patches() -> dict[str, int]:
    """Row name -> how many of its patches are in place in this process."""
    return _footprint.applied()


def resolve_process_target(row: ProcessPatch) -> Any:
    """What ``row`` replaces as the installed libraries define it (a class for a row whose
    attribute is an instance attribute that the class's ``__init__`` sets); raises
    ``LookupError`` (``ImportError`` for a missing module) where it is absent."""
    import importlib

    owner: Any = importlib.import_module(row.module)
    *path, name = row.attribute.split(".")
    for part in path:
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise LookupError(f"no {part!r} in {getattr(owner, '__name__', owner)!r}") from None
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        init = getattr(owner.__init__, "__code__", None)
        if row.scope == "instances" and init is not None and name in init.co_names:
            return owner  # set on each instance by __init__
        raise LookupError(f"no attribute {name!r} on {owner.__name__}")
    if name not in vars(owner):
        raise LookupError(f"no attribute {name!r} in {getattr(owner, '__name__', owner)!r}")
    return vars(owner)[name]
