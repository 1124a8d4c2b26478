"""Ray tasks submitted by a Gym process, traced into the Ray worker (real Ray, real collector).

One two-node Ray cluster (head + a second ``ray start --address`` node, all on loopback,
started under ``opentelemetry-instrument`` as Gym's ``initialize_ray()`` would be) and one
collector serve the module.  A Gym-style process (``NEMO_GYM_CONFIG_PATH`` set, so it is a
Gym server to gym-autoinstr) submits tasks in the shapes Gym's servers use
(``tests/fixtures/ray_probe``): plain, code_gen's SPREAD + ``runtime_env`` replacing
``PYTHONPATH``, a raising task, positional-only / keyword-only / ``*args, **kwargs``,
``.options(...)``, ``num_returns``, a generator, a parameter named like the carrier, and a
worker whose interpreter cannot import gym-autoinstr.  Idle workers are reaped at once
(``RAY_num_workers_soft_limit=0``) and the batch delay is a minute, so only the flush at
a task's end can deliver a worker's spans.

On the same cluster: Gym's real ``code_gen`` (0.4.0, joined through
``ray_head_node_address``), a Gym server of our own whose verify calls long-lived actors
(``tests/fixtures/ray_scorer``), and that server again with every Gym process in Ray client mode
(``ray://``, the head's client server).  Gym 0.7.0's ``code_gen`` starts a cluster of its own.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import psutil
import pytest

from tests.harness.collector import Collector
from tests.harness.gym_install import gym_venv
from tests.harness.ray_cluster import RayCluster
from tests.harness.traces import otel_env, rollout_traces, service_of, spans_since
from tests.harness.trio import AGENT, CODE_ANSWER, ENVIRONMENT, MODEL, GymTrio, GymTrioError, PolicyModel, free_ports

pytestmark = pytest.mark.realgym

PROBE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_probe"
SERVER = "ray_probe"
SUBMITTER = f"nemo-gym/{SERVER}"
WORKER = f"nemo-gym/{SERVER}/ray"
CODE_GEN = "nemo-gym/code_gen"
CODE_GEN_WORKER = "nemo-gym/code_gen/ray"
GYM_SERVICES = {f"nemo-gym/{name}" for name in (AGENT, MODEL, ENVIRONMENT, "orchestrator")}
TRACED = ["double", "check_correctness", "raises", "positional_only", "star", "pair"]
SCORER_SOURCE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_scorer"


def _run_probe(venv: pathlib.Path, cluster: RayCluster, env: dict, workdir: pathlib.Path) -> tuple[dict, str]:
    penv = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "RAY_", "NEMO_GYM_"))}
    penv.update(env)
    penv.update({"NEMO_GYM_CONFIG_PATH": SERVER, "RAY_AUTH_MODE": "disabled", "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    result = subprocess.run(
        [
            str(venv / "bin" / "opentelemetry-instrument"),
            str(venv / "bin" / "python"),
            str(PROBE / "probe.py"),
            cluster.address,
            str(PROBE / "shadow"),
        ],
        env=penv,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=workdir,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE-RESULT ")]
    assert result.returncode == 0 and lines, (
        f"probe failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return json.loads(lines[-1][len("PROBE-RESULT ") :]), result.stderr


@pytest.fixture(scope="module")
def venv():
    return gym_venv("0.4.0")


@pytest.fixture(scope="module")
def module_collector(tmp_path_factory):
    with Collector(log_dir=tmp_path_factory.mktemp("collector")) as collector:
        yield collector


@pytest.fixture(scope="module")
def cluster(venv, module_collector, tmp_path_factory):
    """Two Ray nodes, shared by the module; idle workers reaped at once.  The head also
    runs Ray's client server (``ray://``), whose drivers import the actor classes of
    tests/fixtures/ray_scorer from the cluster's PYTHONPATH (client mode ships no code)."""
    workdir = tmp_path_factory.mktemp("ray")
    env = dict(otel_env(module_collector, "http/protobuf"), PYTHONPATH=str(SCORER_SOURCE))
    cluster = RayCluster(
        venv,
        workdir,
        env,
        num_cpus=1,
        client_server=True,
        raylet_env={"RAY_num_workers_soft_limit": "0", "RAY_idle_worker_killing_time_threshold_ms": "300"},
    )
    with cluster.start(nodes=2):
        yield cluster


