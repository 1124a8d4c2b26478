"""Fleet advice (orchestrator): ``gym.servers.active`` follows Gym's own start and stop.

``RunHelper.wait_for_spinup`` returning means every configured server answered; after
``RunHelper.shutdown`` none is left, and a flush exports that 0 before the process ends.
The memory of each server's process tree (opt-in) is ``advice/fleet_memory.py``.
"""

from __future__ import annotations

from typing import Any

from gym_autoinstr.advice import startup
from gym_autoinstr.telemetry.metrics import set_servers_active


def servers_ready_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``RunHelper.wait_for_spinup`` returns: every configured server is up (and
    ``gym.startup`` ends)."""
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as error:
        startup.spinup_done(error)
        raise
    startup.spinup_done()
    configs = getattr(instance, "_server_instance_display_configs", None)
    if configs is not None:
        set_servers_active(len(configs))
    return result


def fleet_shutdown_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``RunHelper.shutdown``: no server left; flush so the 0 is exported."""
    try:
        return wrapped(*args, **kwargs)
    finally:
        set_servers_active(0)
        from gym_autoinstr.setup.flush import flush

        flush(reason="gym shutdown")
