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
it over OTLP/HTTP (all span groups), the rollouts and a small collection job run, and the
demo prints the URL to open and keeps MLflow running until Enter or Ctrl-C.  ``--backend phoenix``
does the same with Arize Phoenix (``phoenix serve``, its own venv and SQLite, OTLP/HTTP
into the project ``gym-autoinstr-demo``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="run-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--gym-version", default="0.4.0")
    parser.add_argument(
        "--workdir", help="where Gym runs and the traces are written (default: a new .cache/demo/<time>)"
    )
    parser.add_argument(
        "--backend",
        choices=("mlflow", "phoenix"),
        help="send the traces to this UI, started locally, and print its URL",
    )
    return parser.parse_args()


if __name__ == "__main__":
    options()  # before the imports below (Gym's venv): --help, and a wrong option, need only python3

from gym_autoinstr.commands.view.model import build_traces  # noqa: E402
from gym_autoinstr.setup.files import (  # noqa: E402
    embedded_default_applies,
    read_path,
    span_segments,
)
from tests.harness.gym_install import gym_venv  # noqa: E402
from tests.harness.trio import AGENT, GymTrio, PolicyModel  # noqa: E402


def progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    end = "\n" if done == total else ""
    sys.stdout.write(
        f"\r  rollouts [{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {time.monotonic() - started:5.1f}s{end}"
    )
    sys.stdout.flush()


DEMO_RUNS = REPO / ".cache" / "demo"  # each run's work directory; the newest KEEP_RUNS kept
KEEP_RUNS = 5
COLLECT_ROWS, COLLECT_REPEATS = 2, 2