@pytest.fixture(scope="module")
def ray_run(venv, module_collector, cluster):
    collector, workdir = module_collector, cluster.workdir
    started = time.monotonic()
    env = otel_env(collector, "http/protobuf")
    # ray.kill waits at most the flush timeout for an actor's export: ample for 5000 spans
    results, stderr = _run_probe(venv, cluster, dict(env, GYM_AUTOINSTR_FLUSH_TIMEOUT_MS="10000"), workdir)
    daemons = {p.pid for p in cluster.processes() if not _is_worker(p)}
    worker_logs = "\n".join(path.read_text(errors="replace") for path in cluster.temp_root.rglob("worker-*.err"))
    # A dead collector: the same tasks, the same answers.
    dead = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_ports(1)[0]}")
    dead_results, _ = _run_probe(venv, cluster, dead, workdir)
    dead_worker_logs = "\n".join(path.read_text(errors="replace") for path in cluster.temp_root.rglob("worker-*.err"))
    worker_pids = {r["pid"] for r in results["spread"]} | {results["double"]["pid"]}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in worker_pids):
        time.sleep(1)
    reaped = not any(psutil.pid_exists(pid) for pid in worker_pids)
    collector.sink.wait_for(
        lambda spans: (
            len(_probe_spans(spans, "ray.execute")) >= 14
            and len(_probe_spans(spans, "probe.burst")) >= results["burst"]["value"]
        ),
        timeout=60,
    )
    return {
        "results": results,
        "stderr": stderr,
        "spans": [s for s in collector.sink.spans() if SERVER in service_of(s)],
        "all_spans": collector.sink.spans(),
        "daemons": daemons,
        "worker_logs": worker_logs,
        "dead_results": dead_results,
        "dead_worker_logs": dead_worker_logs,
        "reaped": reaped,
        "bodies": collector.sink.raw_bodies(),
        "seconds": time.monotonic() - started,
    }


def _probe_spans(spans: list[dict], prefix: str) -> list[dict]:
    return [s for s in spans if s["name"].startswith(prefix) and SERVER in service_of(s)]


def _is_worker(process: psutil.Process) -> bool:
    """A Ray worker: ``default_worker.py``, or retitled by Ray (``ray::IDLE``, ``ray::Scorer.score``)."""
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and (
        cmdline[0].startswith("ray::")
        or any(arg.endswith("/ray/_private/workers/default_worker.py") for arg in cmdline[:4])
    )


def _named(spans: list[dict], prefix: str, function: str) -> list[dict]:
    return [s for s in spans if s["name"] == f"{prefix} {function}"]


def test_every_task_runs_in_a_worker_span_under_its_submit_span(ray_run):
    spans, results = ray_run["spans"], ray_run["results"]
    for function in TRACED:
        submits = _named(spans, "ray.submit", function)
        executes = _named(spans, "ray.execute", function)
        assert submits and executes, function
        for execute in executes:
            parent = next(s for s in submits if s["span_id"] == execute["parent_span_id"])
            assert parent["trace_id"] == execute["trace_id"]
            assert parent["kind"] == "PRODUCER" and execute["kind"] == "CONSUMER"
            assert service_of(parent) == SUBMITTER and service_of(execute) == WORKER
            assert parent["attributes"]["ray.task.id"] == execute["attributes"]["ray.task.id"]
            assert execute["attributes"]["ray.task.function"] == f"probe_tasks.{function}"
            assert execute["attributes"]["ray.task.wait.duration"] >= 0
            assert execute["attributes"]["process.pid"] != results["driver_pid"]
            assert execute["resource"]["process.pid"] == execute["attributes"]["process.pid"]
            assert execute["resource"]["nemo.gym.server.name"] == SERVER
            assert execute["resource"]["nemo.gym.process.role"] == "ray_worker"
            assert execute["resource"]["host.name"]
            assert execute["resource"]["ray.node.id"] == execute["attributes"]["ray.node.id"]
    # Where each task ran (its own answer) is what its span says.
    double = _named(spans, "ray.execute", "double")
    assert [s["attributes"]["process.pid"] for s in double] == [results["double"]["pid"]]
    assert double[0]["attributes"]["ray.node.id"] == results["double"]["node"]


def test_code_gen_shaped_tasks_are_traced_although_their_runtime_env_replaces_pythonpath(ray_run):
    results, spans = ray_run["results"], ray_run["spans"]
    assert all(r["value"] is True for r in results["spread"])
    # runtime_env replaced PYTHONPATH: opentelemetry-instrument's sitecustomize is gone there
    assert {r["pythonpath"] for r in results["spread"]} == {str(PROBE)}
    executes = _named(spans, "ray.execute", "check_correctness")
    assert len(executes) == 4
    assert {(s["attributes"]["process.pid"], s["attributes"]["ray.node.id"]) for s in executes} == {
        (r["pid"], r["node"]) for r in results["spread"]
    }
    assert len({s["trace_id"] for s in executes}) == 4


def test_a_raising_task_marks_its_worker_span_with_the_error_type_only(ray_run):
    assert ray_run["results"]["raises"] == "ValueError"
    (execute,) = _named(ray_run["spans"], "ray.execute", "raises")
    assert execute["status"] == "ERROR" and execute["attributes"]["error.type"] == "ValueError"
    assert not any(b"secret-canary" in body for body in ray_run["bodies"])


