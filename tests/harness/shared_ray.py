"""A Ray cluster the session's Gym fleets join instead of each starting its own.

Every ``gym env start`` without ``ray_head_node_address`` starts a Ray head of its own:
GCS, raylet, dashboard, dashboard agent, runtime-env agent, log and autoscaler monitors
and two prestarted idle workers, about a third of a fleet's CPU to get ready on two
cores.  Trios whose tests are not about Ray join one cluster per Python and Ray version
instead (Gym's own ``ray_head_node_address`` setting, as a user with a running cluster
sets it): every server still connects to a real Ray as a driver, only the head is not
started and stopped per fleet.  ``GymTrio(own_ray=True)`` keeps Gym's own start.

The cluster is started on first use (``address_for``), not under
``opentelemetry-instrument``, without the dashboard, and stopped at the end of the
session (``stop_all``, called by tests/conftest.py; at exit otherwise).
"""

from __future__ import annotations

import atexit
import pathlib
import re
import shutil
import tempfile
import threading

from tests.harness.ray_cluster import RayCluster

_clusters: dict[tuple[str, str], RayCluster] = {}
_lock = threading.Lock()


def _key(venv: pathlib.Path) -> tuple[str, str]:
    """(Python X.Y, Ray version) of ``venv``: a driver joins only a cluster of both."""
    config = (venv / "pyvenv.cfg").read_text()
    match = re.search(r"^version(?:_info)?\s*=\s*(\d+\.\d+)", config, re.M)
    python = match.group(1) if match else "?"
    found = sorted(venv.glob("lib/python3*/site-packages/ray-*.dist-info"))
    if not found:
        raise RuntimeError(f"no Ray in {venv}: Gym always installs it")
    return python, found[0].name[len("ray-") : -len(".dist-info")]


def address_for(venv: pathlib.Path | str) -> str:
    """The GCS address of the session's cluster for ``venv``'s Python and Ray, started now if needed."""
    venv = pathlib.Path(venv)
    key = _key(venv)
    with _lock:
        cluster = _clusters.get(key)
        if cluster is None:
            workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"gar-shared-ray-{key[0]}-"))
            # no idle workers waiting for tasks the example trio never sends
            quiet = {"RAY_enable_worker_prestart": "false", "RAY_prestart_worker_first_driver": "false"}
            cluster = RayCluster(venv, workdir, quiet, num_cpus=2, instrument=False).start()
            _clusters[key] = cluster
        return cluster.address


def stop_all() -> None:
    with _lock:
        while _clusters:
            _, cluster = _clusters.popitem()
            cluster.stop()
            shutil.rmtree(cluster.workdir, ignore_errors=True)


atexit.register(stop_all)
