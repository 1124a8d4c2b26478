"""Each rollout's outcome on its trace (issue #53), on real Gym 0.4.0 and 0.7.0.

The session's collection-job fleets (``job_fleets``, tests/harness/jobs.py: the default
span groups, a resources server whose verify returns each task's own reward, a real
collector) run Gym's own collection driver on four tasks twice each (on 0.7 one task's
samples masked); one more rollout is sent straight to the agent.  What Gym wrote to its
output file is the truth every exported span and metric is checked against: reward, task
and repeat index and tokens on each rollout's root, the verifier's reward on the call
that asked for it, tokens on every model call, the tool call as a GenAI tool execution,
and the reward histogram's count and sum.  Then a job sampled by task: every repeat of a
task kept or dropped together.  Last, `gym-autoinstr view` on a job of 300 rollouts
(the fleet's run directory): the outcome columns, the reward filter and sort, the per-task
table and the page's reward chart, against Gym's output file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.commands.view_helpers import _dom
from tests.harness.jobs import RESOURCES, output_rows
from tests.harness.metrics import latest, metric_points
from tests.harness.traces import by_trace, job_spans, linked_rollout_roots, service_of, spans_since
from tests.harness.trio import AGENT, ENVIRONMENT, MODEL

pytestmark = pytest.mark.realgym

REWARDS = (0.0, 0.5, 1.0, 0.75)  # task index -> its reward
MASKED_TASK = 1  # on 0.7: its samples' mask_sample is true
REPEATS = 2
DIRECT_REWARD = 0.25


class Run:
    """One collection job of graded tasks and one direct rollout, and what they exported."""

    def __init__(self, version, spans, rows, direct, rewards_before, rewards_after) -> None:
        self.version, self.spans, self.rows, self.direct = version, spans, rows, direct
        self.rewards_before, self.rewards_after = rewards_before, rewards_after
        self.traces = by_trace(spans)
        (self.job,) = job_spans(spans)
        self.roots = linked_rollout_roots(spans, self.job)


def _reward_points(fleet) -> dict:
    return latest(metric_points(fleet.collector.sink), "gym.rollout.reward")


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module", params=["0.4.0", "0.7.0"])
def run(request, job_fleets) -> Run:
    version = request.param
    fleet = job_fleets(version)
    row = fleet.trio.default_row()
    masks = version >= "0.7"
    before = _reward_points(fleet)
    tasks = [
        {**row, "verifier_metadata": {"reward": reward, "mask": masks and task == MASKED_TASK}}
        for task, reward in enumerate(REWARDS)
    ]
    start_ns, output = fleet.collect(rows=tasks, repeats=REPEATS, parallel=4)
    # straight to the agent (0.7's environment server relays /run as bytes it never
    # parses: a rollout sent to it has its outcome on the agent's spans, not its root)
    direct = _post(fleet.trio.url(AGENT) + "/run", {**row, "verifier_metadata": {"reward": DIRECT_REWARD}})
    expected = len(REWARDS) * REPEATS + 1
    spans = fleet.wait_for_rollouts(start_ns, expected)

    def counted() -> bool:
        now = _reward_points(fleet)
        return sum(p["value"] for p in now.values()) - sum(p["value"] for p in before.values()) >= expected

    assert fleet.collector.sink.wait_for(lambda _: counted(), timeout=30)
    time.sleep(1)  # one more export: the count stays
    return Run(version, spans, output_rows(output), direct, before, _reward_points(fleet))


def test_every_collected_rollout_root_says_its_reward_task_repeat_and_tokens(run):
    roots = run.roots
    assert len(roots) == len(run.rows) == len(REWARDS) * REPEATS
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
        assert attributes["gen_ai.agent.name"] == (ENVIRONMENT if run.version >= "0.7" else AGENT)
        if run.version >= "0.7":
            assert attributes["nemo.gym.mask_sample"] is (identity[0] == MASKED_TASK) is row["mask_sample"]
        else:
            assert "nemo.gym.mask_sample" not in attributes
        # held for Gym's parse, the root still ends when its answer was in, after its trace
        trace = run.traces[root["trace_id"]]
        assert max(s["end_ns"] for s in trace) <= root["end_ns"]
        assert root["status"] != "ERROR"
    assert seen == {(task, repeat) for task in range(len(REWARDS)) for repeat in range(REPEATS)}


def test_a_rollout_sent_straight_to_the_agent_has_its_reward_on_its_root(run):
    collected = {r["trace_id"] for r in run.roots}
    (root,) = [
        s
        for s in run.spans
        if s["parent_span_id"] is None
        and s["kind"] == "SERVER"
        and s["name"] == "POST /run"
        and s["trace_id"] not in collected
    ]
    assert service_of(root) == f"nemo-gym/{AGENT}"
    assert root["attributes"]["nemo.gym.reward"] == run.direct["reward"] == DIRECT_REWARD
    usage = run.direct["response"]["usage"]
    assert root["attributes"]["nemo.gym.rollout.usage.output_tokens"] == usage["output_tokens"]
    (rollout,) = [s for s in run.traces[root["trace_id"]] if s["name"] == "gym.rollout"]
    assert rollout["attributes"]["nemo.gym.reward"] == DIRECT_REWARD
    assert rollout["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert rollout["attributes"]["gen_ai.agent.name"] == AGENT
    assert rollout["attributes"]["nemo.gym.rollout.usage.input_tokens"] == usage["input_tokens"]
    # the reward as the GenAI evaluation result of the agent invocation (logs are off here)
    assert rollout["events"] == ["gen_ai.evaluation.result"]
    assert rollout["event_attributes"] == [
        {"gen_ai.evaluation.name": RESOURCES, "gen_ai.evaluation.score.value": DIRECT_REWARD}
    ]


def test_model_tool_and_verify_calls_carry_their_tokens_tool_and_reward(run):
    """Inside each rollout: the agent's model calls as GenAI chat with their tokens, its tool
    call as a tool execution, its /verify call with the verifier's reward."""
    for root in run.roots:
        trace = run.traces[root["trace_id"]]
        agent_calls = [s for s in trace if s["kind"] == "CLIENT" and service_of(s) == f"nemo-gym/{AGENT}"]
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
    def totals(points, masked=None):
        chosen = [p for p in points.values() if masked is None or p["attributes"].get("nemo.gym.mask_sample") is masked]
        return sum(p["value"] for p in chosen), sum(p["sum"] for p in chosen)

    count_before, sum_before = totals(run.rewards_before)
    count_after, sum_after = totals(run.rewards_after)
    expected = [row["reward"] for row in run.rows] + [DIRECT_REWARD]
    assert count_after - count_before == len(expected)
    assert sum_after - sum_before == pytest.approx(sum(expected))
    for point in run.rewards_after.values():
        assert point["service"] == f"nemo-gym/{AGENT}" and point["unit"] == "1"
        assert point["attributes"]["gen_ai.agent.name"] == AGENT
        assert point["attributes"]["nemo.gym.resources_server.name"] == RESOURCES
    masked_count = totals(run.rewards_after, True)[0] - totals(run.rewards_before, True)[0]
    assert masked_count == (REPEATS if run.version >= "0.7" else 0)