def test_a_task_error_marks_the_callers_span_where_it_surfaces(ray_run):
    spans, caught = ray_run["spans"], ray_run["results"]["caller_errors"]
    # what the caller received is Ray's own: RayTaskError(<cause>), still the cause's class
    assert caught == {"get": True, "await": ["KeyError", True], "await_ok": "again"}
    by_name = {s["name"]: s for s in spans if s["name"].startswith("probe.")}
    for label, submitted, error_type in (
        ("get", "raises", "ValueError"),
        ("actor_get", "Counter.fail", "KeyError"),
        ("await", "Counter.fail", "KeyError"),
    ):
        span = by_name[f"probe.{label}"]
        assert span["status"] == "ERROR" and span["attributes"]["error.type"] == error_type, label
        assert service_of(span) == SUBMITTER
        # the caller's span is its task's submit span's parent; the worker's span is marked too
        (submit,) = [
            s for s in spans if s["parent_span_id"] == span["span_id"] and s["name"] == f"ray.submit {submitted}"
        ]
        (execute,) = [s for s in spans if s["parent_span_id"] == submit["span_id"]]
        assert execute["status"] == "ERROR" and execute["trace_id"] == span["trace_id"]
    for label, submitted in (("get_ok", "double"), ("await_ok", "AsyncEcho.echo")):
        span = by_name[f"probe.{label}"]
        assert span["status"] == "UNSET" and "error.type" not in span["attributes"], label
        assert [s for s in spans if s["parent_span_id"] == span["span_id"] and s["name"] == f"ray.submit {submitted}"]


def test_odd_shapes_run_as_before(ray_run):
    results, spans = ray_run["results"], ray_run["spans"]
    assert results["positional_only"]["value"] == [1, 2, 3]
    assert results["star"]["value"] == [[1, 2], ["k"]]  # the carrier never reaches **kwargs
    assert results["pair"] == [7, 8]
    assert results["numbers"] == [0, 1, 2]
    assert results["collides"]["value"] == [5, None]  # its own parameter, untouched
    assert not _named(spans, "ray.submit", "collides") and not _named(spans, "ray.execute", "collides")
    assert not _named(spans, "ray.execute", "numbers")  # generators: untraced
    assert "has a parameter named _gym_autoinstr_ctx" in ray_run["stderr"]


def test_actor_method_calls_run_in_the_actor_under_their_submit_span(ray_run):
    results, spans = ray_run["results"], ray_run["spans"]
    assert [r["value"] for r in results["actor"]] == [11, 15]
    assert results["actor_raises"] == "KeyError" and results["actor_static"] == 1
    assert results["async_actor"]["value"] == "hi"
    for method, count, pid in (
        ("Counter.add", 2, results["actor"][0]["pid"]),
        ("Counter.fail", 2, results["actor"][0]["pid"]),
        ("AsyncEcho.echo", 2, results["async_actor"]["pid"]),
    ):
        submits, executes = _named(spans, "ray.submit", method), _named(spans, "ray.execute", method)
        assert len(submits) == len(executes) == count, method
        for execute in executes:
            (submit,) = [s for s in submits if s["span_id"] == execute["parent_span_id"]]
            assert submit["trace_id"] == execute["trace_id"] and submit["kind"] == "PRODUCER"
            assert service_of(submit) == SUBMITTER and service_of(execute) == WORKER and execute["kind"] == "CONSUMER"
            assert submit["attributes"]["ray.actor.id"] == execute["attributes"]["ray.actor.id"]
            assert submit["attributes"]["ray.task.id"] == execute["attributes"]["ray.task.id"]
            assert execute["attributes"]["ray.task.function"] == f"probe_tasks.{method}"
            assert execute["attributes"]["process.pid"] == pid  # the actor's own process
    for fail in _named(spans, "ray.execute", "Counter.fail"):  # ray.get and await
        assert fail["status"] == "ERROR" and fail["attributes"]["error.type"] == "KeyError"
    assert not [s for s in spans if "version" in s["name"]]  # static methods: untraced
    # Both actors were killed right after their last call, the async one just after a call
    # that ended 5000 spans of its own; ray.kill had them export first (the dead-collector
    # test below sees them try), and nothing is lost.
    assert not any(psutil.pid_exists(pid) for pid in (results["actor"][0]["pid"], results["async_actor"]["pid"]))
    (burst_execute,) = _named(spans, "ray.execute", "AsyncEcho.burst")
    bursts = [s for s in spans if s["name"] == "probe.burst"]
    assert results["burst"]["value"] == 5000 and results["burst"]["pid"] == results["async_actor"]["pid"]
    assert sorted(s["attributes"]["probe.index"] for s in bursts) == list(range(5000))
    assert {s["parent_span_id"] for s in bursts} == {burst_execute["span_id"]}
    assert {s["trace_id"] for s in bursts} == {burst_execute["trace_id"]} and {service_of(s) for s in bursts} == {
        WORKER
    }


def test_a_worker_without_gym_autoinstr_runs_the_task_untraced_and_says_so(ray_run):
    results, spans = ray_run["results"], ray_run["spans"]
    assert [r["value"] for r in results["missing"]] == [8, 10]
    missing_pids = {r["pid"] for r in results["missing"]}
    assert not [s for s in spans if s["resource"].get("process.pid") in missing_pids]
    assert len(_named(spans, "ray.submit", "double")) == 3 and len(_named(spans, "ray.execute", "double")) == 1
    said = ray_run["worker_logs"].count("cannot import gym_autoinstr")
    assert 1 <= said <= len(missing_pids)


