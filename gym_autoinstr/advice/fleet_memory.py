"""Fleet memory (orchestrator, opt-in: ``GYM_AUTOINSTR_FLEET_MEMORY=true``): the
orchestrator observes ``gym.server.process_tree.memory.usage`` (By, by
``nemo.gym.server.name``), the resident memory of each server's whole process tree (the
shell Gym spawns, the server, its uvicorn workers and anything else it started), read
with psutil at collection time from the processes ``run_command`` returned
(``advice/startup.py`` hands them over).  RSS, not PSS: pages shared between a server's
processes count once per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.attributes import SERVER_NAME
from gym_autoinstr.telemetry import metrics

# server name -> (psutil.Process of what run_command spawned, attributes)
_spawned: dict[str, tuple[Any, dict[str, str]]] = {}


@dataclass(slots=True)
class _Memory:
    registered: bool = False  # the servers' memory gauge is registered


_memory = _Memory()
_lock = threading.Lock()


def memory_sampling_on() -> bool:
    return settings.FLEET_MEMORY.read()


def watch_server_memory(server_name: str | None, process: Any) -> None:
    """Observe the memory of a spawned server's process tree (opt-in; orchestrator)."""
    if not server_name or not metrics.LIVE or not memory_sampling_on():
        return
    pid = getattr(process, "pid", None)
    if not isinstance(pid, int):
        return
    try:
        import psutil

        with _lock:
            _spawned[server_name] = (psutil.Process(pid), {SERVER_NAME: server_name})
            if not _memory.registered:
                _memory.registered = True
                metrics.observable(
                    "gym.server.process_tree.memory.usage",
                    "up_down_counter",
                    _observe_memory,
                    "By",
                    "Resident memory of a Gym server's whole process tree (orchestrator, opt-in).",
                )
    except Exception as error:
        warn_once("fleet-memory", "server memory is not sampled: %r", error)


def _observe_memory(_options: Any) -> list[Any]:
    from opentelemetry.metrics import Observation

    points = []
    for root, attributes in list(_spawned.values()):
        try:
            total = 0
            for process in [root, *root.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except Exception:
                    continue  # ended between the listing and the read
            if total and root.is_running():  # 0: a tree already gone (its shell a zombie not yet reaped)
                points.append(Observation(total, attributes))
        except Exception:
            continue  # the server is gone: no point
    return points
