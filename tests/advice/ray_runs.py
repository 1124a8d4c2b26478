"""The runs ``test_realgym_ray.py`` checks, each a module fixture there, on the two-node Ray
cluster that module starts (real Ray, real Gym, a real collector): the Gym-style probe's
tasks and actors (``tests/fixtures/ray_probe``), Gym's real ``code_gen`` (0.4.0 joined to the
cluster; 0.7.0 with the cluster Gym starts itself), the scorer server's long-lived actors
(``tests/fixtures/ray_scorer``) and that server again in Ray client mode.  Each returns what
its tests read."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import psutil

from tests.harness.collector import Collector
from tests.harness.ray_cluster import RayCluster
from tests.harness.traces import otel_env, rollout_traces, service_of, spans_since
from tests.harness.trio import AGENT, CODE_ANSWER, GymTrio, GymTrioError, PolicyModel, free_ports

PROBE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_probe"
SERVER = "ray_probe"
SCORER = "ray_scorer"
SCORER_SERVICE = f"nemo-gym/{SCORER}"
SCORER_WORKER = f"nemo-gym/{SCORER}/ray"
SCORER_CALLS = {"Scorer.score": 1, "ThreadedScorer.meet": 2, "AsyncScorer.meet": 2, "length": 1}

# What Ray's client server says when it failed to start a client's own server
_CLIENT_SERVER_START_LOST = ("Starting Ray client server failed", "psutil.ZombieProcess")


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


def probe(venv, module_collector, cluster):
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


def code_gen(module_collector, cluster, tmp_path_factory):
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


def code_gen_07(tmp_path_factory):
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


def scorer(module_collector, cluster, tmp_path_factory):
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


def client_mode(module_collector, cluster, tmp_path_factory):
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


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