def test_spans_of_reaped_idle_workers_arrive(ray_run):
    # The batch delay is a minute and the workers were reaped within seconds: only the
    # flush requested at each task's end can have delivered these.
    assert ray_run["reaped"]
    pids = {r["pid"] for r in ray_run["results"]["spread"]} | {ray_run["results"]["double"]["pid"]}
    exported = {s["attributes"].get("process.pid") for s in ray_run["spans"] if s["name"].startswith("ray.execute")}
    assert pids <= exported


def test_ray_daemons_export_nothing(ray_run):
    spans = ray_run["all_spans"]
    # only the Gym-style submitters and the workers doing their tasks, never a Ray daemon
    assert {service_of(s) for s in spans} <= {SUBMITTER, WORKER, CODE_GEN, CODE_GEN_WORKER, *GYM_SERVICES}
    assert {SUBMITTER, WORKER} <= {service_of(s) for s in spans}
    assert ray_run["daemons"]
    assert not {s["resource"].get("process.pid") for s in spans} & ray_run["daemons"]


def test_a_dead_collector_changes_no_answer(ray_run):
    def strip(results):
        return {
            k: v
            for k, v in json.loads(
                json.dumps(results, sort_keys=True).replace('"pid"', '"_p"').replace('"node"', '"_n"')
            ).items()
            if k != "driver_pid"
        }

    def values(results):
        out = strip(results)
        for _key, value in out.items():
            if isinstance(value, dict):
                value.pop("_p", None), value.pop("_n", None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, dict):
                        item.pop("_p", None), item.pop("_n", None)
        return out

    assert values(ray_run["dead_results"]) == values(ray_run["results"])
    # ray.kill still had the actors try to export first; they could not, said so, and
    # were killed when the flush timeout ran out
    assert "telemetry flush at ray.kill" in ray_run["dead_worker_logs"]
    assert "telemetry flush at ray.kill" not in ray_run["worker_logs"]


# --- Gym's real code_gen verifier, joined to the two-node cluster ---------------------


@pytest.fixture(scope="module")
def code_gen_run(module_collector, cluster, tmp_path_factory):
    started = time.monotonic()
    workdir = tmp_path_factory.mktemp("code_gen")
    with PolicyModel(args=("--answer", CODE_ANSWER)) as policy:
        trio = GymTrio.for_version(
            "0.4.0",
            workdir,
            policy.url,
            env=otel_env(module_collector, "http/protobuf"),
            instrument=True,
            resources="code_gen",
            extra_config={"ray_head_node_address": cluster.address},
        )
        with trio:
            results = trio.rollouts(4, concurrency=2)

            def executed() -> list[dict]:
                return [s for s in module_collector.sink.spans() if s["name"] == "ray.execute check_correctness_remote"]

            module_collector.sink.wait_for(lambda spans: len(executed()) >= len(results), timeout=120)
            # SPREAD is Ray's best effort: a few more rollouts (at most 10 in all) until the
            # tasks have used both nodes; every rollout sent is checked below.
            while len({s["attributes"].get("ray.node.id") for s in executed()}) < 2 and len(results) < 10:
                results += trio.rollouts(2, concurrency=2)
                module_collector.sink.wait_for(lambda spans: len(executed()) >= len(results), timeout=120)
            time.sleep(2)  # the last batch of the servers' spans (1 s schedule)
    return {"results": results, "spans": module_collector.sink.spans(), "seconds": time.monotonic() - started}


def _assert_rollouts_continue_into_the_ray_worker(run: dict, run_service: str) -> set:
    sent = len(run["results"])
    assert [r["reward"] for r in run["results"]] == [1.0] * sent
    traces = rollout_traces(run["spans"], run_service)
    assert len(traces) == sent
    nodes = set()
    for spans in traces.values():
        by_id = {s["span_id"]: s for s in spans}
        (verify,) = [s for s in spans if s["name"] == "POST /verify" and s["kind"] == "SERVER"]
        assert service_of(verify) == CODE_GEN
        (submit,) = [s for s in spans if s["name"] == "ray.submit check_correctness_remote"]
        (execute,) = [s for s in spans if s["name"] == "ray.execute check_correctness_remote"]
        assert service_of(submit) == CODE_GEN and submit["kind"] == "PRODUCER"
        assert service_of(execute) == CODE_GEN_WORKER and execute["kind"] == "CONSUMER"
        assert execute["parent_span_id"] == submit["span_id"]
        # the submit span sits inside /verify's handling
        ancestor = by_id[submit["parent_span_id"]]
        while ancestor["span_id"] != verify["span_id"]:
            ancestor = by_id[ancestor["parent_span_id"]]
        assert execute["attributes"]["ray.task.wait.duration"] >= 0
        assert execute["attributes"]["ray.task.id"] == submit["attributes"]["ray.task.id"]
        assert execute["resource"]["nemo.gym.server.name"] == "code_gen"
        assert execute["resource"]["nemo.gym.process.role"] == "ray_worker"
        nodes.add(execute["attributes"]["ray.node.id"])
    return nodes


