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

The runs themselves are in ``ray_runs.py``; their tests stay in this one module, so that one
cluster and one collector (module fixtures) serve them all once.
"""

from __future__ import annotations

import json
import pathlib

import psutil
import pytest

from tests.advice import ray_runs
from tests.advice.ray_runs import (
    PROBE,
    SCORER,
    SCORER_CALLS,
    SCORER_SERVICE,
    SCORER_WORKER,
    SERVER,
    _calls,
    _expected_executes,
)
from tests.harness.collector import Collector
from tests.harness.gym_install import gym_venv
from tests.harness.ray_cluster import RayCluster
from tests.harness.traces import otel_env, rollout_traces, service_of
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL

pytestmark = pytest.mark.realgym

SUBMITTER = f"nemo-gym/{SERVER}"
WORKER = f"nemo-gym/{SERVER}/ray"
CODE_GEN = "nemo-gym/code_gen"
CODE_GEN_WORKER = "nemo-gym/code_gen/ray"
GYM_SERVICES = {f"nemo-gym/{name}" for name in (AGENT, MODEL, ENVIRONMENT, "orchestrator")}
TRACED = ["double", "check_correctness", "raises", "positional_only", "star", "pair"]
SCORER_SOURCE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_scorer"


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
    return ray_runs.probe(venv, module_collector, cluster)


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
    return ray_runs.code_gen(module_collector, cluster, tmp_path_factory)


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
    return ray_runs.code_gen_07(tmp_path_factory)


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


@pytest.fixture(scope="module")
def scorer_run(module_collector, cluster, tmp_path_factory):
    return ray_runs.scorer(module_collector, cluster, tmp_path_factory)


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


@pytest.fixture(scope="module")
def client_mode_run(module_collector, cluster, tmp_path_factory):
    return ray_runs.client_mode(module_collector, cluster, tmp_path_factory)


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


def test_in_ray_client_mode_the_client_servers_drivers_export_nothing(client_mode_run):
    spans, daemons = client_mode_run["spans"], client_mode_run["daemons"]
    # one driver per connected Gym process ran on the head node, beside Ray's other daemons
    assert [cmdline for cmdline in daemons.values() if "specific-server" in cmdline]
    assert {service_of(s) for s in spans} <= {SCORER_SERVICE, SCORER_WORKER, *GYM_SERVICES}
    assert not {s["resource"].get("process.pid") for s in spans} & set(daemons)
