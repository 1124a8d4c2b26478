"""Each rollout's outcome on its trace (issue #53), on real Gym 0.4.0 and 0.7.0.

One fleet per release, with a resources server whose verify returns each task's own
reward (tests/fixtures/graded; on 0.7 one task's samples are masked), under
``opentelemetry-instrument`` with the default span groups, exporting through a real
collector.  Gym's own collection driver runs four tasks twice each; one more rollout is
sent straight to the fleet.  What Gym wrote to its output file is the truth every
exported span and metric is checked against: reward, task and repeat index and tokens on
each rollout's root, the verifier's reward on the call that asked for it, tokens on every
model call, the tool call as a GenAI tool execution, and the reward histogram's count and
sum.
"""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict

import pytest

from tests.harness.collector import Collector
from tests.harness.gym_install import gym_venv
from tests.harness.metrics import latest, metric_points
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL, GymTrio

pytestmark = pytest.mark.realgym

REWARDS = (0.0, 0.5, 1.0, 0.75)  # task index -> its reward
MASKED_TASK = 1  # on 0.7: its samples' mask_sample is true
REPEATS = 2
DIRECT_REWARD = 0.25
COLLECT_SERVICE = "nemo-gym/collect"
RESOURCES = "graded"


def _service(span: dict) -> str:
    return span["resource"].get("service.name", "")


class Run:
    """One release's fleet, its collection run and what both exported."""

    def __init__(self, version: str, spans: list[dict], points: list[dict], rows: list[dict], direct: dict) -> None:
        self.version, self.spans, self.points, self.rows, self.direct = version, spans, points, rows, direct
        self.traces: dict[str, list[dict]] = defaultdict(list)
        for span in spans:
            self.traces[span["trace_id"]].append(span)


@pytest.fixture(scope="module", params=["0.4.0", "0.7.0"])
def run(request, tmp_path_factory, policy_model) -> Run:
    version = request.param
    workdir = tmp_path_factory.mktemp(f"outcome-{version}")
    masks = version >= "0.7"
    with Collector(log_dir=workdir / "collector") as collector:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        }
        with GymTrio(
            gym_venv(version), version, workdir / "gym", policy_model.url, env=env, instrument=True, resources=RESOURCES
        ) as trio:
            row = trio.default_row()
            tasks = [
                {**row, "verifier_metadata": {"reward": reward, "mask": masks and task == MASKED_TASK}}
                for task, reward in enumerate(REWARDS)
            ]
            output, done = trio.collect(tasks, workdir / "collect", num_repeats=REPEATS)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            # straight to the agent (0.7's environment server relays /run as bytes it never
            # parses: a rollout sent to it has its outcome on the agent's spans, not its root)
            direct = _post(trio.url(AGENT) + "/run", {**row, "verifier_metadata": {"reward": DIRECT_REWARD}})
            rollouts = len(REWARDS) * REPEATS + 1

            def complete(spans: list[dict]) -> bool:
                return sum(s["name"] == "gym.rollout" for s in spans) >= rollouts and any(
                    s["name"] == "gym.job" for s in spans
                )

            assert collector.sink.wait_for(complete, timeout=60), sorted({s["name"] for s in collector.sink.spans()})

            def counted(points: list[dict]) -> bool:
                found = latest(points, "gym.rollout.reward")
                return sum(p["value"] for p in found.values()) >= rollouts

            assert collector.sink.wait_for(lambda _: counted(metric_points(collector.sink)), timeout=30)
        spans = collector.sink.spans()
        points = metric_points(collector.sink)
    rows = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    assert len(rows) == len(REWARDS) * REPEATS
    return Run(version, spans, points, rows, direct)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _job_rollout_roots(run: Run) -> list[dict]:
    return [
        s
        for s in run.spans
        if s["kind"] == "CLIENT" and _service(s) == COLLECT_SERVICE and s["attributes"].get("url.template") == "/run"
    ]


def test_every_collected_rollout_root_says_its_reward_task_repeat_and_tokens(run):
    roots = _job_rollout_roots(run)
    assert len(roots) == len(run.rows)
    assert all(root["parent_span_id"] is None for root in roots)  # each a trace of its own
    by_identity = {(row["_ng_task_index"], row["_ng_rollout_index"]): row for row in run.rows}
    seen = set()
    for root in roots:
        attributes = root["attributes"]
        identity = (attributes["nemo.gym.task.index"], attributes["nemo.gym.rollout.index"])
        row = by_identity[identity]  # the trace joins its row in Gym's output file
        seen.add(identity)
        assert attributes["nemo.gym.reward"] == row["reward"] == REWARDS[identity[0]]
        usage = row["response"]["usage"]
        assert attributes["nemo.gym.rollout.usage.input_tokens"] == usage["input_tokens"] > 0
        assert attributes["nemo.gym.rollout.usage.output_tokens"] == usage["output_tokens"] > 0
        assert "gen_ai.usage.input_tokens" not in attributes  # a UI adds those up: the calls carry them
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        expected_agent = ENVIRONMENT if run.version >= "0.7" else AGENT
        assert attributes["gen_ai.agent.name"] == expected_agent
        if run.version >= "0.7":
            assert attributes["nemo.gym.mask_sample"] is (identity[0] == MASKED_TASK) is row["mask_sample"]
        else:
            assert "nemo.gym.mask_sample" not in attributes
        # the span still ends when its answer was in, not after the rest of the trace
        trace = run.traces[root["trace_id"]]
        assert max(s["end_time_unix_nano"] for s in trace) <= root["end_time_unix_nano"]
    assert seen == {(task, repeat) for task in range(len(REWARDS)) for repeat in range(REPEATS)}


