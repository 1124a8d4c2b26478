"""Arize Phoenix as a trace UI for Gym (issue #53): ``./run-demo --backend phoenix`` as a user
runs it (Phoenix from its own venv, its own SQLite; real Gym 0.4.0 under
``opentelemetry-instrument``, all span groups; rollouts sent one by one, then a collection
job of Gym's own driver), checked through Phoenix's own REST and GraphQL APIs (the UI's
trace-list query) and in headless Chromium: each rollout is an agent trace (its root an
AGENT span) with its model calls (LLM, their tokens counted once) and its tool call
(TOOL), and the reward on its root, which the UI's trace filter finds. The demo's Gym
also keeps its local copy (``OTEL_TRACES_EXPORTER=otlp,files``), from which ``gym-autoinstr
export RUNS --to phoenix=URL`` sends each rollout's reward as Phoenix's own score: a span
annotation on its root span and a trace annotation on its trace, checked against Gym's
own rewards through Phoenix's REST API, its trace filter and its trace list in Chromium.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from tests.commands.view_helpers import _cli
from tests.harness.browser import page_text, require_chromium, screenshot
from tests.harness.demo_run import running_demo

pytestmark = pytest.mark.realgym

ROLLOUTS = 2
COLLECTED = 2 * 2  # the demo's collection job: 2 tasks x 2 repeats
PROJECT = "gym-autoinstr-demo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``./run-demo --backend phoenix``, kept running (Phoenix up) for the module."""
    from tests.harness.phoenix_backend import PhoenixServer

    workdir = tmp_path_factory.mktemp("phoenix-demo")
    opened = r"^open (http://127\.0\.0\.1:(\d+)/projects/\S+/traces)$"
    with running_demo("phoenix", workdir, ROLLOUTS, opened) as (found, output):
        client = PhoenixServer(workdir / "client")  # the API side of the demo's server: not started here
        client.port = int(found.group(2))
        yield {"phoenix": client, "output": output, "traces_url": found.group(1), "workdir": workdir}


def test_the_demo_runs_rollouts_and_a_collection_job_into_phoenix(demo):
    out = demo["output"]
    assert f"rewards: {[1.0] * ROLLOUTS}" in out
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS=x-project-name=gym-autoinstr-demo" in out
    assert f"{ROLLOUTS + COLLECTED} rollout traces in Phoenix project {PROJECT}" in out
    assert "the collection job failed" not in out


def test_each_rollout_is_an_agent_trace_with_its_model_and_tool_calls(demo):
    phoenix = demo["phoenix"]
    traces = phoenix.rollout_traces(PROJECT)
    assert len(traces) == ROLLOUTS + COLLECTED
    for trace in traces:
        root, spans = trace["root"], trace["spans"]
        kinds = [s["span_kind"] for s in spans]
        # the rollout as Phoenix shows it: the root an agent (gym.rollout too), two model
        # calls, one tool call; every other span Phoenix cannot classify (HTTP plumbing)
        assert root["span_kind"] == "AGENT", (root["name"], root["span_kind"])
        assert root["attributes"]["nemo.gym.reward"] == 1.0
        # (a collected rollout: the driver's call, the agent's /run and gym.rollout; one sent
        # straight to the agent: its /run and gym.rollout)
        assert kinds.count("TOOL") == 1 and kinds.count("AGENT") in (2, 3)
        llm = [s for s in spans if s["span_kind"] == "LLM"]
        # the agent's CLIENT span of each model call and the model server's seam: two
        # LLM spans per call, only the first with tokens
        counted = [s for s in llm if s["attributes"].get("llm.token_count.total")]
        assert len(counted) == 2 and len(llm) == 4
        (tool,) = [s for s in spans if s["span_kind"] == "TOOL"]
        assert tool["attributes"]["tool.name"] == "get_weather"
        total = sum(s["attributes"]["llm.token_count.total"] for s in counted)
        rollout_total = (
            root["attributes"]["nemo.gym.rollout.usage.input_tokens"]
            + root["attributes"]["nemo.gym.rollout.usage.output_tokens"]
        )
        assert total == rollout_total > 0


