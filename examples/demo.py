"""The main job: real NeMo Gym processes, one traced rollout, shown as a tree.

Starts a deterministic OpenAI-compatible policy model (``examples/policy_model.py``),
an OTLP receiver, and the real ``gym env start`` (agent + model + resources servers,
each its own process) under ``opentelemetry-instrument`` with gym-autoinstr; runs a
handful of rollouts, stops Gym the way a user does (SIGINT), and prints one rollout's
trace: service, span, kind, duration.

    ./run-demo [--rollouts N] [--gym-version 0.4.0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gym_autoinstr.tree import group_by_trace, render_trace  # noqa: E402
from tests.harness.collector import OtlpSink  # noqa: E402
from tests.harness.gym_install import gym_venv  # noqa: E402
from tests.harness.trio import GymTrio, PolicyModel  # noqa: E402


def progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    sys.stdout.write(f"\r  rollouts [{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {time.monotonic() - started:5.1f}s")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--gym-version", default="0.4.0")
    args = parser.parse_args()

    print(f"preparing nemo-gym {args.gym_version} with gym-autoinstr (first run installs, later runs reuse)...")
    venv = gym_venv(args.gym_version)
    workdir = Path(tempfile.mkdtemp(prefix="gym-autoinstr-demo-"))
    with OtlpSink() as sink, PolicyModel() as model:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        trio = GymTrio(venv, args.gym_version, workdir, policy_url=model.url, instrument=True, env=env)
        print(f"starting Gym: opentelemetry-instrument gym env start ... (in {workdir})")
        trio.start()
        print(f"  {len(trio.server_names)} servers ready in {trio.startup_seconds:.1f}s")
        started = time.monotonic()
        results = []
        try:
            for i in range(args.rollouts):
                results.append(trio.rollout())
                progress(i + 1, args.rollouts, started)
            print()
        finally:
            print("stopping Gym (SIGINT, as a user would)...")
            trio.stop()
        rewards = [r.get("reward") for r in results]
        print(f"  rewards: {rewards}")
        sink.wait_for(lambda spans: len(group_by_trace(spans)) >= args.rollouts, timeout=10)
        traces = group_by_trace(sink.spans())
        rollout_traces = [t for t in traces.values() if any(s["name"] == "POST /run" for s in t)]
        if not rollout_traces:
            print("no rollout trace arrived; Gym's log:\n" + trio.log_tail(40))
            return 1
        last = max(rollout_traces, key=lambda t: min(s["start_ns"] for s in t))
        print(f"\n{len(rollout_traces)} rollouts -> {len(rollout_traces)} traces; the last one:\n")
        print(render_trace(last))
        print(f"\nGym's log and config: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
