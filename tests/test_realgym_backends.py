"""The recipes of docs/backends.md, run: real Gym rollouts land whole in a real trace UI.

One MLflow tracking server (its own venv, SQLite store, its own process) serves the
whole module, started by ``./run-demo --backend mlflow`` exactly as a user runs it (the
demo keeps MLflow up until Enter).  Two recipes feed it, each a real Gym 0.4.0 trio
under ``opentelemetry-instrument`` with all span groups on:

* direct: the demo's Gym exports to MLflow's ``/v1/traces`` (``OTEL_EXPORTER_OTLP_TRACES_*``);
* through a collector: a second trio exports OTLP/gRPC to rotel, which forwards over
  OTLP/HTTP to MLflow with the experiment header.

Checked through MLflow's own client: every rollout is one trace with all its spans
(ids and parents intact, three services), model calls are typed and carry the token
usage MLflow derives from ``gen_ai.usage.*``; the doctor's live check passes against
MLflow and names the missing experiment header; headless Chromium renders the trace
page with the rollout's spans and the trace list with each rollout's tokens and reward
(``GYM_AUTOINSTR_TRACE_TAGS=mlflow``: tags); PNGs are kept under the tests' tmp_path.
The demo's Gym also keeps its local copy (``OTEL_TRACES_EXPORTER=otlp,files``), from which
``gym-autoinstr export RUNS --to mlflow=URL`` sends each rollout's reward as MLflow's own
score, an assessment ``reward`` on its trace: once however often it is sent, its value
Gym's reward, shown in the trace list's assessment column.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.commands.view_helpers import _cli
from tests.harness import browser
from tests.harness.collector import Collector
from tests.harness.demo_run import running_demo
from tests.harness.gym_targets import clean_environment
from tests.harness.traces import otel_env
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym

ROLLOUTS = 2
COLLECTED = 2 * 2  # the demo's collection job: 2 tasks x 2 repeats


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``./run-demo --backend mlflow`` as a user runs it, kept running for the module."""
    workdir = tmp_path_factory.mktemp("demo")
    opened = r"^open (http://127\.0\.0\.1:\d+/#/experiments/(\d+)/traces)$"
    with running_demo("mlflow", workdir, ROLLOUTS, opened) as (traces_url, output):
        server = re.search(r"http://127\.0\.0\.1:\d+", traces_url.group(1)).group(0)
        yield {"url": server, "experiment": traces_url.group(2), "output": output, "workdir": workdir}


@pytest.fixture(scope="module")
def mlflow(demo):
    from tests.harness.mlflow_backend import MlflowServer

    client = MlflowServer(demo["workdir"] / "client")  # the API side only: not started
    client.port = int(demo["url"].rsplit(":", 1)[1])
    return client


@pytest.fixture(scope="module")
def through_rotel(demo, mlflow, policy_model, tmp_path_factory):
    """The collector recipe: Gym -> rotel (OTLP/gRPC) -> MLflow (OTLP/HTTP + experiment header)."""
    experiment = mlflow.create_experiment("through-rotel")
    workdir = tmp_path_factory.mktemp("rotel")
    with Collector(
        log_dir=workdir / "collector", forward_to=mlflow.url, forward_headers=f"x-mlflow-experiment-id={experiment}"
    ) as collector:
        env = otel_env(
            collector,
            "grpc",
            GYM_AUTOINSTR_SPAN_GROUPS="all",
            OTEL_METRICS_EXPORTER="none",
            GYM_AUTOINSTR_TRACE_TAGS="mlflow",
        )
        with GymTrio.for_version("0.4.0", workdir, policy_model.url, env=env, instrument=True) as trio:
            results = trio.rollouts(ROLLOUTS)
            traces = mlflow.wait_for_rollouts(experiment, ROLLOUTS)
    return {"experiment": experiment, "traces": traces, "results": results}


