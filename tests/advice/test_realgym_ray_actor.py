"""Gym inside a Ray actor, as NeMo RL runs it (issue 16): the actor is Gym's orchestrator.

One two-node Ray cluster (started under ``opentelemetry-instrument``, on loopback, so its
daemons and workers inherit the sitecustomize) and one collector serve the module.  A
driver under ``opentelemetry-instrument`` (``tests/ray_actor/driver.py``) does what NeMo
RL's ``NemoGym`` actor does with Gym's real API: two actors, one per node, each start
their own example trio from inside the actor (``RunHelper().start(...)`` with
``ray_head_node_address`` set to this cluster, its own head-server port, Gym's aiohttp
limits raised) and collect rollouts with ``run_examples``:

* shard ``shard-a`` (node 0): a batch with nothing upstream, then a batch with the
  driver's span handed over in an explicit carrier (NeMo RL's decorator);
* shard ``shard-b`` (node 1): an embedder that set up its own tracer provider and the
  contrib aiohttp-client instrumentor in the actor first, and opens its own span around
  the batch, under the driver's span.

The venv is the generic-stack one ``test_realgym_coexistence`` builds anyway (for the
aiohttp-client instrumentor); contrib's automatic instrumentation is switched off, so the
instrumentor runs only where the embedder installs it.  Server venvs are reused
(``skip_venv_if_present``); that a promoted actor's ``GlobalConfigDictParser.parse`` adds
our packages to the venvs Gym builds is checked in-process
(``tests/advice/test_ray_actor.py``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import psutil
import pytest

from tests.harness.collector import Collector
from tests.harness.gym_install import gym_venv
from tests.harness.ray_cluster import RayCluster
from tests.harness.traces import otel_env, service_of
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio, PolicyModel

pytestmark = pytest.mark.realgym

DRIVER = pathlib.Path(__file__).resolve().parent.parent / "ray_actor" / "driver.py"
VERSION = "0.4.0"
GENERIC_STACK = [
    "opentelemetry-distro",
    "opentelemetry-instrumentation-fastapi",
    "opentelemetry-instrumentation-aiohttp-client",
]
# ours, explicitly (the generic stack's distro is installed too); contrib's automatic
# instrumentation off everywhere: only the embedder's actor installs aiohttp-client's.
SELECTION = {
    "OTEL_PYTHON_DISTRO": "gym_autoinstr",
    "OTEL_PYTHON_CONFIGURATOR": "gym_autoinstr",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "aiohttp-client,fastapi",
}
ORCHESTRATOR = "nemo-gym/orchestrator"
EMBEDDER = "embedder-trainer"
SERVERS = {f"nemo-gym/{name}" for name in (AGENT, MODEL, RESOURCES)}
N = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    venv = gym_venv(VERSION, extra=GENERIC_STACK)
    started = time.monotonic()
    root = tmp_path_factory.mktemp("rayactor")
    with Collector(log_dir=root / "collector") as collector, PolicyModel() as policy:
        env = {**otel_env(collector, "http/protobuf"), **SELECTION, "OTEL_BSP_SCHEDULE_DELAY": "500"}
        cluster = RayCluster(venv, root / "ray", env, num_cpus=1)
        with cluster.start(nodes=2):
            shards = []
            for index, (name, embedder, runs) in enumerate((
                ("shard-a", False, [{"n": N, "carrier": False}, {"n": N, "carrier": True}]),
                ("shard-b", True, [{"n": N, "carrier": True}]),
            )):
                trio = GymTrio(venv, VERSION, root / name, policy.url)
                trio.prepare()
                config = trio.build_config()
                config.update({
                    "skip_venv_if_present": True,
                    "ray_head_node_address": cluster.address,
                    "global_aiohttp_connector_limit_per_host": 16384,
                    "global_aiohttp_connector_limit": 16384,
                })
                row = dict(trio.default_row(), agent_ref={"type": "responses_api_agents", "name": AGENT})
                shards.append({"name": name, "node": f"node{index}", "workdir": str(trio.workdir),
                               "config": config, "embedder": embedder, "runs": runs, "rows": [row] * N})
            spec = root / "spec.json"
            spec.write_text(json.dumps({"shards": shards}))
            denv = {k: v for k, v in os.environ.items()
                    if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "RAY_", "NEMO_GYM_", "VIRTUAL_ENV", "PYTHON"))}
            denv.update(env)
            denv.update({"RAY_AUTH_MODE": "disabled", "PATH": f"{venv / 'bin'}{os.pathsep}{denv.get('PATH', '')}"})
            result = subprocess.run(
                [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"), str(DRIVER),
                 cluster.address, str(spec)],
                env=denv, capture_output=True, text=True, timeout=900, cwd=root,
            )
            lines = [line for line in result.stdout.splitlines() if line.startswith("DRIVER-RESULT ")]
            servers = set()
            if lines:
                out = json.loads(lines[-1][len("DRIVER-RESULT "):])
                servers = {pid for shard in out["shards"].values() for pid in shard["where"]["servers"]}
            try:
                assert result.returncode == 0 and lines, (
                    f"driver failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}\n"
                    + cluster.log_tail())
                expected = 2 * N + N  # gym.job's rollouts, both shards
                collector.sink.wait_for(
                    lambda spans: len([s for s in spans if s["name"] == "POST /run" and s["kind"] == "SERVER"]) >= expected,
                    timeout=120)
                time.sleep(3)  # the servers' last batches (500 ms schedule)
                daemons = {p.pid for p in cluster.processes() if not _is_worker(p)}
            finally:
                _kill_tree(servers)
    return {"out": out, "spans": collector.sink.spans(), "daemons": daemons, "bodies": collector.sink.raw_bodies(),
            "seconds": time.monotonic() - started}


def _is_worker(process: psutil.Process) -> bool:
    try:
        return any(arg.endswith("/ray/_private/workers/default_worker.py") for arg in process.cmdline()[:4])
    except psutil.Error:
        return False


def _kill_tree(pids: set) -> None:
    # Gym's own shutdown ran in the actor; whatever of its servers is left, we started.
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for child in process.children(recursive=True) + [process]:
                child.kill()
        except psutil.Error:
            continue


def _jobs(run: dict, shard: str) -> list[dict]:
    return sorted((s for s in run["spans"] if s["name"] == "gym.job" and s["resource"].get("nemo.gym.shard") == shard),
                  key=lambda s: s["start_ns"])


def _rollouts_under(run: dict, job: dict) -> list[dict]:
    """The CLIENT spans for /run that the job parents, each checked whole down to the servers."""
    spans = [s for s in run["spans"] if s["trace_id"] == job["trace_id"]]
    by_id = {s["span_id"]: s for s in spans}
    clients = [s for s in spans if s["kind"] == "CLIENT" and s["parent_span_id"] == job["span_id"]
               and s["attributes"]["url.full"].endswith("/run")]
    for client in clients:
        (server,) = [s for s in spans if s["parent_span_id"] == client["span_id"]]
        assert server["kind"] == "SERVER" and server["name"] == "POST /run"
        assert service_of(server) == f"nemo-gym/{AGENT}"
        # the whole rollout below it: agent, model and resources servers all took part
        below, frontier = set(), [server["span_id"]]
        while frontier:
            current = frontier.pop()
            for span in spans:
                if span["parent_span_id"] == current and span["span_id"] not in below:
                    below.add(span["span_id"])
                    frontier.append(span["span_id"])
        assert {service_of(by_id[i]) for i in below} >= SERVERS
        for i in below:
            assert by_id[i]["resource"].get("nemo.gym.shard") == job["resource"]["nemo.gym.shard"]
            assert by_id[i]["resource"]["nemo.gym.run.id"] == job["resource"]["nemo.gym.run.id"]
    return clients


def test_the_actor_is_gym_orchestrator_with_actor_shard_and_node(run):
    where = run["out"]["shards"]["shard-a"]["where"]
    assert run["out"]["shards"]["shard-a"]["runs"][0]["rewards"] == [1.0] * N
    first = _jobs(run, "shard-a")[0]
    resource = first["resource"]
    assert service_of(first) == ORCHESTRATOR
    assert resource["nemo.gym.process.role"] == "orchestrator"
    assert resource["process.pid"] == where["pid"] != run["out"]["driver_pid"]
    assert resource["ray.actor.id"] == where["actor"]
    assert resource["ray.actor.name"] == "shard-a"
    assert resource["ray.node.id"] == where["node"]
    assert resource["nemo.gym.version"] == VERSION
    # nothing upstream: the job is the root of its trace, and parents every rollout
    assert first["parent_span_id"] is None
    assert len(_rollouts_under(run, first)) == N


def test_a_span_the_driver_hands_to_the_actor_parents_the_job(run):
    shard = run["out"]["shards"]["shard-a"]
    assert shard["runs"][1]["rewards"] == [1.0] * N
    trace_id, span_id = shard["runs"][1]["driver_span"]
    (driver_span,) = [s for s in run["spans"] if s["span_id"] == span_id]
    assert driver_span["name"] == "driver.step" and driver_span["trace_id"] == trace_id
    jobs = [j for j in _jobs(run, "shard-a") if j["parent_span_id"] == span_id]
    assert len(jobs) == 1 and jobs[0]["trace_id"] == trace_id
    assert len(_rollouts_under(run, jobs[0])) == N
    assert len(_jobs(run, "shard-a")) == 2  # one per batch, nothing doubled


def test_an_embedders_provider_and_aiohttp_instrumentor_in_the_actor_are_adopted_not_doubled(run):
    shard = run["out"]["shards"]["shard-b"]
    assert shard["runs"][0]["rewards"] == [1.0] * N
    assert shard["where"]["provider"] == "opentelemetry.sdk.trace"
    trace_id, span_id = shard["runs"][0]["driver_span"]
    (outer,) = [s for s in run["spans"] if s["name"] == "rl.gym.run_rollouts"]
    assert outer["parent_span_id"] == span_id and outer["trace_id"] == trace_id
    (job,) = _jobs(run, "shard-b")
    assert job["parent_span_id"] == outer["span_id"]
    # one provider in the actor: the embedder's, carrying our identity beside its name
    assert job["resource"] == outer["resource"]
    assert service_of(job) == EMBEDDER
    assert job["resource"]["nemo.gym.process.role"] == "orchestrator"
    assert job["resource"]["process.pid"] == shard["where"]["pid"]
    # one CLIENT span per request, and the server's parent is it (one traceparent)
    assert len(_rollouts_under(run, job)) == N
    actor_spans = [s for s in run["spans"] if s["resource"].get("process.pid") == shard["where"]["pid"]]
    clients = [s for s in actor_spans if s["kind"] == "CLIENT"]
    assert clients and all(s["scope"] == "gym_autoinstr" for s in clients)
    assert len([s for s in clients if s["attributes"]["url.full"].endswith("/run")]) == N


def test_two_shards_on_two_nodes_are_two_fleets_told_apart(run):
    a, b = run["out"]["shards"]["shard-a"]["where"], run["out"]["shards"]["shard-b"]["where"]
    assert a["node"] != b["node"]
    (job_b,) = _jobs(run, "shard-b")
    job_a = _jobs(run, "shard-a")[0]
    assert job_a["resource"]["ray.node.id"] == a["node"] and job_b["resource"]["ray.node.id"] == b["node"]
    assert job_a["resource"]["nemo.gym.run.id"] != job_b["resource"]["nemo.gym.run.id"]
    for shard in ("shard-a", "shard-b"):
        servers = {service_of(s) for s in run["spans"] if s["resource"].get("nemo.gym.shard") == shard
                   and s["resource"].get("nemo.gym.process.role") == "server"}
        assert servers == SERVERS, shard


def test_ray_daemons_and_idle_workers_export_nothing(run):
    spans = run["spans"]
    assert {service_of(s) for s in spans} <= {ORCHESTRATOR, EMBEDDER, "nemo-gym/driver", *SERVERS}
    assert run["daemons"]
    assert not {s["resource"].get("process.pid") for s in spans} & run["daemons"]
    actors = {shard["where"]["pid"] for shard in run["out"]["shards"].values()}
    ray_pids = {s["resource"]["process.pid"] for s in spans if "ray.node.id" in s["resource"]}
    assert ray_pids == actors
