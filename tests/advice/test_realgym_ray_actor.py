"""Gym inside a Ray actor, as NeMo RL runs it (issue 16): the actor is Gym's orchestrator.

One two-node Ray cluster (started under ``opentelemetry-instrument``, on loopback, so its
daemons and workers inherit the sitecustomize) and one collector serve the module.  A
driver under ``opentelemetry-instrument`` (``tests/fixtures/ray_actor/driver.py``) does what NeMo
RL's ``NemoGym`` actor does with Gym's real API: two actors, one per node, each start
their own example trio from inside the actor (``RunHelper().start(...)`` with
``ray_head_node_address`` set to this cluster, its own head-server port, Gym's aiohttp
limits raised) and collect rollouts with ``run_examples``:

* shard ``shard-a`` (node 0), an actor whose ``runtime_env`` replaces ``PYTHONPATH`` (no
  ``opentelemetry-instrument`` sitecustomize in it: only the creation carrier prepares
  it): a batch with nothing upstream, a batch with the driver's span handed over in an
  explicit carrier (NeMo RL's decorator), a batch called inside a driver span carried by
  our own Ray propagation alone;
* shard ``shard-b`` (node 1): an embedder that set up its own tracer provider and the
  contrib aiohttp-client instrumentor in the actor first, and opens its own span around
  the batch, under the driver's span.

Gym 0.4.0 and 0.7.0.  On 0.4.0 the venv is the generic-stack one
``test_realgym_coexistence`` builds anyway (for the aiohttp-client instrumentor);
contrib's automatic instrumentation is switched off, so the instrumentor runs only where
the embedder installs it.  On 0.7.0 the plain venv is used (no second venv build for CI):
the embedder brings its own provider but no aiohttp-client instrumentor.  Server venvs are reused
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
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, RESOURCES, GymTrio, PolicyModel

pytestmark = pytest.mark.realgym

DRIVER = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_actor" / "driver.py"
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
N = 3


def gym_services(version: str) -> set:
    names = (AGENT, MODEL, RESOURCES) + ((ENVIRONMENT,) if version >= "0.7" else ())
    return {f"nemo-gym/{name}" for name in names}


@pytest.fixture(scope="module", params=["0.4.0", "0.7.0"])
def run(request, tmp_path_factory):
    version = request.param
    aiohttp = version == "0.4.0"  # the generic-stack venv is built for 0.4.0 only
    venv = gym_venv(version, extra=GENERIC_STACK) if aiohttp else gym_venv(version)
    started = time.monotonic()
    root = tmp_path_factory.mktemp("rayactor")
    with Collector(log_dir=root / "collector") as collector, PolicyModel() as policy:
        env = {**otel_env(collector, "http/protobuf"), **SELECTION, "OTEL_BSP_SCHEDULE_DELAY": "500"}
        cluster = RayCluster(venv, root / "ray", env, num_cpus=1)
        with cluster.start(nodes=2):
            shards = []
            replaced = root / "replaced-pythonpath"
            replaced.mkdir()
            for index, (name, embedder, runs, runtime_env) in enumerate(
                (
                    (
                        "shard-a",
                        False,
                        [
                            {"n": N, "carrier": False},
                            {"n": N, "carrier": True},
                            {"n": N, "carrier": False, "span": True},
                        ],
                        {"env_vars": {"PYTHONPATH": str(replaced)}},
                    ),
                    ("shard-b", True, [{"n": N, "carrier": True}], None),
                )
            ):
                trio = GymTrio(venv, version, root / name, policy.url)
                trio.prepare()
                config = trio.build_config()
                config.update(
                    {
                        "skip_venv_if_present": True,
                        "ray_head_node_address": cluster.address,
                        "global_aiohttp_connector_limit_per_host": 16384,
                        "global_aiohttp_connector_limit": 16384,
                    }
                )
                row = dict(trio.default_row(), agent_ref={"type": "responses_api_agents", "name": AGENT})
                shards.append(
                    {
                        "name": name,
                        "node": f"node{index}",
                        "workdir": str(trio.workdir),
                        "config": config,
                        "embedder": embedder,
                        "aiohttp": aiohttp,
                        "runs": runs,
                        "rows": [row] * N,
                        "runtime_env": runtime_env,
                    }
                )
            spec = root / "spec.json"
            spec.write_text(json.dumps({"shards": shards}))
            denv = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "RAY_", "NEMO_GYM_", "VIRTUAL_ENV", "PYTHON"))
            }
            denv.update(env)
            denv.update({"RAY_AUTH_MODE": "disabled", "PATH": f"{venv / 'bin'}{os.pathsep}{denv.get('PATH', '')}"})
            result = subprocess.run(
                [
                    str(venv / "bin" / "opentelemetry-instrument"),
                    str(venv / "bin" / "python"),
                    str(DRIVER),
                    cluster.address,
                    str(spec),
                ],
                env=denv,
                capture_output=True,
                text=True,
                timeout=900,
                cwd=root,
            )
            lines = [line for line in result.stdout.splitlines() if line.startswith("DRIVER-RESULT ")]
            spawned = set()
            if lines:
                out = json.loads(lines[-1][len("DRIVER-RESULT ") :])
                spawned = {pid for shard in out["shards"].values() for pid in shard["where"]["servers"]}
            try:
                assert result.returncode == 0 and lines, (
                    f"driver failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}\n"
                    + cluster.log_tail()
                )
                expected = 3 * N + N  # every rollout, both shards
                collector.sink.wait_for(
                    lambda spans: (
                        len([s for s in spans if s["name"] == "POST /run" and s["kind"] == "SERVER"]) >= expected
                    ),
                    timeout=120,
                )
                time.sleep(3)  # the servers' last batches (500 ms schedule)
                # (an actor's process is a worker whatever its title: Ray renames a busy
                # worker's command line to "ray::<actor>", and on a loaded machine the
                # shards' actors may still be winding down here)
                actors = {shard["where"]["pid"] for shard in out["shards"].values()}
                daemons = {p.pid for p in cluster.processes() if not _is_worker(p)} - actors
            finally:
                _kill_tree(spawned)
    return {
        "out": out,
        "spans": collector.sink.spans(),
        "daemons": daemons,
        "version": version,
        "aiohttp": aiohttp,
        "replaced": str(replaced),
        "entry": f"nemo-gym/{ENVIRONMENT if version >= '0.7' else AGENT}",
        "servers": gym_services(version),
        "seconds": time.monotonic() - started,
    }


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


def _runs(run: dict, shard: str) -> list[dict]:
    """The actor's CLIENT spans for ``/run``: one per rollout it dispatched, in start order."""
    pid = run["out"]["shards"][shard]["where"]["pid"]
    return sorted(
        (
            s
            for s in run["spans"]
            if s["kind"] == "CLIENT"
            and s["attributes"]["url.full"].endswith("/run")
            and s["resource"].get("process.pid") == pid
        ),
        key=lambda s: s["start_ns"],
    )