def _rollout_root(trace):
    roots = [s for s in trace["spans"] if s["parent_id"] is None]
    return roots[0] if len(roots) == 1 else None


def _check_whole_rollouts(traces, expected: int) -> None:
    assert len(traces) == expected, [t["trace_id"] for t in traces]
    for trace in traces:
        assert trace["state"].endswith("OK"), trace["state"]
        spans = trace["spans"]
        ids = {s["span_id"] for s in spans}
        assert len(ids) == len(spans)
        root = _rollout_root(trace)
        assert root is not None and root["name"] == "POST /run", [(s["name"], s["parent_id"]) for s in spans]
        assert all(s["parent_id"] in ids for s in spans if s is not root), "a parent is missing: the trace is not whole"
        assert {s["trace_id"] for s in spans} == {trace["trace_id"]}
        names = [s["name"] for s in spans]
        for name in (
            "gym.rollout",
            "gym.model.responses",
            "gym.verify",
            "POST /v1/responses",
            "POST /verify",
            "POST /seed_session",
            "POST",  # the model server's call upstream (not a server of the fleet: no route in its name)
        ):
            assert name in names, (name, names)
        # all span groups, example trio: the default preset's 16 plus the agent, model and verify seams
        assert len(spans) >= 16 + 3, names


def _check_model_calls(traces) -> None:
    """Each model call once as a chat model in MLflow: the agent's CLIENT span of the call
    (its tokens from gen_ai.usage.*); the model server's own seam names the model without
    counting the tokens again; the trace's total is the calls' sum, and the rollout's root
    (an agent invocation) carries the reward."""
    for trace in traces:
        calls = [
            s
            for s in trace["spans"]
            if s["attributes"].get("gen_ai.operation.name") == "chat" and "gen_ai.usage.input_tokens" in s["attributes"]
        ]
        assert calls and all(s["attributes"].get("nemo.gym.http.destination.server.name") == MODEL for s in calls)
        for span in calls:
            attributes = span["attributes"]
            assert span["span_type"] == "CHAT_MODEL"  # from gen_ai.operation.name=chat
            usage = attributes["mlflow.chat.tokenUsage"]  # MLflow's own key, derived from gen_ai.usage.*
            assert usage["input_tokens"] == attributes["gen_ai.usage.input_tokens"] > 0
            assert usage["output_tokens"] == attributes["gen_ai.usage.output_tokens"] > 0
            assert attributes["mlflow.llm.model"] == attributes["gen_ai.response.model"]
        seams = [s for s in trace["spans"] if s["name"] == "gym.model.responses"]
        assert len(seams) == len(calls) and all("mlflow.chat.tokenUsage" not in s["attributes"] for s in seams)
        total = trace["token_usage"]
        assert total["input_tokens"] == sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in calls)
        root = _rollout_root(trace)
        assert root["attributes"]["nemo.gym.reward"] == 1.0
        assert root["attributes"]["nemo.gym.rollout.usage.input_tokens"] == total["input_tokens"]
        # GYM_AUTOINSTR_TRACE_TAGS=mlflow: the reward again as a trace tag, what the list shows
        assert trace["tags"]["nemo.gym.reward"] == "1.0", trace["tags"]


