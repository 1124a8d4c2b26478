"""The record of the process-wide patches (``pointcuts.PROCESS_PATCHES``) made in this process.

A pointcut row is applied by ``patching.PatchSet``; the rows of ``PROCESS_PATCHES`` are
applied where their moment comes (the pipeline's construction, Gym's client session, a
server about to serve), by code below the map that cannot import it.  They apply through
here, by row name, and each application leaves a handle: what stood there before, what
replaced it, or how to undo it.  ``restore_all()`` (``GymInstrumentor.uninstrument()``,
through ``patching.restore_process_patches``) puts every original back by identity.

A handle may be *busy*: its patch is still needed by something of ours that outlives
instrumentation (the OTLP exporter module's ``encode_spans`` while one of our encoding
span processors is exporting through it).  Its restore then waits until that is over
(``restore_pending()``, called when it ends).

Nothing here runs per request or per span: a patch is applied once per target object.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from gym_autoinstr._log import logger, warn_once

_MISSING = object()  # the attribute was not in the owner's own __dict__ (an instance attribute we added)


class Handle:
    """One application of a ``PROCESS_PATCHES`` row."""

    __slots__ = ("name", "_owner", "attribute", "original", "replacement", "undo", "busy", "on_restore", "pending")

    def __init__(
        self,
        name: str,
        owner: Any = None,
        attribute: str | None = None,
        original: Any = _MISSING,
        replacement: Any = None,
        undo: Callable[[], None] | None = None,
        busy: Callable[[], bool] | None = None,
        on_restore: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self._owner = _reference(owner) if owner is not None else None
        self.attribute = attribute
        self.original = original
        self.replacement = replacement
        self.undo = undo
        self.busy = busy
        self.on_restore = on_restore  # the applier's own bookkeeping, after the restore
        self.pending = False  # restore asked for while busy

    @property
    def owner(self) -> Any:
        return self._owner() if self._owner is not None else None

    def alive(self) -> bool:
        return self._owner is None or self._owner() is not None

    def restore(self) -> None:
        if self.undo is not None:
            self.undo()
            return
        owner = self.owner
        if owner is None or self.attribute is None:
            return  # the object is gone: nothing left to restore
        current = vars(owner).get(self.attribute, _MISSING)
        if current is not self.replacement:
            logger.debug("%s: %r.%s was replaced again since; left as it is", self.name, owner, self.attribute)
            return
        if self.original is _MISSING:
            _delete(owner, self.attribute)
        else:
            _set(owner, self.attribute, self.original)


_lock = threading.RLock()
_handles: list[Handle] = []


def _reference(owner: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(owner)  # Gym's session and connector: not kept alive by us
    except TypeError:
        return lambda: owner  # a module


def _set(owner: Any, attribute: str, value: Any) -> None:
    if isinstance(owner, type):
        setattr(owner, attribute, value)
    else:
        # past a class's own __setattr__ (aiohttp's ClientSession warns in debug mode)
        object.__setattr__(owner, attribute, value)


def _delete(owner: Any, attribute: str) -> None:
    if isinstance(owner, type):
        delattr(owner, attribute)
    else:
        object.__delattr__(owner, attribute)


def apply(
    name: str,
    owner: Any,
    attribute: str,
    replacement: Any,
    *,
    busy: Callable[[], bool] | None = None,
    on_restore: Callable[[], Any] | None = None,
) -> Handle:
    """Set ``owner.attribute`` to ``replacement`` for the row ``name``, keeping what was there."""
    with _lock:
        original = vars(owner).get(attribute, _MISSING)
        handle = Handle(name, owner, attribute, original, replacement, busy=busy, on_restore=on_restore)
        _set(owner, attribute, replacement)
        _handles[:] = [h for h in _handles if h.alive()]
        _handles.append(handle)
        return handle


def record(name: str, undo: Callable[[], Any], *, owner: Any = None) -> Handle:
    """A patch of the row ``name`` made by its own code, undone by ``undo``.  Without an
    ``owner``, once per name until restored (a class swap applied to objects found over
    time); with one, once per application, forgotten when the owner is gone."""
    with _lock:
        if owner is None:
            for handle in _handles:
                if handle.name == name and handle.undo is not None and not handle.pending:
                    return handle
        handle = Handle(name, owner, undo=undo)
        _handles[:] = [h for h in _handles if h.alive()]
        _handles.append(handle)
        return handle


def discard(name: str) -> None:
    """Forget the records of ``name`` (its own code restored it)."""
    with _lock:
        _handles[:] = [h for h in _handles if h.name != name]


def applied() -> dict[str, int]:
    """Row name -> how many of its patches are in place in this process."""
    with _lock:
        counts: dict[str, int] = {}
        for handle in _handles:
            if handle.alive():  # a pending one is still in place
                counts[handle.name] = counts.get(handle.name, 0) + 1
        return counts


def restore_all() -> list[str]:
    """Restore every recorded patch, newest first; a busy one is left pending.  Returns the
    names of the rows restored now."""
    return _restore(lambda handle: True)


def restore_pending() -> list[str]:
    """Restore the patches left pending whose owner is no longer busy."""
    return _restore(lambda handle: handle.pending)


def _restore(selected: Callable[[Handle], bool]) -> list[str]:
    restored = []
    with _lock:
        for handle in reversed(list(_handles)):
            if not selected(handle):
                continue
            try:
                if handle.busy is not None and handle.busy():
                    handle.pending = True
                    continue
                handle.restore()
                if handle.on_restore is not None:
                    handle.on_restore()
                restored.append(handle.name)
            except Exception as error:  # never raise into the caller (uninstrument, an exporter's shutdown)
                warn_once(f"restore:{handle.name}", "could not restore %s: %r", handle.name, error)
            _handles.remove(handle)
    return restored
