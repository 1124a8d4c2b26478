"""``gym-autoinstr view`` of a ``gym eval submit``'s directory shows the submission with its
Slurm jobs: the submit leaves a note beside its own files (``setup/runs.py``) naming each
job's trace directory, and view reads those that are on this machine and says where the
others are.  The files are written by the real ``OtlpJsonFileExporter``; the real submit
on a real Slurm cluster is ``tests/test_realgym_slurm.py``."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from gym_autoinstr.commands.view.command import main
from gym_autoinstr.setup import runs
from gym_autoinstr.setup.files import OtlpJsonFileExporter

SUBMISSION = "gym-job-20261206-abc"


def _spans(directory: Path, service: str, write) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(directory, service.split("/")[-1])))
    write(provider.get_tracer("t"))
    provider.shutdown()


def _submitted(tmp_path: Path, *, hostname: str | None = None, job_ran: bool = True) -> tuple[Path, Path]:
    """The submitting process's run directory (its gym.submit and its note), and the job's
    trace directory (its gym.job, linked to gym.submit, when the job ran)."""
    own = tmp_path / "submit" / "gym-autoinstr-runs" / "r1"
    traces = tmp_path / "jobs" / SUBMISSION / "tiny" / "gym-autoinstr"
    submitted = {}

    def submit(tracer):
        with tracer.start_as_current_span("gym.submit", kind=SpanKind.PRODUCER) as span:
            submitted["context"] = span.get_span_context()

    def job(tracer):
        root = trace.set_span_in_context(trace.INVALID_SPAN)
        with tracer.start_as_current_span("gym.job", context=root, links=[Link(submitted["context"])]):
            pass

    _spans(own, "nemo-gym/orchestrator", submit)
    runs.record_submission(
        own, SUBMISSION, hostname, [{"benchmark": "tiny", "slurm_job_id": "41", "traces": str(traces)}]
    )
    if job_ran:
        _spans(traces, "nemo-gym/orchestrator", job)
    return own, traces


def _view(capsys, *paths: Path) -> tuple[list[str], str]:
    assert main([str(p) for p in paths], as_json=True) == 0
    out, err = capsys.readouterr()
    return [t["root"] for t in json.loads(out)["traces"]], err


def test_the_submit_directory_shows_the_submission_with_its_jobs(tmp_path, capsys):
    own, traces = _submitted(tmp_path)
    roots, said = _view(capsys, tmp_path / "submit")  # the directory submit ran from
    assert sorted(roots) == ["gym.job", "gym.submit"]
    assert said.strip() == (
        f"gym-autoinstr view: reading Slurm job 41 (tiny, submission {SUBMISSION}) too, submitted from "
        f"{(tmp_path / 'submit').resolve()}: {traces}"
    )
    # named by its own run directory too; and a job directory inside the viewed one is read once
    assert sorted(_view(capsys, own)[0]) == ["gym.job", "gym.submit"]
    roots, said = _view(capsys, tmp_path)
    assert sorted(roots) == ["gym.job", "gym.submit"] and said == ""


def test_a_job_that_has_not_run_yet_is_named_with_where_its_traces_will_be(tmp_path, capsys):
    _, traces = _submitted(tmp_path, job_ran=False)
    roots, said = _view(capsys, tmp_path / "submit")
    assert roots == ["gym.submit"]
    assert said.strip() == (
        f"gym-autoinstr view: Slurm job 41 (tiny, submission {SUBMISSION}) writes its traces to {traces}, "
        "not there yet: has the job started? (squeue -j 41)"
    )


def test_a_job_on_another_host_is_named_with_its_host(tmp_path, capsys):
    _, traces = _submitted(tmp_path, hostname="login.cluster", job_ran=False)
    roots, said = _view(capsys, tmp_path / "submit")
    assert roots == ["gym.submit"]
    assert f"writes its traces to {traces}, not on login.cluster: view them there, or copy them here" in said