def test_the_trace_list_counts_each_rollouts_tokens_once_and_filters_on_reward(demo):
    """The UI's own trace-list query: the "total tokens" column is the rollout's total (not
    twice it), and the filter box finds rollouts by the reward on their roots."""
    phoenix = demo["phoenix"]
    traces = {t["trace_id"]: t for t in phoenix.rollout_traces(PROJECT)}
    rows = [r for r in phoenix.trace_list(PROJECT) if r["trace"]["traceId"] in traces]
    assert len(rows) == len(traces)
    for row in rows:
        root = traces[row["trace"]["traceId"]]["root"]
        expected = (
            root["attributes"]["nemo.gym.rollout.usage.input_tokens"]
            + root["attributes"]["nemo.gym.rollout.usage.output_tokens"]
        )
        assert (row["spanKind"], row["cumulativeTokenCountTotal"]) == ("agent", expected)
    assert phoenix.trace_list(PROJECT, "attributes['nemo.gym.reward'] < 0.5") == []
    kept = phoenix.trace_list(PROJECT, "attributes['nemo.gym.reward'] >= 1")
    assert {r["trace"]["traceId"] for r in kept} == set(traces)
    # the demo's job: two identical rows, which Gym's driver makes one task (index 0) of
    # four rollouts (rollout indexes 0-3)
    assert len(phoenix.trace_list(PROJECT, "attributes['nemo.gym.task.index'] == 0")) == COLLECTED
    assert len(phoenix.trace_list(PROJECT, "attributes['nemo.gym.rollout.index'] >= 2")) == 2


def test_the_trace_page_in_headless_chromium_shows_the_agent_trace(demo, tmp_path):
    require_chromium("the Phoenix page is checked")
    phoenix = demo["phoenix"]
    trace = next(t for t in phoenix.rollout_traces(PROJECT) if t["root"]["span_kind"] == "AGENT")
    url = phoenix.trace_url(PROJECT, trace["trace_id"])
    text = page_text(url, tmp_path)
    for shown in ("POST /run", "gym.rollout", "POST /get_weather", "gym.verify"):
        assert shown in text, (shown, text[:3000])
    # the root's attributes, the reward among them (the page breaks a name at its dots)
    assert re.search(r"nemo\.\s*gym\.\s*reward 1\b", text), text[-3000:]
    assert re.search(r"\bagent\b", text, re.I)
    png = screenshot(url, tmp_path / "phoenix-trace.png")
    assert png.stat().st_size > 10_000


# ---- the rewards as Phoenix's scores: gym-autoinstr export --to phoenix ------------------


def _gym_rewards(demo) -> dict:
    """Gym's own rewards: the collection job's output rows by (task, repeat), and the
    direct rollouts' in the order the demo sent them (it prints them)."""
    rows = [json.loads(line) for line in (demo["workdir"] / "collected-rollouts.jsonl").read_text().splitlines()]
    printed = re.search(r"rewards: \[([^\]]*)\]", demo["output"]).group(1)
    return {
        "collected": {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in rows},
        "direct": [float(x) for x in printed.split(",")],
    }


@pytest.fixture(scope="module")
def scored(demo):
    """``gym-autoinstr export <the demo's runs> --to phoenix=URL``, twice: a re-send must
    replace the scores, not add to them."""
    runs = demo["workdir"] / "gym-autoinstr-runs"  # the fleet's run and the collection job's
    url = demo["phoenix"].url
    return [_cli("export", str(runs), "--to", f"phoenix={url}", columns=None) for _ in range(2)]