def test_the_demo_sends_its_rollouts_straight_to_mlflow_and_prints_the_url(demo, mlflow):
    out = demo["output"]
    assert f"rewards: {[1.0] * ROLLOUTS}" in out
    assert f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={demo['url']}/v1/traces" in out
    assert f"OTEL_EXPORTER_OTLP_TRACES_HEADERS=x-mlflow-experiment-id={demo['experiment']}" in out
    everything = mlflow.search_traces(demo["experiment"])
    traces = mlflow.search_rollouts(demo["experiment"])
    _check_whole_rollouts(traces, ROLLOUTS + COLLECTED)
    _check_model_calls(traces)
    # the rest: the fleet's start-up (span group startup, in the default preset) and the
    # collection job's own trace (gym.job and its /aggregate_metrics calls)
    others = [t for t in everything if t["trace_id"] not in {r["trace_id"] for r in traces}]
    jobs = [t for t in others if any(s["name"] == "gym.job" for s in t["spans"])]
    assert len(jobs) == 1
    (job,) = [s for s in jobs[0]["spans"] if s["name"] == "gym.job"]
    assert job["attributes"]["nemo.gym.job.rollouts.sent"] == COLLECTED
    for trace in others:
        names = [s["name"] for s in trace["spans"]]
        assert trace in jobs or all(n.startswith(("gym.startup", "gym.server.startup")) for n in names), names
    assert f"{ROLLOUTS + COLLECTED} rollout traces in MLflow experiment {demo['experiment']}" in out
    # the collected rollouts' task and repeat, as tags: the demo's job has two identical
    # rows, which Gym's driver makes one task (index 0) of four rollouts (indexes 0-3)
    collected = sorted(
        (t["tags"]["nemo.gym.task.index"], t["tags"]["nemo.gym.rollout.index"])
        for t in traces
        if "nemo.gym.task.index" in t["tags"]
    )
    assert collected == [("0", str(repeat)) for repeat in range(COLLECTED)], [t["tags"] for t in traces]
    # and MLflow filters by them: the task's rollouts, one repeat of it, the rollouts that scored 1
    task = mlflow.search_traces(demo["experiment"], where="tag.`nemo.gym.task.index` = '0'")
    assert sorted(t["tags"]["nemo.gym.rollout.index"] for t in task) == [str(r) for r in range(COLLECTED)]
    (third,) = mlflow.search_traces(demo["experiment"], where="tag.`nemo.gym.rollout.index` = '2'")
    assert third["tags"]["nemo.gym.task.index"] == "0"
    scored = mlflow.search_traces(demo["experiment"], where="tag.`nemo.gym.reward` = '1.0'")
    assert {t["trace_id"] for t in scored} == {t["trace_id"] for t in traces}


def test_the_collector_recipe_forwards_whole_rollouts_to_mlflow(through_rotel):
    assert [r["reward"] for r in through_rotel["results"]] == [1.0] * ROLLOUTS
    _check_whole_rollouts(through_rotel["traces"], ROLLOUTS)
    _check_model_calls(through_rotel["traces"])


def test_traces_in_mlflow_span_three_gym_services(demo, mlflow):
    # MLflow keeps the OTLP resource per span only as the trace's metadata; the services
    # show in the span attributes Gym's servers set, and in the server spans' ports.
    traces = mlflow.search_rollouts(demo["experiment"])
    assert len(traces) == ROLLOUTS + COLLECTED
    for trace in traces:
        servers = {s["attributes"].get("nemo.gym.server.name") for s in trace["spans"]} - {None}
        assert servers >= {AGENT, MODEL, RESOURCES}, servers
        ports = {s["attributes"].get("server.port") for s in trace["spans"] if s["name"].startswith("POST /")}
        assert len(ports) >= 3, ports