def _work_directory(asked: str | None) -> Path:
    """``--workdir``, else a new ``.cache/demo/<time>`` (older demo runs beyond the newest
    ``KEEP_RUNS`` removed: nothing piles up in the system's temp directory)."""
    if asked:
        return Path(asked).resolve()
    DEMO_RUNS.mkdir(parents=True, exist_ok=True)
    for old in sorted(p for p in DEMO_RUNS.iterdir() if p.is_dir())[: -(KEEP_RUNS - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    workdir = DEMO_RUNS / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir()
    return workdir


def _user_settings() -> dict[str, str]:
    """The user's own GYM_AUTOINSTR_* and OTEL_* settings: the demo's Gym runs with them."""
    return {k: v for k, v in os.environ.items() if k.startswith(("GYM_AUTOINSTR_", "OTEL_"))}


def _collect(trio: GymTrio, venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A small collection job, as the README's step 3 runs one: ``opentelemetry-instrument
    ng_collect_rollouts`` from the directory Gym runs in (it joins the fleet's run)."""
    rows = trio.workdir / "collect-rows.jsonl"
    rows.write_text("".join(json.dumps(trio.default_row()) + "\n" for _ in range(COLLECT_ROWS)))
    command = [
        str(venv / "bin" / "opentelemetry-instrument"),
        str(venv / "bin" / "ng_collect_rollouts"),
        f"+config_paths=[{trio.config_path}]",
        f"+agent_name={AGENT}",
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={trio.workdir / 'collected-rollouts.jsonl'}",
        f"+num_repeats={COLLECT_REPEATS}",
        "+upload_rollouts_to_wandb=false",
    ]
    environment = {**trio.environment(), **env}
    return subprocess.run(command, cwd=trio.workdir, env=environment, capture_output=True, text=True, timeout=300)


def main() -> int:
    args = options()
    if args.backend:
        return with_backend(args)

    print(f"preparing nemo-gym {args.gym_version} with gym-autoinstr (the first run installs; later runs reuse it)...")
    venv = gym_venv(args.gym_version)
    workdir = _work_directory(args.workdir)
    settings = _user_settings()
    if settings:
        print("your settings, passed to Gym: " + ", ".join(sorted(settings)))
    to_files = embedded_default_applies(settings)
    with PolicyModel() as model:
        # Gym starts its own Ray, as it does for a user
        trio = GymTrio(venv, args.gym_version, workdir, model.url, env=settings, instrument=True, own_ray=True)
        print("starting Gym: opentelemetry-instrument gym env start ...")
        trio.start()
        print(f"  {len(trio.server_names)} servers ready in {trio.startup_seconds:.1f}s")
        started = time.monotonic()
        results = []
        try:
            for i in range(args.rollouts):
                results.append(trio.rollout())
                progress(i + 1, args.rollouts, started)
            print(
                f"a collection job: opentelemetry-instrument ng_collect_rollouts "
                f"({COLLECT_ROWS} tasks x {COLLECT_REPEATS} repeats) ..."
            )
            collected = _collect(trio, venv, settings)
        finally:
            print("stopping Gym (SIGINT, as a user would)...")
            trio.stop()
    print(f"  rewards: {[r.get('reward') for r in results]}")
    if collected.returncode != 0:
        print("the collection job failed:\n" + collected.stderr[-3000:])
        return 1
    if not to_files:
        print("\nyour settings send the traces to your exporter, not to local files: look for them there.")
        return 0

    run_dirs = sorted((workdir / "gym-autoinstr-runs").glob("*"))
    if len(run_dirs) != 1:
        print(f"expected one run directory, found {len(run_dirs)}; Gym's log:\n" + trio.log_tail(40))
        return 1
    run_dir = run_dirs[0]
    traces = build_traces(read_path(run_dir))
    rollouts = [t for t in traces if any(s["name"] == "POST /run" and s["kind"] == "SERVER" for s in t.spans)]
    span_files = span_segments(run_dir)
    print(
        f"\n{len(rollouts)} rollouts ({args.rollouts} sent one by one, {COLLECT_ROWS * COLLECT_REPEATS} by the "
        f"collection job) -> {len(rollouts)} traces, {len(span_files)} trace files (one per process) in\n  {run_dir}\n"
    )
    if not rollouts:
        return 1
    gym_autoinstr = venv / "bin" / "gym-autoinstr"
    shown = _shown_path(gym_autoinstr)
    print(f"$ {shown} view {_shown_path(run_dir)}")
    subprocess.run([str(gym_autoinstr), "view", str(run_dir)], check=True)
    rollout_ids = sorted(rollouts[-1].rollout_ids)
    pick = ["--rollout", rollout_ids[0]] if rollout_ids else ["--trace", rollouts[-1].trace_id]
    print(f"\n$ {shown} view {_shown_path(run_dir)} {' '.join(pick)}")
    subprocess.run([str(gym_autoinstr), "view", str(run_dir), *pick], check=True)
    page = workdir / "traces.html"
    html = [str(gym_autoinstr), "view", str(run_dir), "--html", str(page)]
    subprocess.run(html, check=True, stdout=subprocess.DEVNULL)
    print(f"\nall {len(traces)} traces as one HTML page: {page}")
    print(f"(gym-autoinstr is in the demo's venv: `source {_shown_path(venv / 'bin' / 'activate')}` puts it on PATH)")
    return 0


def _shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it is inside it (shorter to copy)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _Mlflow:
    """The MLflow side of ``--backend mlflow``: an experiment, its OTLP recipe, its traces."""

    label, noun = "MLflow", "experiment"

    def __init__(self, workdir: Path) -> None:
        from tests.harness.mlflow_backend import MlflowServer

        self.server = MlflowServer(workdir / "mlflow")

    def open(self) -> dict[str, str]:
        self.target = self.server.create_experiment("gym-autoinstr-demo")
        print(f"MLflow tracking server at {self.server.url} (store: {self.server.workdir / 'mlflow.db'})")
        return self.server.otlp_env(self.target)

    def wait(self, count: int) -> list[dict]:
        return self.server.wait_for_rollouts(self.target, count)

    def describe(self, trace: dict) -> str:
        return f"{len(trace['spans'])} spans  {trace['state'].rsplit('.', 1)[-1]}"

    def urls(self, traces: list[dict]) -> tuple[str, str | None]:
        one = self.server.trace_url(self.target, traces[0]["trace_id"]) if traces else None
        return self.server.traces_url(self.target), one


class _Phoenix:
    """The Arize Phoenix side of ``--backend phoenix``: a project, its recipe, its traces."""

    label, noun = "Phoenix", "project"

    def __init__(self, workdir: Path) -> None:
        from tests.harness.phoenix_backend import PhoenixServer

        self.server = PhoenixServer(workdir / "phoenix")
        self.target = "gym-autoinstr-demo"

    def open(self) -> dict[str, str]:
        print(f"Phoenix at {self.server.url} (store: {self.server.workdir / 'phoenix.db'})")
        return self.server.otlp_env(self.target)

    def wait(self, count: int) -> list[dict]:
        return self.server.wait_for_rollouts(self.target, count)

    def describe(self, trace: dict) -> str:
        kinds: dict[str, int] = {}
        for span in trace["spans"]:
            kinds[span["span_kind"]] = kinds.get(span["span_kind"], 0) + 1
        return f"{len(trace['spans'])} spans (" + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) + ")"

    def urls(self, traces: list[dict]) -> tuple[str, str | None]:
        one = self.server.trace_url(self.target, traces[0]["trace_id"]) if traces else None
        return self.server.traces_url(self.target), one


BACKENDS = {"mlflow": _Mlflow, "phoenix": _Phoenix}


def with_backend(args: argparse.Namespace) -> int:
    """The rollouts, and a small collection job, into a trace UI started locally."""
    backend_class = BACKENDS[args.backend]
    print(
        f"preparing nemo-gym {args.gym_version} with gym-autoinstr, and {backend_class.label} "
        "(the first run installs; later runs reuse them)..."
    )
    venv = gym_venv(args.gym_version)
    workdir = _work_directory(args.workdir)
    backend = backend_class(workdir)
    with PolicyModel() as model, backend.server:
        # otlp,files: the UI, and the run directory's local copy that `gym-autoinstr export
        # RUN --to phoenix|mlflow` reads to send the rewards as the UI's scores
        env = {**backend.open(), "GYM_AUTOINSTR_SPAN_GROUPS": "all", "OTEL_TRACES_EXPORTER": "otlp,files"}
        for name, value in env.items():
            print(f"  {name}={value}")
        trio = GymTrio(venv, args.gym_version, workdir, policy_url=model.url, env=env, instrument=True, own_ray=True)
        print("starting Gym: opentelemetry-instrument gym env start ...")
        trio.start()
        started = time.monotonic()
        results = []
        try:
            for i in range(args.rollouts):
                results.append(trio.rollout())
                progress(i + 1, args.rollouts, started)
            print(
                f"a collection job: opentelemetry-instrument ng_collect_rollouts ({COLLECT_ROWS} tasks x "
                f"{COLLECT_REPEATS} repeats)..."
            )
            # the job's own span (gym.job) ends as the job exits: its flush may wait longer
            # for a UI that writes each export to its database before answering
            collected = _collect(trio, venv, {**env, "GYM_AUTOINSTR_FLUSH_TIMEOUT_MS": "5000"})
            # Spans leave every second; wait for them in the UI rather than rely on the
            # time-boxed flush at Gym's shutdown.
            expected = len(results) + (COLLECT_ROWS * COLLECT_REPEATS if collected.returncode == 0 else 0)
            traces = backend.wait(expected)
        finally:
            print("stopping Gym (SIGINT, as a user would)...")
            trio.stop()
        print(f"  rewards: {[r.get('reward') for r in results]}")
        if collected.returncode != 0:
            print("the collection job failed:\n" + collected.stderr[-3000:])
        print(f"\n{len(traces)} rollout traces in {backend.label} {backend.noun} {backend.target}:")
        for trace in traces:
            print(f"  {trace['trace_id']}  {backend.describe(trace)}")
        every, one = backend.urls(traces)
        print(f"\nopen {every}")
        if one:
            print(f"one rollout: {one}")
        print(f"{backend.label} keeps running; press Enter (or Ctrl-C) to stop it.", flush=True)
        try:
            sys.stdin.readline()
        except KeyboardInterrupt:
            pass
    return 0 if collected.returncode == 0 and len(traces) >= expected else 1


if __name__ == "__main__":
    sys.exit(main())