def test_a_rollout_sent_straight_to_the_fleet_has_its_reward_on_its_root(run):
    collected = {s["trace_id"] for s in _job_rollout_roots(run)}
    roots = [s for s in run.spans if s["parent_span_id"] is None and s["name"] == "POST /run"]
    (root,) = [s for s in roots if s["kind"] == "SERVER" and s["trace_id"] not in collected]
    assert root["attributes"]["nemo.gym.reward"] == run.direct["reward"] == DIRECT_REWARD
    (rollout,) = [s for s in run.traces[root["trace_id"]] if s["name"] == "gym.rollout"]
    assert rollout["attributes"]["nemo.gym.reward"] == DIRECT_REWARD
    assert rollout["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert rollout["attributes"]["gen_ai.agent.name"] == AGENT
    usage = run.direct["response"]["usage"]
    assert rollout["attributes"]["nemo.gym.rollout.usage.input_tokens"] == usage["input_tokens"]
    assert root["attributes"]["nemo.gym.rollout.usage.output_tokens"] == usage["output_tokens"]


def test_model_tool_and_verify_calls_carry_their_tokens_tool_and_reward(run):
    """Inside each rollout: the agent's model calls as GenAI chat with their tokens, its tool
    call as a tool execution, its /verify call with the verifier's reward."""
    for root in _job_rollout_roots(run):
        trace = run.traces[root["trace_id"]]
        agent_calls = [s for s in trace if s["kind"] == "CLIENT" and _service(s) == f"nemo-gym/{AGENT}"]
        chats = [s for s in agent_calls if s["attributes"].get("nemo.gym.http.destination.server.name") == MODEL]
        assert len(chats) == 2  # the tool call's turn and the answer's
        for chat in chats:
            assert chat["attributes"]["gen_ai.operation.name"] == "chat"
            assert chat["attributes"]["gen_ai.usage.input_tokens"] > 0
            assert chat["attributes"]["gen_ai.usage.output_tokens"] > 0
        # the rollout's total is the sum over its model calls (the agent adds them up)
        assert (
            sum(c["attributes"]["gen_ai.usage.input_tokens"] for c in chats)
            == root["attributes"]["nemo.gym.rollout.usage.input_tokens"]
        )
        (tool,) = [s for s in agent_calls if s["attributes"].get("gen_ai.operation.name") == "execute_tool"]
        assert tool["attributes"]["gen_ai.tool.name"] == "get_weather"
        assert tool["attributes"]["nemo.gym.http.destination.server.name"] == RESOURCES
        (verify,) = [s for s in agent_calls if s["attributes"].get("url.template") == "/verify"]
        assert verify["attributes"]["nemo.gym.reward"] == root["attributes"]["nemo.gym.reward"]
        (rollout,) = [s for s in trace if s["name"] == "gym.rollout"]
        assert rollout["attributes"]["nemo.gym.reward"] == root["attributes"]["nemo.gym.reward"]
        assert rollout["attributes"]["nemo.gym.task.index"] == root["attributes"]["nemo.gym.task.index"]


def test_the_reward_histogram_counts_and_sums_the_rewards_gym_wrote(run):
    points = latest(run.points, "gym.rollout.reward")
    assert points, "no gym.rollout.reward points"
    assert {p["service"] for p in points.values()} == {f"nemo-gym/{AGENT}"}
    expected = [row["reward"] for row in run.rows] + [DIRECT_REWARD]
    assert sum(p["value"] for p in points.values()) == len(expected)
    assert sum(p["sum"] for p in points.values()) == pytest.approx(sum(expected))
    for point in points.values():
        assert point["attributes"]["gen_ai.agent.name"] == AGENT
        assert point["attributes"]["nemo.gym.resources_server.name"] == RESOURCES
        assert point["unit"] == "1"
    masked = [p for p in points.values() if p["attributes"]["nemo.gym.mask_sample"]]
    if run.version >= "0.7":
        (point,) = masked
        assert point["value"] == REPEATS and point["sum"] == pytest.approx(REPEATS * REWARDS[MASKED_TASK])
    else:
        assert not masked