def _expected_scores(demo) -> dict[str, float]:
    """Each rollout trace's reward as Gym wrote it in its own output, by trace id."""
    gym = _gym_rewards(demo)
    expected, direct = {}, []
    for trace in demo["phoenix"].rollout_traces(PROJECT):
        attributes = trace["root"]["attributes"]
        key = (attributes.get("nemo.gym.task.index"), attributes.get("nemo.gym.rollout.index"))
        if key == (None, None):
            direct.append((trace["root"]["start_time"], trace["trace_id"]))
        else:
            expected[trace["trace_id"]] = gym["collected"][key]
    assert len(direct) == len(gym["direct"]) == ROLLOUTS
    expected.update({trace_id: reward for (_, trace_id), reward in zip(sorted(direct), gym["direct"])})
    assert len(expected) == ROLLOUTS + COLLECTED
    return expected


def test_export_sends_each_rollouts_reward_as_phoenix_annotations_once(demo, scored):
    phoenix = demo["phoenix"]
    for result in scored:
        assert result.returncode == 0, result.stderr
        assert f"{ROLLOUTS + COLLECTED} rollouts scored 'reward'" in result.stdout, result.stdout
        assert "not in Phoenix" not in result.stdout
    expected = _expected_scores(demo)
    roots = {t["trace_id"]: t["root"]["context"]["span_id"] for t in phoenix.rollout_traces(PROJECT)}
    path = "/v1/projects/" + urllib.parse.quote(PROJECT, safe="")
    on_spans = phoenix._request(path + "/span_annotations", params={"span_ids": list(roots.values()), "limit": 1000})
    on_traces = phoenix._request(path + "/trace_annotations", params={"trace_ids": list(roots), "limit": 1000})
    # one of each per rollout after two sends (Phoenix upserts on the identifier), its
    # score Gym's reward for that rollout
    by_span = {a["span_id"]: a for a in on_spans["data"]}
    by_trace = {a["trace_id"]: a for a in on_traces["data"]}
    assert len(on_spans["data"]) == len(by_span) == len(on_traces["data"]) == len(by_trace) == len(expected)
    for trace_id, reward in expected.items():
        for annotation in (by_span[roots[trace_id]], by_trace[trace_id]):
            assert (annotation["name"], annotation["annotator_kind"]) == ("reward", "CODE")
            assert annotation["result"]["score"] == reward
            assert annotation["metadata"]["trace_id"] == trace_id
    # the trace filter reads them: every rollout scored 1, none below
    kept = phoenix.trace_list(PROJECT, "trace_annotations['reward'].score >= 1")
    assert {r["trace"]["traceId"] for r in kept} == {t for t, reward in expected.items() if reward >= 1}
    assert phoenix.trace_list(PROJECT, "trace_annotations['reward'].score < 1") == []


def test_the_trace_list_in_headless_chromium_shows_the_reward_scores(demo, scored, tmp_path):
    """The project's trace list: each rollout's row shows its reward in the "span
    annotations" and "trace annotations" columns; the start-up and job rows none; the
    "trace annotation scores" chart is the reward's."""
    require_chromium("the Phoenix page is checked")
    assert all(result.returncode == 0 for result in scored)
    expected = _expected_scores(demo)
    url = demo["phoenix"].traces_url(PROJECT)
    text = page_text(url, tmp_path, window="2400,1000")
    assert "Trace annotation scores Average trace annotation scores reward" in text, text[:2000]
    rows = re.findall(r"\b(agent POST /run|unknown gym\.job|unknown gym\.startup) (.*?)\d\d/\d\d/\d{4}", text)
    shown = [re.findall(r"reward μ\s*(?:&nbsp;)?\s*([\d.]+)", rest) for name, rest in rows if name == "agent POST /run"]
    assert len(shown) == len(expected), rows
    assert sorted(shown) == sorted([f"{reward:.2f}"] * 2 for reward in expected.values()), shown
    assert all("reward" not in rest for name, rest in rows if name != "agent POST /run")
    png = screenshot(url, tmp_path / "phoenix-trace-list-scores.png", window="2400,1000")
    assert png.stat().st_size > 10_000