def test_sampling_by_task_keeps_every_repeat_of_a_task_together(job_fleets):
    """``GYM_AUTOINSTR_SAMPLING_UNIT=task`` with a ratio sampler, in the collection process
    only: each task's repeats are all kept (whole rollouts) or all dropped."""
    fleet = job_fleets("0.4.0")
    row = fleet.trio.default_row()
    tasks, repeats = 12, 3
    start_ns, output = fleet.collect(
        rows=[{**row, "verifier_metadata": {"reward": task / tasks}} for task in range(tasks)],
        repeats=repeats,
        parallel=6,
        env={
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
            "GYM_AUTOINSTR_SAMPLING_UNIT": "task",
        },
    )
    assert len(output_rows(output)) == tasks * repeats  # sampling changes nothing in Gym
    fleet.collector.sink.wait_for(lambda spans: job_spans(spans_since(spans, start_ns)), timeout=60)
    time.sleep(4)  # every server's last batches
    spans = spans_since(fleet.collector.sink.spans(), start_ns)
    (job,) = job_spans(spans)
    roots = linked_rollout_roots(spans, job)
    kept: dict[int, int] = {}
    for root in roots:
        task = root["attributes"]["nemo.gym.task.index"]
        kept[task] = kept.get(task, 0) + 1
    assert set(kept.values()) <= {repeats}  # whole groups only
    # Binomial(12, 0.5) tasks: none or all kept has probability 2/4096
    assert 0 < len(kept) < tasks, kept
    assert sum(s["name"] == "gym.rollout" for s in spans) == len(roots)