def _assert_whole(run: dict, client: dict) -> None:
    """Below the actor's CLIENT span: the whole rollout, over every server of its shard."""
    spans = [s for s in run["spans"] if s["trace_id"] == client["trace_id"]]
    by_id = {s["span_id"]: s for s in spans}
    (server,) = [s for s in spans if s["parent_span_id"] == client["span_id"]]
    assert server["kind"] == "SERVER" and server["name"] == "POST /run"
    assert service_of(server) == run["entry"]
    below, frontier = set(), [server["span_id"]]
    while frontier:
        current = frontier.pop()
        for span in spans:
            if span["parent_span_id"] == current and span["span_id"] not in below:
                below.add(span["span_id"])
                frontier.append(span["span_id"])
    assert {service_of(by_id[i]) for i in below} >= run["servers"]
    assert any(by_id[i]["name"] == "gym.rollout" for i in below)
    for i in below:
        assert by_id[i]["resource"].get("nemo.gym.shard") == client["resource"]["nemo.gym.shard"]
        assert by_id[i]["resource"]["nemo.gym.run.id"] == client["resource"]["nemo.gym.run.id"]


def _span(run: dict, span_id: str) -> dict:
    (found,) = [s for s in run["spans"] if s["span_id"] == span_id]
    return found


def _examples_job(job: dict, pid: int, sent: int, mode: str) -> None:
    """A gym.job run_examples opened in the actor, with the counts it saw."""
    assert job["name"] == "gym.job" and job["kind"] == "INTERNAL"
    assert job["resource"]["process.pid"] == pid
    attributes = job["attributes"]
    assert attributes["nemo.gym.job.entry"] == "run_examples"
    assert attributes["nemo.gym.job.trace"] == mode
    assert attributes["nemo.gym.job.rollouts.sent"] == sent and attributes["nemo.gym.job.rollouts.failed"] == 0
    assert "nemo.gym.job.num_repeats" not in attributes  # run_examples applies no repeats