def test_code_gen_rollouts_continue_below_verify_into_the_ray_worker_on_both_nodes(code_gen_run):
    nodes = _assert_rollouts_continue_into_the_ray_worker(code_gen_run, f"nemo-gym/{AGENT}")
    # Gym joined the cluster through ray_head_node_address; SPREAD used both nodes
    assert len(nodes) == 2


@pytest.fixture(scope="module")
def code_gen_07_run(tmp_path_factory):
    """Gym 0.7.0's code_gen (ray_enabled), with the Ray cluster Gym starts itself."""
    started = time.monotonic()
    workdir = tmp_path_factory.mktemp("code_gen_07")
    with Collector(log_dir=workdir / "collector") as collector, PolicyModel(args=("--answer", CODE_ANSWER)) as policy:
        trio = GymTrio.for_version(
            "0.7.0",
            workdir,
            policy.url,
            env=otel_env(collector, "http/protobuf"),
            instrument=True,
            resources="code_gen",
        )
        with trio:
            results = trio.rollouts(4, concurrency=2)
            collector.sink.wait_for(
                lambda spans: len([s for s in spans if s["name"] == "ray.execute check_correctness_remote"]) >= 4,
                timeout=120,
            )
            time.sleep(2)  # the last batch of the servers' spans (1 s schedule)
            processes = {p.pid: " ".join(p.cmdline()[:3]) for p in trio.processes() if _alive_cmdline(p)}
        return {
            "results": results,
            "spans": collector.sink.spans(),
            "processes": processes,
            "seconds": time.monotonic() - started,
        }


def _alive_cmdline(process: psutil.Process) -> bool:
    try:
        return bool(process.cmdline())
    except psutil.Error:
        return False


def test_code_gen_07_rollouts_continue_into_the_ray_worker_gym_started(code_gen_07_run):
    _assert_rollouts_continue_into_the_ray_worker(code_gen_07_run, f"nemo-gym/{ENVIRONMENT}")
    # Ray's daemons (started by Gym, under opentelemetry-instrument) export nothing
    daemons = {
        pid
        for pid, cmdline in code_gen_07_run["processes"].items()
        if "/ray/" in cmdline and "default_worker.py" not in cmdline
    }
    assert daemons
    spans = code_gen_07_run["spans"]
    assert not {s["resource"].get("process.pid") for s in spans} & daemons
    assert {service_of(s) for s in spans} <= {CODE_GEN, CODE_GEN_WORKER, *GYM_SERVICES}


# --- long-lived Ray actors called from a Gym server (tests/fixtures/ray_scorer) ---------
#
# A resources server in the style of Gym's actor-based verifiers, started by the real
# `gym env start` and joined to the two-node cluster: its /verify creates (once) a plain,
# a threaded (max_concurrency=4) and an async actor and calls them on every request;
# odd rows also call a method that raises.  The batch delay is a minute everywhere, so
# while the fleet runs only the flush at each actor call's end can deliver the actors'
# spans; the second batch is followed at once by Gym's shutdown, whose servers' exit
# kills the actors they own.

SCORER = "ray_scorer"
SCORER_SERVICE = f"nemo-gym/{SCORER}"
SCORER_WORKER = f"nemo-gym/{SCORER}/ray"
SCORER_CALLS = {"Scorer.score": 1, "ThreadedScorer.meet": 2, "AsyncScorer.meet": 2, "length": 1}


def _scorer_rows(first: int, count: int) -> list[dict]:
    from tests.harness.trio import RAY_SCORER_ROW

    # odd rows also call a method that raises: awaited (index 1 mod 4) or ray.get (3 mod 4)
    return [
        dict(
            RAY_SCORER_ROW,
            verifier_metadata={"fail": ("", "await", "", "get")[index % 4], "secret": f"secret-canary-{index}"},
        )
        for index in range(first, first + count)
    ]


def _scorer_executes(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["name"].startswith("ray.execute") and service_of(s) == SCORER_WORKER]


def _expected_executes(rows: list[dict]) -> int:
    return sum(sum(SCORER_CALLS.values()) + bool(row["verifier_metadata"]["fail"]) for row in rows)


