"""The main job: real NeMo Gym processes, traced rollouts, shown as a waterfall.

Starts a deterministic OpenAI-compatible policy model (``examples/policy_model.py``)
and the real ``gym env start`` (agent + model + resources servers, each its own
process) under ``opentelemetry-instrument`` with gym-autoinstr and nothing else
configured: no collector, no endpoint.  The embedded default writes each process's
spans to its own file in one run directory.  The demo runs a handful of rollouts, stops
Gym the way a user does (SIGINT), then shows one rollout's trace with
``gym-autoinstr view`` and writes the same waterfall as an HTML page.

    ./run-demo [--rollouts N] [--gym-version 0.4.0] [--workdir DIR]

With ``--backend mlflow`` the rollouts go to a trace UI instead: an MLflow tracking
server (its own venv, SQLite store under the work directory) is started, Gym exports to
it over OTLP/HTTP (all span groups, so model calls show token usage), and the demo prints
the URL to open and keeps MLflow running until Enter or Ctrl-C.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gym_autoinstr.commands.view.model import build_traces  # noqa: E402
from gym_autoinstr.setup.files import (  # noqa: E402
    LOGS_SUFFIX,
    METRICS_SUFFIX,
    read_path,  # noqa: E402
)
from tests.harness.gym_install import gym_venv  # noqa: E402
from tests.harness.trio import GymTrio, PolicyModel  # noqa: E402


def progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    end = "\n" if done == total else ""
    sys.stdout.write(
        f"\r  rollouts [{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {time.monotonic() - started:5.1f}s{end}"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--gym-version", default="0.4.0")
    parser.add_argument("--workdir", help="where Gym runs and the traces are written (default: a new temp dir)")
    parser.add_argument(
        "--backend", choices=["mlflow"], help="send the traces to this UI, started locally, and print its URL"
    )
    args = parser.parse_args()
    if args.backend == "mlflow":
        return with_mlflow(args)

    print(f"preparing nemo-gym {args.gym_version} with gym-autoinstr (the first run installs; later runs reuse it)...")
    venv = gym_venv(args.gym_version)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gym-autoinstr-demo-")).resolve()
    with PolicyModel() as model:
        trio = GymTrio(venv, args.gym_version, workdir, policy_url=model.url, instrument=True)
        print("starting Gym: opentelemetry-instrument gym env start ...")
        trio.start()
        print(f"  {len(trio.server_names)} servers ready in {trio.startup_seconds:.1f}s")
        started = time.monotonic()
        results = []
        try:
            for i in range(args.rollouts):
                results.append(trio.rollout())
                progress(i + 1, args.rollouts, started)
        finally:
            print("stopping Gym (SIGINT, as a user would)...")
            trio.stop()
    print(f"  rewards: {[r.get('reward') for r in results]}")

    run_dirs = sorted((workdir / "gym-autoinstr-runs").glob("*"))
    if not run_dirs:
        print("no trace files were written; Gym's log:\n" + trio.log_tail(40))
        return 1
    run_dir = run_dirs[-1]
    traces = [t for t in build_traces(read_path(run_dir)) if any(s["name"] == "POST /run" for s in t.spans)]
    span_files = [p for p in run_dir.glob("*.jsonl") if not p.name.endswith((METRICS_SUFFIX, LOGS_SUFFIX))]
    print(
        f"\n{len(traces)} rollouts -> {len(traces)} traces, {len(span_files)} trace files "
        f"(one per process) in\n  {run_dir}\n"
    )
    if not traces:
        return 1
    gym_autoinstr = str(venv / "bin" / "gym-autoinstr")
    rollout_ids = sorted(traces[-1].rollout_ids)
    view = [gym_autoinstr, "view", str(run_dir)] + (
        ["--rollout", rollout_ids[0]] if rollout_ids else ["--trace", traces[-1].trace_id]
    )
    print("$ gym-autoinstr view " + " ".join(view[2:]))
    subprocess.run(view, check=True)
    page = workdir / "traces.html"
    subprocess.run([gym_autoinstr, "view", str(run_dir), "--html", str(page)], check=True, stdout=subprocess.DEVNULL)
    print(f"\nall {len(traces)} traces as one HTML page: {page}")
    return 0


def with_mlflow(args: argparse.Namespace) -> int:
    from tests.harness.mlflow_backend import MlflowServer

    print(
        f"preparing nemo-gym {args.gym_version} with gym-autoinstr, and MLflow "
        "(the first run installs; later runs reuse them)..."
    )
    venv = gym_venv(args.gym_version)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gym-autoinstr-demo-")).resolve()
    with PolicyModel() as model, MlflowServer(workdir / "mlflow") as mlflow:
        experiment = mlflow.create_experiment("gym-autoinstr-demo")
        env = {**mlflow.otlp_env(experiment), "GYM_AUTOINSTR_SPAN_GROUPS": "all"}
        print(f"MLflow tracking server at {mlflow.url} (store: {mlflow.workdir / 'mlflow.db'})")
        for name, value in env.items():
            print(f"  {name}={value}")
        trio = GymTrio(venv, args.gym_version, workdir, policy_url=model.url, env=env, instrument=True)
        print("starting Gym: opentelemetry-instrument gym env start ...")
        trio.start()
        started = time.monotonic()
        results = []
        try:
            for i in range(args.rollouts):
                results.append(trio.rollout())
                progress(i + 1, args.rollouts, started)
            # Spans leave every second; wait for them in MLflow rather than rely on the
            # time-boxed flush at Gym's shutdown.
            traces = mlflow.wait_for_rollouts(experiment, len(results))
        finally:
            print("stopping Gym (SIGINT, as a user would)...")
            trio.stop()
        print(f"  rewards: {[r.get('reward') for r in results]}")
        print(f"\n{len(traces)} traces in MLflow experiment {experiment}:")
        for trace in traces:
            print(f"  {trace['trace_id']}  {len(trace['spans'])} spans  {trace['state'].rsplit('.', 1)[-1]}")
        print(f"\nopen {mlflow.traces_url(experiment)}")
        if traces:
            print(f"one rollout: {mlflow.trace_url(experiment, traces[0]['trace_id'])}")
        print("MLflow keeps running; press Enter (or Ctrl-C) to stop it.", flush=True)
        try:
            sys.stdin.readline()
        except KeyboardInterrupt:
            pass
    return 0 if sum(t["state"].endswith("OK") for t in traces) >= args.rollouts else 1


if __name__ == "__main__":
    sys.exit(main())
