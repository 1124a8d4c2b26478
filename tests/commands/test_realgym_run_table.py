"""The run table (``commands/runs``) on what real Gym processes wrote: the facts files the
embedded default leaves beside each span segment say what the spans say, and ``view``'s
summary of a job says what Gym's own output file says.

The run directory is the job fleet's (tests/harness/jobs.py: Gym 0.4.0 under
``opentelemetry-instrument``, ``OTEL_TRACES_EXPORTER=otlp,files``), after the two jobs of
``campaign_jobs`` (tests/harness/campaign.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gym_autoinstr.commands.runs import facts, store
from gym_autoinstr.setup.files import segment_lines, span_segments

pytestmark = pytest.mark.realgym


def _from_spans_alone(directory) -> dict[str, tuple]:
    """Every trace's row from the spans themselves, the facts files ignored."""
    merged: dict[str, list] = {}
    for index, file in enumerate(span_segments(directory)):
        facts.partials_of(segment_lines(file), into=merged, index=index)
    return {trace_id: facts.resolve(trace_id, part) for trace_id, part in merged.items()}


def test_the_facts_files_of_real_processes_say_what_their_spans_say(campaign_jobs):
    directory = campaign_jobs.files
    segments = span_segments(directory)
    with_facts = [s for s in segments if store._facts_file(s).exists()]
    assert len(with_facts) == len(segments) >= 4  # every process's segment: collection, agent, model, resources
    # the two jobs' rollouts, ended before this test (the fleet's servers may still write others)
    jobs = {campaign_jobs.before.job_id, campaign_jobs.after.job_id}
    loaded = [r for r in store.load([str(directory)]).rollouts if r.job_id in jobs]
    rows = {r.trace_id: r.row[: facts.R_FILES] for r in loaded}  # (which files: only the table knows)
    expected = _from_spans_alone(directory)
    assert len(rows) == 2 * len(campaign_jobs.before.rows) + 2  # their rollouts and the jobs' own traces
    assert rows == {t: expected[t][: facts.R_FILES] for t in rows}


def test_the_summary_of_a_job_is_what_gym_wrote(campaign_jobs):
    job = campaign_jobs.before
    done = subprocess.run(
        [sys.executable, "-m", "gym_autoinstr", "view", str(campaign_jobs.files), "--summary"]
        + ["--attr", f"nemo.gym.job.id={job.job_id}", "--show", "worst"],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},  # no terminal: no line cut
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rewards = [row["reward"] for row in job.rows]
    assert lines[0].startswith(f"{len(job.rows)} rollouts, 1 job; failed 0 (0%)"), lines[0]
    mean = sum(rewards) / len(rewards)
    assert lines[1].startswith("reward: mean ")
    shown_mean = float(lines[1].split()[2])
    assert shown_mean == pytest.approx(mean, abs=0.0005)
    zero = 100 * sum(1 for r in rewards if r == 0) / len(rewards)
    assert f"{zero:.0f}% at 0" in lines[1]
    tokens_in = sum(row["response"]["usage"]["input_tokens"] for row in job.rows) / len(job.rows)
    assert f"tokens a rollout: in {tokens_in:.0f}," in lines[3]
    # the worst rollouts first: those Gym scored lowest
    listed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "gym_autoinstr", "view", str(campaign_jobs.files), "--json"]
            + ["--attr", f"nemo.gym.job.id={job.job_id}", "--sort", "reward"],
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
    )["traces"]
    assert [t["reward"] for t in listed if t["reward"] is not None] == sorted(rewards)