@pytest.fixture(scope="module")
def scorer_run(module_collector, cluster, tmp_path_factory):
    import concurrent.futures

    started = time.monotonic()
    collector, workdir = module_collector, tmp_path_factory.mktemp("scorer")
    first, second = _scorer_rows(0, 4), _scorer_rows(4, 4)
    env = otel_env(collector, "http/protobuf", OTEL_BSP_SCHEDULE_DELAY="60000")
    with PolicyModel() as policy:
        trio = GymTrio.for_version(
            "0.4.0",
            workdir,
            policy.url,
            env=env,
            instrument=True,
            resources=SCORER,
            extra_config={"ray_head_node_address": cluster.address},
        )
        with trio, concurrent.futures.ThreadPoolExecutor(4) as pool:
            server_pid = trio.server_processes()[SCORER].pid

            def send(rows: list[dict], offset: int) -> list[dict]:
                return list(
                    pool.map(lambda item: trio.rollout(item[1], rollout_index=offset + item[0]), enumerate(rows))
                )

            results = send(first, 0)
            actor_pids = {
                name: {call["pid"] for r in results for call in _calls(r, name)}
                for name in ("plain", "threaded", "async")
            }
            arrived_while_running = collector.sink.wait_for(
                lambda spans: len(_scorer_executes(spans)) >= _expected_executes(first), timeout=60
            )
            alive_then = all(psutil.pid_exists(pid) for pids in actor_pids.values() for pid in pids)
            results += send(second, len(first))
        # Gym's shutdown: the server exits, Ray kills the actors it owned
        total = _expected_executes(first + second)
        collector.sink.wait_for(lambda spans: len(_scorer_executes(spans)) >= total, timeout=60)
        collector.sink.wait_for(
            lambda spans: (
                len([s for s in spans if s["name"] == "POST /verify" and service_of(s) == SCORER_SERVICE])
                >= len(results)
            ),
            timeout=60,
        )
    deadline = time.monotonic() + 60
    all_pids = {pid for pids in actor_pids.values() for pid in pids}
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in all_pids):
        time.sleep(0.5)
    spans = collector.sink.spans()
    scorer_traces = {s["trace_id"] for s in spans if service_of(s) == SCORER_SERVICE}
    return {
        "results": results,
        "rows": first + second,
        "server_pid": server_pid,
        "actor_pids": actor_pids,
        "arrived_while_running": arrived_while_running,
        "alive_then": alive_then,
        "killed": not any(psutil.pid_exists(pid) for pid in all_pids),
        "traces": {t: ss for t, ss in rollout_traces(spans, f"nemo-gym/{AGENT}").items() if t in scorer_traces},
        "executes": _scorer_executes(spans),
        "bodies": collector.sink.raw_bodies(),
        "seconds": time.monotonic() - started,
    }


def _calls(result: dict, actor: str) -> list[dict]:
    calls = result["calls"][actor]
    return calls if isinstance(calls, list) else [calls]


def _descends_from(span: dict, ancestor: dict, by_id: dict) -> bool:
    while span.get("parent_span_id") in by_id:
        span = by_id[span["parent_span_id"]]
        if span["span_id"] == ancestor["span_id"]:
            return True
    return False


def test_every_rollout_continues_from_the_servers_verify_into_its_long_lived_actors(scorer_run):
    results, traces = scorer_run["results"], scorer_run["traces"]
    assert len(results) == len(traces) == 8
    actor_of = {}  # class -> (actor id, pid, node): one actor each, for the whole run
    for spans in traces.values():
        by_id = {s["span_id"]: s for s in spans}
        (verify,) = [s for s in spans if s["name"] == "POST /verify" and s["kind"] == "SERVER"]
        assert service_of(verify) == SCORER_SERVICE
        for method, count in SCORER_CALLS.items():
            submits = [s for s in spans if s["name"] == f"ray.submit {method}"]
            assert len(submits) == count, method
            for submit in submits:
                assert submit["kind"] == "PRODUCER" and service_of(submit) == SCORER_SERVICE
                assert _descends_from(submit, verify, by_id)
                (execute,) = [s for s in spans if s["parent_span_id"] == submit["span_id"]]
                assert execute["name"] == f"ray.execute {method}" and execute["kind"] == "CONSUMER"
                assert service_of(execute) == SCORER_WORKER
                assert execute["resource"]["nemo.gym.server.name"] == SCORER
                assert execute["resource"]["nemo.gym.process.role"] == "ray_worker"
                assert execute["resource"]["ray.node.id"] == execute["attributes"]["ray.node.id"]
                assert (
                    execute["resource"]["process.pid"]
                    == execute["attributes"]["process.pid"]
                    != scorer_run["server_pid"]
                )
                assert execute["attributes"]["ray.task.id"] == submit["attributes"]["ray.task.id"]
                assert execute["attributes"]["ray.task.wait.duration"] >= 0
                assert execute["attributes"]["ray.task.function"] == f"scorer_actors.{method}"
                if method == "length":  # the plain task: a worker, no actor
                    assert "ray.actor.id" not in submit["attributes"] and "ray.actor.id" not in execute["attributes"]
                    continue
                assert execute["attributes"]["ray.actor.id"] == submit["attributes"]["ray.actor.id"]
                where = (
                    execute["attributes"]["ray.actor.id"],
                    execute["attributes"]["process.pid"],
                    execute["attributes"]["ray.node.id"],
                )
                assert actor_of.setdefault(method.split(".")[0], where) == where
    # three actors, each in a process of its own, where each says it ran
    assert len({pid for _, pid, _ in actor_of.values()}) == 3
    for name, actor in (("plain", "Scorer"), ("threaded", "ThreadedScorer"), ("async", "AsyncScorer")):
        assert scorer_run["actor_pids"][name] == {actor_of[actor][1]}
        assert {(c["pid"], c["node"]) for r in results for c in _calls(r, name)} == {actor_of[actor][1:]}