def test_the_doctor_passes_against_mlflow_and_names_its_missing_header(demo, tmp_path):
    from gym_autoinstr.commands.doctor.pipeline import pipeline

    code = "import sys\nfrom gym_autoinstr.commands.cli import main\nsys.exit(main(['doctor', '--json']))\n"
    (tmp_path / "cwd").mkdir()
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": demo["url"] + "/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-mlflow-experiment-id={demo['experiment']}",
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "cwd",
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = json.loads(result.stdout)
    assert result.returncode == 0, report["problems"]
    (target,) = report["pipeline"]["targets"]
    assert target["accepted"] and target["status"] == 200
    # the same question in-process: without the experiment header, and over gRPC
    http = {"name": "otlp", "protocol": "http/protobuf", "used": "http/protobuf"}
    _, problems = pipeline({"OTEL_EXPORTER_OTLP_ENDPOINT": demo["url"]}, [http])
    (error,) = [p for p in problems if p.severity == "error"]
    assert "requires the header(s) x-mlflow-experiment-id (422)" in error.problem
    assert error.fix.startswith("add x-mlflow-experiment-id=<value> to OTEL_EXPORTER_OTLP_HEADERS")
    grpc = {"name": "otlp", "protocol": "grpc", "used": "grpc"}
    _, problems = pipeline({"OTEL_EXPORTER_OTLP_ENDPOINT": demo["url"], "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [grpc])
    (error,) = [p for p in problems if p.severity == "error"]  # MLflow has no gRPC receiver
    assert "answers HTTP/1.1" in error.problem and "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in error.fix


def test_the_trace_page_in_headless_chromium_shows_the_rollout_spans(demo, mlflow, tmp_path):
    browser.require_chromium("MLflow's pages are read")
    (trace, *_) = mlflow.search_rollouts(demo["experiment"])
    url = mlflow.trace_url(demo["experiment"], trace["trace_id"])
    dom = browser.page_dom(url, tmp_path, window="2000,1100")
    text = browser.dom_text(dom)
    for name in ("POST /run", "gym.rollout", "gym.model.responses", "gym.verify"):
        assert name in text, (name, text[:3000])
    assert trace["trace_id"].removeprefix("tr-") in dom
    # the trace header shows the token total MLflow derived from the model calls' gen_ai.usage.*
    assert re.search(rf"\b{trace['token_usage']['total_tokens']}\s*tokens", text), text[:3000]
    browser.screenshot(url, tmp_path / "mlflow-trace.png", window="2000,1100")


def test_the_trace_list_shows_each_rollouts_reward_and_tokens(demo, mlflow, tmp_path):
    """MLflow's trace list, as a user opens it from the demo's URL: a row per rollout with
    its task and repeat as its Input, its reward as its Output, its token total (MLflow's
    sum of the model calls' gen_ai.usage.*) and its tags (GYM_AUTOINSTR_TRACE_TAGS=mlflow)."""
    browser.require_chromium("MLflow's pages are read")
    traces = mlflow.search_rollouts(demo["experiment"])
    url = mlflow.traces_url(demo["experiment"])
    text = browser.page_text(url, tmp_path, window="2400,1200")
    rows = re.findall(r'\{"task": (\d+), "repeat": (\d+)\} \{"reward": ([\d.]+)\} \S+ OK (\d+)', text)
    assert sorted((task, repeat) for task, repeat, _, _ in rows) == [("0", str(r)) for r in range(COLLECTED)], text
    totals = {t["token_usage"]["total_tokens"] for t in traces}
    assert all(reward == "1.0" and int(tokens) in totals for _, _, reward, tokens in rows), rows
    # the rollouts sent straight to the agent: no task, the reward all the same
    assert len(re.findall(r'- \{"reward": 1\.0\} \S+ OK \d+', text)) == ROLLOUTS, text
    assert "nemo.gym.reward: 1.0" in text  # a tag (the list shows the first of each row's tags)
    browser.screenshot(url, tmp_path / "mlflow-trace-list.png", window="2400,1200")


# ---- the rewards as MLflow's scores: gym-autoinstr export --to mlflow --------------------


@pytest.fixture(scope="module")
def scored(demo):
    """``gym-autoinstr export <the demo's runs> --to mlflow=URL``, twice: the second must
    find the assessments there and add none."""
    runs = demo["workdir"] / "gym-autoinstr-runs"  # the fleet's run and the collection job's
    return [_cli("export", str(runs), "--to", f"mlflow={demo['url']}", columns=None) for _ in range(2)]


def _gym_rewards(demo, traces) -> tuple[dict[str, float], list[float], list[str]]:
    """Gym's own rewards: the collected rollouts' by trace id (their output rows joined by
    task and repeat), the direct rollouts' as the demo printed them, and those traces."""
    rows = [json.loads(line) for line in (demo["workdir"] / "collected-rollouts.jsonl").read_text().splitlines()]
    by_row = {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in rows}
    collected, direct = {}, []
    for trace in traces:
        attributes = _rollout_root(trace)["attributes"]
        key = (attributes.get("nemo.gym.task.index"), attributes.get("nemo.gym.rollout.index"))
        if key == (None, None):
            direct.append(trace["trace_id"])
        else:
            collected[trace["trace_id"]] = by_row[key]
    printed = re.search(r"rewards: \[([^\]]*)\]", demo["output"]).group(1)
    return collected, [float(x) for x in printed.split(",")], direct


def test_export_sends_each_rollouts_reward_as_an_mlflow_assessment_once(demo, mlflow, scored):
    first, second = scored
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    total = ROLLOUTS + COLLECTED
    assert f"on {total} rollout traces: {total} created, 0 updated, 0 unchanged" in first.stdout, first.stdout
    assert f"on {total} rollout traces: 0 created, 0 updated, {total} unchanged" in second.stdout, second.stdout
    traces = mlflow.search_rollouts(demo["experiment"])
    collected, printed, direct = _gym_rewards(demo, traces)
    assert len(collected) == COLLECTED and len(direct) == len(printed) == ROLLOUTS
    values = {}
    for trace in traces:
        url = f"{mlflow.url}/api/3.0/mlflow/traces/{trace['trace_id']}"
        with urllib.request.urlopen(url, timeout=30) as response:
            info = json.loads(response.read())["trace"]["trace_info"]
        (assessment,) = [a for a in info.get("assessments", []) if a["assessment_name"] == "reward"]
        assert assessment["source"] == {"source_type": "CODE", "source_id": "gym-autoinstr"}
        assert assessment["metadata"]["trace_id"] == trace["trace_id"].removeprefix("tr-")
        values[trace["trace_id"]] = assessment["feedback"]["value"]
    assert {t: values[t] for t in collected} == collected
    assert sorted(values[t] for t in direct) == sorted(printed)


def test_the_trace_list_in_headless_chromium_shows_the_reward_assessments(demo, mlflow, scored, tmp_path):
    """MLflow's trace list after the export: a "reward" assessment column, each rollout's
    row showing Gym's reward there, the start-up and job rows nothing."""
    browser.require_chromium("MLflow's pages are read")
    assert all(result.returncode == 0 for result in scored)
    traces = mlflow.search_rollouts(demo["experiment"])
    collected, printed, direct = _gym_rewards(demo, traces)
    url = mlflow.traces_url(demo["experiment"])
    dom = browser.page_dom(url, tmp_path, window="2400,1200")
    assert 'data-testid="trace-assessment-column-icon"' in dom
    assert re.search(r'data-testid="trace-assessment-column-icon".*?</svg></span>reward<', dom), "no reward column"
    shown = {}
    for row in dom.split('role="row"')[1:]:
        trace_id = re.search(r'aria-label="Select trace (tr-[0-9a-f]{32})"', row)
        if trace_id is None:
            continue  # the header
        tags = re.findall(r'assesment-value-tag".*?<span class="[^"]*">([^<]+)</span>', row)
        shown[trace_id.group(1)] = [float(v) for v in tags]
    others = set(shown) - {t["trace_id"] for t in traces}
    assert len(shown) == len(traces) + len(others) and len(others) == 2, shown  # the start-up trace, the job's
    assert all(shown[t] == [] for t in others), shown
    assert {t: shown[t] for t in collected} == {t: [reward] for t, reward in collected.items()}
    assert sorted(shown[t][0] for t in direct) == sorted(printed) and all(len(shown[t]) == 1 for t in direct)
    browser.screenshot(url, tmp_path / "mlflow-trace-list-scores.png", window="2400,1200")
