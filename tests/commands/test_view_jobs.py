"""``gym-autoinstr view`` groups rollout traces under their job, from files written by the
real ``OtlpJsonFileExporter`` (spans made by a real SDK provider, links included).  The
real collection driver's files are read back in ``tests/advice/test_realgym_job.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from gym_autoinstr.commands.view.filters import select
from gym_autoinstr.commands.view.model import Job, build_traces, group_by_job
from gym_autoinstr.commands.view.page import render_html
from gym_autoinstr.setup.files import OtlpJsonFileExporter, read_path


def _write_run(directory: Path) -> dict:
    provider = TracerProvider(resource=Resource.create({"service.name": "nemo-gym/orchestrator"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(directory, "orchestrator")))
    tracer = provider.get_tracer("t")
    root = trace.set_span_in_context(trace.INVALID_SPAN)
    with tracer.start_as_current_span("gym.job", attributes={"nemo.gym.job.id": "j" * 32}) as job:
        with tracer.start_as_current_span("HTTP POST", kind=SpanKind.CLIENT):  # the job's own call
            pass
        rollouts = []
        for index in range(2):
            with tracer.start_as_current_span(
                "HTTP POST",
                context=root,
                kind=SpanKind.CLIENT,
                links=[Link(job.get_span_context())],
                attributes={"nemo.gym.rollout.id": f"0-{index}"},
            ) as rollout:
                with tracer.start_as_current_span("gym.rollout", attributes={"nemo.gym.rollout.id": f"0-{index}"}):
                    pass
            rollouts.append(rollout)
        job.set_attribute("nemo.gym.job.rollouts.sent", 2)
        job.set_attribute("nemo.gym.job.rollouts.failed", 0)
    with tracer.start_as_current_span("POST /run", context=root, kind=SpanKind.SERVER) as alone:
        pass
    provider.shutdown()
    hexid = lambda span: format(span.get_span_context().trace_id, "032x")  # noqa: E731
    return {"job": hexid(job), "rollouts": [hexid(r) for r in rollouts], "alone": hexid(alone)}


def test_rollout_traces_are_grouped_under_their_jobs_line(tmp_path):
    ids = _write_run(tmp_path / "run")
    everything = build_traces(read_path(tmp_path / "run"))
    items = group_by_job(everything, everything)
    (job,) = [item for item in items if isinstance(item, Job)]
    assert [t.trace_id for t in job.traces] == [ids["job"], *ids["rollouts"]]
    assert [item.trace_id for item in items if not isinstance(item, Job)] == [ids["alone"]]
    # a filter that selects one rollout keeps its job line above it, and nothing of the rest
    chosen = select(everything, rollout="0-1")
    (only,) = group_by_job(chosen, everything)
    assert isinstance(only, Job) and [t.trace_id for t in only.traces] == [ids["rollouts"][1]]
    # the page: the job heading, then the job's traces in order, then the unrelated trace
    page = render_html(items)
    order = re.findall(
        r'<h2 class="job" data-job-id="(\w+)"|<section class="trace" id="t-\w+" data-trace-id="(\w+)"', page
    )
    assert order == [
        ("j" * 32, ""),
        ("", ids["job"]),
        ("", ids["rollouts"][0]),
        ("", ids["rollouts"][1]),
        ("", ids["alone"]),
    ]


def test_the_command_lists_the_job_line_above_its_rollouts(tmp_path):
    ids = _write_run(tmp_path / "run")
    script = Path(sys.executable).parent / "gym-autoinstr"
    env = {**os.environ, "COLUMNS": "250"}
    shown = subprocess.run(
        [str(script), "view", str(tmp_path / "run")], capture_output=True, text=True, timeout=60, env=env
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("start (UTC)")
    assert re.fullmatch(
        r"job j{32}  nemo-gym/orchestrator  [\d.]+ ms  sent=2 failed=0  \| 2 linked rollout traces below "
        rf"\(job trace {ids['job']}\)",
        lines[1],
    ), lines[1]
    # one list line per trace under it: the job's own trace, its rollouts; then the unrelated trace
    listed = [line.split()[1] for line in lines[2:] if re.match(r"\d\d:\d\d:\d\d\.\d{3}  ", line)]
    assert listed == [t[:12] for t in (ids["job"], *ids["rollouts"], ids["alone"])]
    # --rollout draws that rollout's waterfall, its job line above it
    drawn = subprocess.run(
        [str(script), "view", str(tmp_path / "run"), "--rollout", "0-1"], capture_output=True, text=True, env=env
    )
    job_line, block = drawn.stdout.strip().split("\n\n")
    assert job_line.startswith("job " + "j" * 32) and block.startswith(f"trace {ids['rollouts'][1]}  2 spans")


def test_a_job_drawn_alone_counts_its_linked_rollouts_as_the_list_does(tmp_path):
    """Its rollouts are found through the span links of their root CLIENT spans in every
    trace read, not only among the traces chosen to be drawn."""
    ids = _write_run(tmp_path / "run")
    script = Path(sys.executable).parent / "gym-autoinstr"
    env = {**os.environ, "COLUMNS": "250"}

    def job_line(*args: str) -> str:
        shown = subprocess.run(
            [str(script), "view", str(tmp_path / "run"), *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert shown.returncode == 0, shown.stderr
        (line,) = [line for line in shown.stdout.splitlines() if line.startswith("job ")]
        return line.partition("  | ")[2]

    own = f"(job trace {ids['job']})"
    assert job_line() == f"2 linked rollout traces below {own}"
    assert job_line("--trace", ids["job"][:8]) == f"2 linked rollout traces, none of them below {own}"
    assert job_line("--rollout", "0-1") == f"2 linked rollout traces, 1 of them below {own}"
    everything = build_traces(read_path(tmp_path / "run"))
    (job,) = group_by_job(select(everything, trace_id=ids["job"]), everything)
    assert isinstance(job, Job) and job.linked == 2 and job.rollouts == []
    assert "2 linked rollout traces, none of them below" in render_html([job])