def test_concurrent_calls_in_one_actor_process_each_run_under_their_own_context(scorer_run):
    executes = {s["span_id"]: s for s in scorer_run["executes"]}
    seen = set()
    for result in scorer_run["results"]:
        calls = [c for name in ("plain", "threaded", "async") for c in _calls(result, name)]
        # the threaded and the async actor really ran two calls at once
        assert all(c["met"] for name in ("threaded", "async") for c in _calls(result, name))
        # what each call saw as its current span, before and after the other call started
        # in the same process, is its own ray.execute span, in its own rollout's trace
        assert all(c["same_inside"] for name in ("threaded", "async") for c in _calls(result, name))
        assert len({c["trace_id"] for c in calls}) == 1
        for call in calls:
            span = executes[call["span_id"]]
            assert span["trace_id"] == call["trace_id"] and span["attributes"]["process.pid"] == call["pid"]
            seen.add(call["span_id"])
    assert len(seen) == sum(
        len(_calls(r, name)) for r in scorer_run["results"] for name in ("plain", "threaded", "async")
    )
    assert len({r["calls"]["plain"]["trace_id"] for r in scorer_run["results"]}) == 8


def test_an_actor_method_that_raises_marks_the_actor_span_and_the_servers_span_where_it_surfaces(scorer_run):
    failing = [row["verifier_metadata"]["fail"] for row in scorer_run["rows"]]
    assert [r["failed"] for r in scorer_run["results"]] == ["KeyError" if fail else None for fail in failing]
    marked = 0
    for spans in scorer_run["traces"].values():
        by_id = {s["span_id"]: s for s in spans}
        submits = [s for s in spans if s["name"] == "ray.submit Scorer.fail"]
        (verify,) = [s for s in spans if s["name"] == "POST /verify" and s["kind"] == "SERVER"]
        if not submits:
            assert verify["status"] != "ERROR"
            continue
        (submit,) = submits
        (execute,) = [s for s in spans if s["parent_span_id"] == submit["span_id"]]
        assert execute["status"] == "ERROR" and execute["attributes"]["error.type"] == "KeyError"
        caller = by_id[submit["parent_span_id"]]  # the span current in /verify at `await`
        assert caller["status"] == "ERROR" and caller["attributes"]["error.type"] == "KeyError"
        assert service_of(caller) == SCORER_SERVICE and (caller is verify or _descends_from(caller, verify, by_id))
        marked += 1
    assert marked == len([fail for fail in failing if fail]) == 4  # two at `await`, two at ray.get
    assert not any(b"secret-canary" in body for body in scorer_run["bodies"])


def test_long_lived_actors_deliver_while_they_run_and_lose_nothing_when_killed_at_shutdown(scorer_run):
    # With a minute's batch delay, the first batch's actor spans arrived while the
    # actors were alive: the flush at each call's end sent them.
    assert scorer_run["arrived_while_running"] and scorer_run["alive_then"]
    # The second batch was followed at once by Gym's shutdown, which killed the actors
    # (their owner exited); every call that had ended is in the collector.
    assert scorer_run["killed"]
    assert len(scorer_run["executes"]) == _expected_executes(scorer_run["rows"]) == 52
    assert len({s["span_id"] for s in scorer_run["executes"]}) == 52


# --- Ray client mode: Gym joins the cluster through its ray:// client server -----------


# What Ray's client server says when it failed to start a client's own server
_CLIENT_SERVER_START_LOST = ("Starting Ray client server failed", "psutil.ZombieProcess")


