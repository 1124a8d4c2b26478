"""Ports for servers that another process binds later.

A port found by binding port 0 comes from the kernel's ephemeral range, and is
released before the server that is to use it starts. In that gap anything else
that binds port 0 can take it: Ray picks its GCS, raylet and object-manager ports
that way, and ``gym env start`` starts Ray *while* it spawns the servers whose
ports the harness chose (a CI run lost ``policy_model`` to Ray's GCS on the same
port). So the ports handed out here come from outside the ephemeral range and
outside the worker-port ranges Ray uses (10002-19999 by default, 20000-29999 in
``ray_cluster``), picked at random, checked free by binding, and never handed out
twice by one process.  Under pytest-xdist each worker draws from its own share of them
(``share``), so two workers never pick the same port in the gap either.
"""

from __future__ import annotations

import os
import random
import socket
import threading

_RAY_WORKER_PORTS_END = 30000  # Ray's default worker ports and ray_cluster's end below this
_given: set[int] = set()
_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


SHARE_VARIABLE = "GYM_TEST_PORT_SHARE"  # "index/count": a pytest run inside a test (its share, subdivided)


def share() -> tuple[int, int]:
    """(index, count): this process takes the ports ``p`` with ``p % count == index``.  A
    pytest-xdist worker takes its own share of the share its session was given; (0, 1) alone."""
    index, count = 0, 1
    outer = os.environ.get(SHARE_VARIABLE, "")
    outer_index, _, outer_count = outer.partition("/")
    if outer_index.isdigit() and outer_count.isdigit() and 0 <= int(outer_index) < int(outer_count):
        index, count = int(outer_index), int(outer_count)
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 0:
        index, count = index + count * (int(worker[2:]) % int(workers)), count * int(workers)
    return index, count


def _candidates() -> list[int]:
    lo, hi = _ephemeral_range()
    index, count = share()
    return [p for p in range(_RAY_WORKER_PORTS_END, 65536) if not lo <= p <= hi and p % count == index]


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports, free right now, that nothing binding port 0 will take."""
    candidates = _candidates()
    out: list[int] = []
    with _lock:
        if len(candidates) >= 64:
            for port in random.sample(candidates, len(candidates)):
                if len(out) == n:
                    break
                if port not in _given and _bindable(port, host):
                    out.append(port)
        # a machine whose ephemeral range covers everything: fall back to port 0
        while len(out) < n:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in out:
                out.append(port)
        _given.update(out)
    return out


def reserve_port(host: str = "127.0.0.1") -> int:
    return reserve_ports(1, host)[0]