def test_the_actor_is_gym_orchestrator_with_actor_shard_and_node(run):
    shard = run["out"]["shards"]["shard-a"]
    where = shard["where"]
    assert shard["runs"][0]["rewards"] == [1.0] * N
    # the runtime_env replaced PYTHONPATH: no sitecustomize ran in this actor; the creation
    # carrier prepared it, and its servers got the sitecustomize back (they are traced below)
    assert where["sitecustomize"] is None
    entries = where["pythonpath"].split(os.pathsep)
    assert run["replaced"] in entries and entries[0].endswith("/opentelemetry/instrumentation/auto_instrumentation")
    clients = _runs(run, "shard-a")
    assert len(clients) == 3 * N  # every batch, one CLIENT span per rollout
    first = clients[:N]
    for client in first:
        resource = client["resource"]
        assert service_of(client) == ORCHESTRATOR
        assert resource["nemo.gym.process.role"] == "orchestrator"
        assert resource["process.pid"] == where["pid"] != run["out"]["driver_pid"]
        assert resource["ray.actor.id"] == where["actor"]
        assert resource["ray.actor.name"] == resource["nemo.gym.shard"] == "shard-a"
        assert resource["ray.node.id"] == where["node"]
        assert resource["nemo.gym.version"] == run["version"]
        _assert_whole(run, client)
    # Nothing upstream in the driver but our own Ray propagation (ray.submit there,
    # ray.execute in the actor): the job-traces rules apply.  Each rollout is a root of
    # its own trace, linked to the batch's gym.job ...
    assert all(c["parent_span_id"] is None for c in first)
    assert len({c["trace_id"] for c in first}) == N
    (link,) = {(link["trace_id"], link["span_id"]) for c in first for link in c["links"]}
    assert all(len(c["links"]) == 1 and c["attributes"]["nemo.gym.job.id"] for c in first)
    job = _span(run, link[1])
    _examples_job(job, where["pid"], N, "per_rollout")
    assert {c["attributes"]["nemo.gym.job.id"] for c in first} == {job["attributes"]["nemo.gym.job.id"]}
    # ... which is a trace of its own, linked to the actor call that ran the batch
    assert job["parent_span_id"] is None and job["trace_id"] not in {c["trace_id"] for c in first}
    (execute_link,) = job["links"]
    execute = _span(run, execute_link["span_id"])
    assert execute["name"].startswith("ray.execute ") and execute["kind"] == "CONSUMER"
    assert execute["name"].endswith("run_rollouts") and execute["resource"]["process.pid"] == where["pid"]
    submit = _span(run, execute["parent_span_id"])
    assert submit["name"].startswith("ray.submit ") and submit["kind"] == "PRODUCER"
    assert submit["parent_span_id"] is None and service_of(submit) == "nemo-gym/driver"


def test_a_span_the_driver_hands_to_the_actor_parents_the_rollouts(run):
    # the driver's span in NeMo RL's own carrier: an embedder's span, it wins
    shard = run["out"]["shards"]["shard-a"]
    assert shard["runs"][1]["rewards"] == [1.0] * N
    trace_id, span_id = shard["runs"][1]["driver_span"]
    driver_span = _span(run, span_id)
    assert driver_span["name"] == "driver.step" and driver_span["trace_id"] == trace_id
    (job,) = [s for s in run["spans"] if s["name"] == "gym.job" and s["parent_span_id"] == span_id]
    _examples_job(job, shard["where"]["pid"], N, "embedded")
    under = [c for c in _runs(run, "shard-a") if c["parent_span_id"] == job["span_id"]]
    assert len(under) == N and {c["trace_id"] for c in under} == {trace_id}
    assert not any(c["links"] for c in under)
    for client in under:
        _assert_whole(run, client)


