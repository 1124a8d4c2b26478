"""Keep OpenTelemetry's start-up objects out of Gym's garbage collections.

By the time ``opentelemetry-instrument`` has loaded the SDK, the exporters and our
package, a Gym process holds several thousand more GC-tracked objects (modules,
classes, functions, the provider) than bare Gym would, all alive for the whole run.
Every full collection of Gym's large heap walks them again.  ``gc.freeze()`` at the end
of our start-up moves everything alive at that point into the permanent generation,
which collections skip; Gym has not imported anything yet, so none of Gym's own objects
are affected, and what Gym allocates afterwards is collected exactly as before.

On by default in Gym processes; ``GYM_AUTOINSTR_GC_FREEZE=0`` turns it off.  Nothing is
done when the collector is switched off.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from gym_autoinstr import settings
from gym_autoinstr._log import logger


@dataclass(slots=True)
class _Done:
    frozen: int = 0  # objects frozen at start-up (0: not yet, or nothing done)


_done = _Done()


def freeze_startup_heap() -> int:
    """Freeze what is alive now (once per process); returns how many objects were frozen."""
    if _done.frozen or not settings.GC_FREEZE.read():
        return 0
    if not gc.isenabled():
        return 0
    before = gc.get_freeze_count()
    gc.freeze()
    _done.frozen = gc.get_freeze_count() - before
    logger.debug("froze %d start-up objects out of garbage collection", _done.frozen)
    return _done.frozen