VIEW_TASKS, VIEW_REPEATS = 100, 3


def _view(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gym_autoinstr", "view", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_view_answers_outcome_questions_on_a_real_job_of_300_rollouts(job_fleets, tmp_path):
    """``gym-autoinstr view`` on what a real job wrote to its run directory (every process's
    file): a trace per rollout with its reward, task and repeat as Gym's output file has
    them, ``--where``, ``--sort reward``, ``--by-task`` and the HTML page's reward chart."""
    fleet = job_fleets("0.4.0")
    row = fleet.trio.default_row()
    rewards = [(task % 5) / 4 for task in range(VIEW_TASKS)]  # 0, 0.25, 0.5, 0.75, 1, 0, ...
    start_ns, output = fleet.collect(
        # (a row's own "row" makes it a task of its own: Gym's driver groups identical rows)
        rows=[{**row, "verifier_metadata": {"reward": reward, "row": task}} for task, reward in enumerate(rewards)],
        repeats=VIEW_REPEATS,
        parallel=16,
    )
    rows = output_rows(output)
    assert len(rows) == VIEW_TASKS * VIEW_REPEATS
    (job,) = job_spans(fleet.wait_for_rollouts(start_ns, len(rows)))
    only_this_job = ["--attr", f"nemo.gym.job.id={job['attributes']['nemo.gym.job.id']}"]
    directory = str(fleet.files)

    listed = json.loads(_view(directory, *only_this_job, "--json"))["traces"]
    rollouts = [t for t in listed if t["task_index"] is not None]
    by_identity = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in rows}
    assert sorted((t["task_index"], t["rollout_index"]) for t in rollouts) == sorted(by_identity)
    for trace in rollouts:
        row = by_identity[(trace["task_index"], trace["rollout_index"])]
        assert trace["reward"] == row["reward"] == rewards[trace["task_index"]]
        assert trace["tokens"]["input"] == row["response"]["usage"]["input_tokens"]
        assert trace["status"] == "ok" and trace["span_count"] >= 10

    low = json.loads(_view(directory, *only_this_job, "--where", "reward<0.5", "--json"))["traces"]
    assert sorted(t["trace_id"] for t in low) == sorted(t["trace_id"] for t in rollouts if t["reward"] < 0.5)
    assert len(low) == 2 * VIEW_TASKS // 5 * VIEW_REPEATS
    worst_first = json.loads(_view(directory, *only_this_job, "--sort", "reward", "--json"))["traces"]
    ranked = [t["reward"] for t in worst_first if t["reward"] is not None]
    assert ranked == sorted(ranked) and ranked[0] == 0.0 and len(ranked) == len(rows)

    tasks = json.loads(_view(directory, *only_this_job, "--by-task", "--json"))
    assert [t["task_index"] for t in tasks["tasks"]] == list(range(VIEW_TASKS))
    for task in tasks["tasks"]:
        assert task["rollouts"] == VIEW_REPEATS and task["failures"] == 0
        assert task["mean_reward"] == pytest.approx(rewards[task["task_index"]])
        assert 0 < task["p50_duration_ms"] <= task["p95_duration_ms"]
    assert tasks["all"]["rollouts"] == len(rows)
    assert tasks["all"]["mean_reward"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))

    page = tmp_path / "job.html"
    assert "wrote" in _view(directory, *only_this_job, "--html", str(page))
    (scatter,) = _dom(page.read_text(encoding="utf-8")).find("figure", "scatter")
    dots = {d.attrs["data-trace-id"]: d for d in scatter.find("circle")}
    assert sorted(dots) == sorted(t["trace_id"] for t in rollouts)  # a dot per rollout, no other
    height = {t["reward"]: float(dots[t["trace_id"]].attrs["cy"]) for t in rollouts}  # one per reward: dots align
    assert height[1.0] < height[0.75] < height[0.5] < height[0.25] < height[0.0]  # reward up