def test_a_driver_span_carried_by_our_ray_propagation_alone_parents_the_rollouts(run):
    # no carrier of the embedder's: our ray.submit/ray.execute bring the driver's span
    # into the actor, and that span (upstream of ours) is the embedder's
    shard = run["out"]["shards"]["shard-a"]
    assert shard["runs"][2]["rewards"] == [1.0] * N
    trace_id, span_id = shard["runs"][2]["driver_span"]
    (submit,) = [s for s in run["spans"] if s["parent_span_id"] == span_id]
    assert submit["name"].startswith("ray.submit ") and submit["kind"] == "PRODUCER"
    (execute,) = [s for s in run["spans"] if s["parent_span_id"] == submit["span_id"]]
    assert execute["name"].startswith("ray.execute ") and execute["resource"]["process.pid"] == shard["where"]["pid"]
    (job,) = [s for s in run["spans"] if s["parent_span_id"] == execute["span_id"]]
    _examples_job(job, shard["where"]["pid"], N, "embedded")
    assert not job["links"]
    under = [c for c in _runs(run, "shard-a") if c["parent_span_id"] == job["span_id"]]
    assert len(under) == N and {c["trace_id"] for c in under} == {trace_id}
    for client in under:
        _assert_whole(run, client)


def test_an_embedders_provider_and_aiohttp_instrumentor_in_the_actor_are_adopted_not_doubled(run):
    shard = run["out"]["shards"]["shard-b"]
    assert shard["runs"][0]["rewards"] == [1.0] * N
    assert shard["where"]["provider"] == "opentelemetry.sdk.trace"
    assert shard["where"]["aiohttp_instrumented"] == run["aiohttp"]
    trace_id, span_id = shard["runs"][0]["driver_span"]
    (outer,) = [s for s in run["spans"] if s["name"] == "rl.gym.run_rollouts"]
    assert outer["parent_span_id"] == span_id and outer["trace_id"] == trace_id
    clients = _runs(run, "shard-b")
    # exactly one CLIENT span per rollout, ours, under the embedder's span, and the
    # server's parent is it (one traceparent per request)
    assert len(clients) == N
    actor = [s for s in run["spans"] if s["resource"].get("process.pid") == shard["where"]["pid"]]
    assert all(s["scope"] == "gym_autoinstr" for s in actor if s["kind"] == "CLIENT")
    (job,) = [s for s in run["spans"] if s["name"] == "gym.job" and s["parent_span_id"] == outer["span_id"]]
    _examples_job(job, shard["where"]["pid"], N, "embedded")
    assert service_of(job) == EMBEDDER
    for client in clients:
        assert client["parent_span_id"] == job["span_id"]
        # one provider in the actor: the embedder's, carrying our identity beside its name
        assert client["resource"] == outer["resource"]
        _assert_whole(run, client)
    assert service_of(outer) == EMBEDDER
    assert outer["resource"]["nemo.gym.process.role"] == "orchestrator"
    assert outer["resource"]["nemo.gym.shard"] == "shard-b"


def test_two_shards_on_two_nodes_are_two_fleets_told_apart(run):
    a, b = run["out"]["shards"]["shard-a"]["where"], run["out"]["shards"]["shard-b"]["where"]
    assert a["node"] != b["node"]
    client_a, client_b = _runs(run, "shard-a")[0], _runs(run, "shard-b")[0]
    assert client_a["resource"]["ray.node.id"] == a["node"] and client_b["resource"]["ray.node.id"] == b["node"]
    assert client_a["resource"]["nemo.gym.run.id"] != client_b["resource"]["nemo.gym.run.id"]
    for shard in ("shard-a", "shard-b"):
        servers = {
            service_of(s)
            for s in run["spans"]
            if s["resource"].get("nemo.gym.shard") == shard and s["resource"].get("nemo.gym.process.role") == "server"
        }
        assert servers == run["servers"], shard


def test_ray_daemons_and_idle_workers_export_nothing(run):
    spans = run["spans"]
    assert {service_of(s) for s in spans} <= {ORCHESTRATOR, EMBEDDER, "nemo-gym/driver", *run["servers"]}
    assert run["daemons"]
    assert not {s["resource"].get("process.pid") for s in spans} & run["daemons"]
    actors = {shard["where"]["pid"] for shard in run["out"]["shards"].values()}
    ray_pids = {s["resource"]["process.pid"] for s in spans if "ray.node.id" in s["resource"]}
    assert ray_pids == actors
