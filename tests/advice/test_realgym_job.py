"""Rollout collection on real Gym: one rollout, one trace, each linked to its job.

One traced trio per Gym version (``job_fleets``, tests/harness/jobs.py: shared by every
case, and by test_realgym_outcome.py), a real collector (rotel) in front of the test's
sink, and Gym's own collection driver run as users run it:

* 0.7.0: the real ``gym eval run --no-serve`` under ``opentelemetry-instrument``;
* 0.4.0: the body of Gym's ``collect_rollouts()`` (what ``ng_collect_rollouts`` and ``gym
  eval run --no-serve`` call: ``RolloutCollectionHelper().run_from_config``), because
  0.4.0's ``gym eval`` module imports mlflow, which the shared test venv does not carry
  (one more venv build per version would cost more than this whole module).

Each case is one collection run against the shared fleet; its spans are told apart by
start time (the run's own spans start after it is launched) and by its ``gym.job``.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.harness.traces import (
    assert_whole_rollout,
    by_trace,
    job_spans,
    linked_rollout_roots,
    service_of,
    spans_since,
)

pytestmark = pytest.mark.realgym

# An embedder (a training loop that traces its steps) around Gym's collection functions:
# `run_examples` as NeMo RL calls it, then `run_from_config`, each inside a span of its own.
EMBEDDER_DRIVER = """\
import asyncio, json
from opentelemetry import trace
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
config = RolloutCollectionConfig.model_validate(get_global_config_dict())
tracer = trace.get_tracer("embedder")

async def main():
    helper = RolloutCollectionHelper()
    rows = [dict(json.loads(line), agent_ref={"name": config.agent_name}) for line in open(config.input_jsonl_fpath)]
    with tracer.start_as_current_span("train.step.run_examples"):
        for future in helper.run_examples(rows):
            await future
    with tracer.start_as_current_span("train.step.run_from_config"):
        await helper.run_from_config(config)