@pytest.fixture(scope="module")
def client_mode_run(module_collector, cluster, tmp_path_factory):
    """The same server, every Gym process connected with ``ray.init("ray://...")``."""
    started, start_ns = time.monotonic(), time.time_ns()
    collector, workdir = module_collector, tmp_path_factory.mktemp("scorer_client")
    rows = _scorer_rows(100, 4)  # two that succeed, two whose verify also calls a raising method (await, get)

    def this_run(spans: list[dict]) -> list[dict]:
        return spans_since(spans, start_ns)

    with PolicyModel() as policy:
        attempts = 3
        for attempt in range(attempts):
            trio = GymTrio.for_version(
                "0.4.0",
                workdir / f"gym{attempt}",
                policy.url,
                env=otel_env(collector, "http/protobuf"),
                instrument=True,
                resources=SCORER,
                extra_config={"ray_head_node_address": cluster.client_address},
            )
            try:
                trio.start()
                break
            except GymTrioError as error:
                # Ray's client server forks each per-client server while its own gRPC
                # threads poll, and gRPC's fork handlers can abort the child
                # (ray-project/ray#63202; the cluster turns them off, see RayCluster). Ray
                # reports it as a failed start, or as the zombie when the child died between
                # Ray's poll and its read of the command line (psutil.ZombieProcess). Should
                # it still happen: again, after a pause, at most twice more; any other
                # failure is the test's.
                if not any(sign in str(error) for sign in _CLIENT_SERVER_START_LOST):
                    raise
                lost = cluster.client_server_log()  # why, as Ray's client server saw it
                if attempt == attempts - 1:
                    raise GymTrioError(f"{error}\n{lost}") from error
                print(f"Ray client server lost a start (attempt {attempt + 1}):\n{lost}", file=sys.stderr)
                time.sleep(5 * (attempt + 1))
        with trio:
            results = [trio.rollout(row, rollout_index=index) for index, row in enumerate(rows)]
            log = trio.log_text()
            # Ray's daemons, the client server and its per-client drivers among them
            daemons = {p.pid: " ".join(_cmdline(p)) for p in cluster.processes() if not _is_worker(p)}
            collector.sink.wait_for(
                lambda spans: len(_scorer_executes(this_run(spans))) >= _expected_executes(rows), timeout=60
            )
            collector.sink.wait_for(
                lambda spans: len(rollout_traces(this_run(spans), f"nemo-gym/{AGENT}")) >= 4, timeout=30
            )
            time.sleep(2)  # the last batch of the servers' spans (1 s schedule)
    spans = this_run(collector.sink.spans())
    return {
        "results": results,
        "rows": rows,
        "log": log,
        "seconds": time.monotonic() - started,
        "traces": rollout_traces(spans, f"nemo-gym/{AGENT}"),
        "spans": spans,
        "daemons": daemons,
    }


def test_in_ray_client_mode_gym_works_and_actor_calls_are_traced_into_the_actor(client_mode_run):
    results, traces = client_mode_run["results"], client_mode_run["traces"]
    # Gym's work is unchanged: every call answered, the raising one surfaced as before
    assert [r["failed"] for r in results] == [None, "KeyError", None, "KeyError"]
    assert [r["reward"] for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert all(c["met"] for r in results for name in ("threaded", "async") for c in _calls(r, name))
    assert "ray://" in client_mode_run["log"]
    assert len(traces) == 4
    for spans in traces.values():
        by_id = {s["span_id"]: s for s in spans}
        (verify,) = [s for s in spans if s["name"] == "POST /verify" and s["kind"] == "SERVER"]
        executes = [s for s in spans if s["name"].startswith("ray.execute")]
        # the client's handle knows its actor's methods, not its class: the submit span
        # says the method, the actor's own span the class too (a task's: the function)
        for execute in executes:
            submit = by_id[execute["parent_span_id"]]
            assert submit["kind"] == "PRODUCER" and service_of(submit) == SCORER_SERVICE
            assert submit["name"] == "ray.submit " + execute["name"].split(" ")[-1].split(".")[-1]
            assert _descends_from(submit, verify, by_id)
            assert execute["kind"] == "CONSUMER" and service_of(execute) == SCORER_WORKER
            assert execute["attributes"].get("ray.actor.id") == submit["attributes"].get("ray.actor.id")
            # the client learns a task's id from the client server later: the submit span
            # has it only when it was there already (never waited for)
            assert (
                submit["attributes"].get("ray.task.id", execute["attributes"]["ray.task.id"])
                == execute["attributes"]["ray.task.id"]
            )
            assert execute["attributes"]["ray.task.wait.duration"] >= 0
        assert sorted(s["name"] for s in executes if s["name"] != "ray.execute Scorer.fail") == [
            "ray.execute AsyncScorer.meet"
        ] * 2 + ["ray.execute Scorer.score"] + ["ray.execute ThreadedScorer.meet"] * 2 + ["ray.execute length"]
        fails = [s for s in executes if s["name"] == "ray.execute Scorer.fail"]
        for execute in fails:
            assert execute["status"] == "ERROR" and execute["attributes"]["error.type"] == "KeyError"
            caller = by_id[by_id[execute["parent_span_id"]]["parent_span_id"]]
            assert caller["status"] == "ERROR" and caller["attributes"]["error.type"] == "KeyError"
    # the caller's span was marked where the exception surfaced: once at `await`, once at ray.get
    assert sum(1 for spans in traces.values() for s in spans if s["name"] == "ray.execute Scorer.fail") == 2


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_in_ray_client_mode_the_client_servers_drivers_export_nothing(client_mode_run):
    spans, daemons = client_mode_run["spans"], client_mode_run["daemons"]
    # one driver per connected Gym process ran on the head node, beside Ray's other daemons
    assert [cmdline for cmdline in daemons.values() if "specific-server" in cmdline]
    assert {service_of(s) for s in spans} <= {SCORER_SERVICE, SCORER_WORKER, *GYM_SERVICES}
    assert not {s["resource"].get("process.pid") for s in spans} & set(daemons)