asyncio.run(main())
"""


@pytest.mark.parametrize("version", ["0.4.0", "0.7.0"])
def test_every_rollout_is_its_own_trace_linked_to_the_job(version, job_fleets):
    fleet = job_fleets(version)
    rows, repeats = 2, 3
    start_ns, output = fleet.collect(rows=rows, repeats=repeats, parallel=3)
    assert len(open(output).read().splitlines()) == rows * repeats  # Gym collected them all
    spans = fleet.wait_for_rollouts(start_ns, rows * repeats)
    traces = by_trace(spans)

    # the job: its own trace, a root, with the counts it knows
    (job,) = job_spans(spans)
    assert (job["kind"], job["parent_span_id"]) == ("INTERNAL", None)
    attributes = job["attributes"]
    assert re.fullmatch(r"[0-9a-f]{32}", attributes["nemo.gym.job.id"])
    assert attributes["nemo.gym.job.trace"] == "per_rollout"
    assert attributes["nemo.gym.job.rollouts.sent"] == rows * repeats
    assert attributes["nemo.gym.job.rollouts.failed"] == 0
    assert attributes["nemo.gym.job.num_repeats"] == repeats
    job_trace = traces[job["trace_id"]]
    assert not [s for s in job_trace if s["name"] == "gym.rollout"]  # no rollout inside the job's trace

    # every rollout: a root CLIENT span in the collection process, linked to the job
    roots = linked_rollout_roots(spans, job)
    assert len(roots) == rows * repeats
    assert len({r["trace_id"] for r in roots}) == rows * repeats
    for root in roots:
        assert (root["kind"], root["name"], service_of(root)) == ("CLIENT", "POST /run", service_of(job))
        assert root["attributes"]["url.full"].endswith("/run")
        assert root["attributes"]["nemo.gym.job.id"] == attributes["nemo.gym.job.id"]
        assert root["links"] == [{"trace_id": job["trace_id"], "span_id": job["span_id"]}]
        assert_whole_rollout(traces[root["trace_id"]], root, fleet.trio)
    # nothing of this run outside the job's trace and its rollouts' traces
    assert set(traces) == {job["trace_id"]} | {r["trace_id"] for r in roots}


def test_opt_in_nests_the_job_in_one_trace(job_fleets):
    fleet = job_fleets("0.7.0")
    start_ns, _ = fleet.collect(rows=1, repeats=2, parallel=2, env={"GYM_AUTOINSTR_JOB_TRACE": "single"})
    spans = fleet.wait_for_rollouts(start_ns, 2)
    (job,) = job_spans(spans)
    assert job["parent_span_id"] is None and job["attributes"]["nemo.gym.job.trace"] == "single"
    assert job["attributes"]["nemo.gym.job.rollouts.sent"] == 2
    assert {s["trace_id"] for s in spans} == {job["trace_id"]}  # one trace id for the whole job
    runs = [
        s
        for s in spans
        if s["kind"] == "CLIENT"
        and s["attributes"].get("url.full", "").endswith("/run")
        and service_of(s) == service_of(job)
    ]
    assert len(runs) == 2
    assert all(s["parent_span_id"] == job["span_id"] and not s["links"] for s in runs)
    assert sum(s["name"] == "gym.rollout" for s in spans) == 2


def test_ratio_sampler_keeps_each_rollout_whole_or_not_at_all_and_always_the_job(job_fleets):
    fleet = job_fleets("0.4.0")
    n = 40
    start_ns, output = fleet.collect(
        rows=1,
        repeats=n,
        parallel=8,
        env={"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
    )
    assert len(open(output).read().splitlines()) == n  # sampling changes nothing in Gym
    fleet.collector.sink.wait_for(lambda spans: job_spans(spans_since(spans, start_ns)), timeout=60)
    time.sleep(4)  # every server's last batches
    spans = spans_since(fleet.collector.sink.spans(), start_ns)
    traces = by_trace(spans)
    (job,) = job_spans(spans)  # kept whatever the ratio
    assert job["attributes"]["nemo.gym.job.rollouts.sent"] == n
    roots = linked_rollout_roots(spans, job)
    # Binomial(40, 0.5): outside 5..35 has probability ~1e-7
    assert 5 <= len(roots) <= 35, len(roots)
    for root in roots:
        assert_whole_rollout(traces[root["trace_id"]], root, fleet.trio)
    # a dropped rollout left nothing anywhere: every span belongs to the job or a kept rollout
    assert set(traces) == {job["trace_id"]} | {r["trace_id"] for r in roots}
    assert sum(s["name"] == "gym.rollout" for s in spans) == len(roots)


def test_an_embedders_span_parents_the_rollouts(job_fleets):
    fleet = job_fleets("0.4.0")
    start_ns, _ = fleet.collect(rows=1, repeats=2, parallel=2, driver=EMBEDDER_DRIVER)
    spans = fleet.wait_for_rollouts(start_ns, 1 + 2)
    traces = by_trace(spans)
    (step1,) = [s for s in spans if s["name"] == "train.step.run_examples"]
    (step2,) = [s for s in spans if s["name"] == "train.step.run_from_config"]
    # run_examples (NeMo RL's call): a gym.job of its own under the caller's span, the
    # rollout under it, one trace
    trace1 = traces[step1["trace_id"]]
    (job1,) = job_spans(trace1)
    assert job1["parent_span_id"] == step1["span_id"] and job1["attributes"]["nemo.gym.job.entry"] == "run_examples"
    assert job1["attributes"]["nemo.gym.job.trace"] == "embedded"
    assert job1["attributes"]["nemo.gym.job.rollouts.sent"] == 1
    runs1 = [s for s in trace1 if s["kind"] == "CLIENT" and s["attributes"]["url.full"].endswith("/run")]
    assert len(runs1) == 1 and runs1[0]["parent_span_id"] == job1["span_id"] and not runs1[0]["links"]
    assert sum(s["name"] == "gym.rollout" for s in trace1) == 1
    # run_from_config: gym.job under the caller's span, the rollouts under gym.job, one trace
    trace2 = traces[step2["trace_id"]]
    (job,) = job_spans(trace2)
    assert job["attributes"]["nemo.gym.job.entry"] == "run_from_config"
    assert job["trace_id"] == step2["trace_id"] and job["parent_span_id"] == step2["span_id"]
    assert job["attributes"]["nemo.gym.job.trace"] == "embedded"
    assert job["attributes"]["nemo.gym.job.rollouts.sent"] == 2
    runs2 = [s for s in trace2 if s["kind"] == "CLIENT" and s["attributes"]["url.full"].endswith("/run")]
    assert len(runs2) == 2 and all(s["parent_span_id"] == job["span_id"] and not s["links"] for s in runs2)
    assert sum(s["name"] == "gym.rollout" for s in trace2) == 2
    assert set(traces) == {step1["trace_id"], step2["trace_id"]}


def test_view_groups_rollout_traces_under_their_job(job_fleets):
    """The file default (no endpoint) in the collection process: ``gym-autoinstr view``
    reads its run directory back and lists its traces, a job line above the rollouts
    linked to it."""
    fleet = job_fleets("0.4.0")
    run_dir = fleet.workdir / "view-run"
    fleet.collect(
        rows=1,
        repeats=2,
        parallel=2,
        drop_env=("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"),  # nothing configured: files alone
        env={"GYM_AUTOINSTR_OUTPUT_DIR": str(run_dir)},
    )
    shown = subprocess.run(
        [str(fleet.trio.venv / "bin" / "gym-autoinstr"), "view", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},  # a terminal wide enough for the whole job line
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("start (UTC)")
    job_line = lines[1]
    match = re.fullmatch(
        r"job ([0-9a-f]{32})  \S+  [\d.]+ ms  sent=2 failed=0 repeats=2  \| 2 linked rollout traces below "
        r"\(job trace ([0-9a-f]{32})\)",
        job_line,
    )
    assert match, job_line
    from gym_autoinstr.setup.files import read_path

    spans = read_path(run_dir)
    (job,) = job_spans(spans)
    assert (match.group(1), match.group(2)) == (job["attributes"]["nemo.gym.job.id"], job["trace_id"])
    roots = linked_rollout_roots(spans, job)
    assert len(roots) == 2
    # one line per trace (start, id prefix, ...); start-up traces are listed apart, after a blank line
    listed = lines[2 : lines.index("")]
    shown_ids = [re.match(r"\d\d:\d\d:\d\d\.\d{3}  ([0-9a-f]{12})  ", line).group(1) for line in listed]
    # under the line: the job's own trace (its /aggregate_metrics call), then its rollouts, nothing else
    assert shown_ids[0] == job["trace_id"][:12]
    assert sorted(shown_ids[1:]) == sorted(r["trace_id"][:12] for r in roots)
