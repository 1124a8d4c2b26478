"""The one reader of runs (``commands/runs``): a row per trace that says what ``view``'s
span model says, from the spans or from the facts files the writer leaves beside them,
cached so that a later command reads no span; a live segment read again as it grows.

The truth every row is checked against is ``view``'s trace model (``model.build_traces``
over every span), whose answers the view tests check against Gym's own output."""

from __future__ import annotations

import gzip
import os
import pty
import subprocess
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gym_autoinstr.commands.runs import facts, store
from gym_autoinstr.commands.view.model import build_traces, display_name
from gym_autoinstr.fastpath import wire_json
from gym_autoinstr.fastpath.batching import EncodingSpanProcessor
from gym_autoinstr.setup import files, segments
from gym_autoinstr.setup.files import read_path, segment_lines
from tests.commands.outcome_run import write_outcome_run
from tests.commands.test_view_scale import write_synthetic_run
from tests.commands.view_helpers import _cli, _command, _listed

FIELDS = (
    "start_ns",
    "end_ns",
    "has_error",
    "reward",
    "mask_sample",
    "task_index",
    "rollout_index",
    "tokens",
    "failure",
    "rollout_ids",
    "services",
    "is_startup",
    "is_job",
    "span_count",
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(store.CACHE_VARIABLE, str(tmp_path / "cache"))


def _same_as_the_span_model(directory: Path) -> int:
    rows = {r.trace_id: r for r in store.load([str(directory)]).rollouts}
    traces = {t.trace_id: t for t in build_traces(read_path(directory))}
    assert set(rows) == set(traces)
    for trace_id, trace in traces.items():
        row = rows[trace_id]
        assert {f: getattr(row, f) for f in FIELDS} == {f: getattr(trace, f) for f in FIELDS}, trace_id
        assert display_name(row.root) == display_name(trace.root)
        assert row.seams_ms() == pytest.approx(trace.seams_ms())
        assert [s["span_id"] for s in row.top_spans] == [s["span_id"] for s in trace.top_spans]
    return len(rows)


def test_rows_say_what_the_span_model_says(tmp_path):
    synthetic = write_synthetic_run(tmp_path / "synthetic", 300)
    assert _same_as_the_span_model(synthetic["dir"]) == 302  # rollouts, the job's own, the start-up
    outcome = tmp_path / "outcome"
    write_outcome_run(outcome)  # rewards, masks, tokens written the ways three versions wrote them
    assert _same_as_the_span_model(outcome) > 0


def _writer_run(directory: Path, rollouts: int = 40, batch: int = 7) -> None:
    """Spans through the embedded default's own path: the encoding processor (facts on)
    into the run directory's segment writer."""
    exporter = files.OtlpJsonFileExporter(directory, "nemo-gym/agent")
    processor = EncodingSpanProcessor(
        exporter,
        max_queue_size=4096,
        schedule_delay_millis=10_000,
        max_export_batch_size=batch,
        encoding=wire_json,
        facts=True,
    )
    resource = Resource.create({"service.name": "nemo-gym/agent", "nemo.gym.server.type": "responses_api_agents"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("gym.job", attributes={"nemo.gym.job.id": "j1"}) as job:
        pass
    for index in range(rollouts):
        attributes = {
            "nemo.gym.reward": index / rollouts,
            "nemo.gym.task.index": index // 2,
            "nemo.gym.rollout.index": index % 2,
            "nemo.gym.job.id": "j1",
            "nemo.gym.rollout.usage.input_tokens": 10 + index,
            "nemo.gym.rollout.usage.output_tokens": 3,
        }
        links = [Link(job.get_span_context())]
        with tracer.start_as_current_span("POST /run", kind=SpanKind.CLIENT, attributes=attributes, links=links):
            with tracer.start_as_current_span("gym.rollout", attributes={"nemo.gym.reward": 0.5}):
                chat = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 5, "gen_ai.request.model": "m"}
                with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT, attributes=chat) as span:
                    if index % 5 == 0:
                        span.set_status(Status(StatusCode.ERROR))
                        span.set_attribute("error.type", "TimeoutError")
    processor.force_flush()
    processor.shutdown()


def _resolved(partials: dict) -> dict:
    return {trace_id: facts.resolve(trace_id, part) for trace_id, part in partials.items()}


def test_the_writers_facts_say_what_its_spans_say(tmp_path):
    _writer_run(tmp_path)
    (segment,) = files.span_segments(tmp_path)
    facts_file = store._facts_file(segment)
    assert facts_file.exists()
    from_spans = _resolved(facts.partials_of(segment_lines(segment)))
    assert len(from_spans) == 41
    assert _resolved(store.segment_partials(segment)) == from_spans
    # a process killed between a batch's line and its facts: the spans past them are read
    lines = facts_file.read_text().splitlines(keepends=True)
    facts_file.write_text("".join(lines[:-2]))
    assert _resolved(store.segment_partials(segment)) == from_spans
    # a gap (a batch's facts not written): the segment is read whole
    facts_file.write_text("".join(lines[:1] + lines[2:]))
    assert _resolved(store.segment_partials(segment)) == from_spans
    # gzipped: its last four bytes say its size, against which the facts are checked
    facts_file.write_text("".join(lines))
    assert segments.compress(segment)
    zipped = segment.with_name(segment.name + ".gz")
    assert _resolved(store.segment_partials(zipped)) == from_spans
    facts_file.write_text("".join(lines[:-1]))  # a gzip's facts cut short: the gzip is read
    assert _resolved(store.segment_partials(zipped)) == from_spans


def test_the_facts_are_read_not_the_spans(tmp_path, monkeypatch):
    _writer_run(tmp_path)
    read = []
    original = facts.partials_of
    monkeypatch.setattr(facts, "partials_of", lambda *args: read.append(args[1:2]) or original(*args))
    campaign = store.load([str(tmp_path)])
    assert read == [] and len(campaign.rollouts) == 41
    rewards = sorted(r.reward for r in campaign.rollouts if r.is_rollout)
    assert rewards == [index / 40 for index in range(40)]
    failed = [r for r in campaign.rollouts if r.has_error]
    assert len(failed) == 8 and {r.failure["error_type"] for r in failed} == {"TimeoutError"}


def test_a_later_read_reads_the_table_alone_and_a_growing_segment_again(tmp_path, monkeypatch):
    run = write_synthetic_run(tmp_path / "run", 200)["dir"]
    first = store.load([str(run)])
    read = []
    original = store.segment_partials
    monkeypatch.setattr(store, "segment_partials", lambda path: read.append(path.name) or original(path))
    again = store.load([str(run)])
    assert read == [] and [r.row for r in again.rollouts] == [r.row for r in first.rollouts]
    # a segment still being written grows: that file alone is read again
    grown = sorted(run.glob("agent-*.jsonl"))[0]
    donor = tmp_path / "donor"
    write_synthetic_run(donor, 3)
    with open(grown, "a", encoding="utf-8") as handle:
        handle.write(sorted(donor.glob("orchestrator-*.jsonl"))[0].read_text().splitlines()[-1] + "\n")
    os.utime(grown, ns=(1, grown.stat().st_mtime_ns + 1))
    later = store.load([str(run)])
    assert read == [grown.name]
    assert len(later.rollouts) >= len(first.rollouts)


def _new_ids(directory: Path) -> None:
    """The run's trace ids turned round: a run of its own (the synthetic runs share ids)."""
    import re

    for file in directory.glob("*.jsonl"):
        text = re.sub(r'"traceId":"([0-9a-f]{32})"', lambda m: f'"traceId":"{m.group(1)[::-1]}"', file.read_text())
        file.write_text(text)


def test_a_campaign_is_runs_below_a_folder_and_one_trace_reads_its_own_files(tmp_path):
    campaign = tmp_path / "campaign"
    write_synthetic_run(campaign / "run-a", 30)
    write_synthetic_run(campaign / "run-b", 20)
    _new_ids(campaign / "run-b")
    loaded = store.load([str(campaign)])
    assert loaded.runs == ["run-a", "run-b"]
    by_run = {run: [r for r in loaded.rollouts if r.run == run and r.is_rollout] for run in loaded.runs}
    assert [len(by_run["run-a"]), len(by_run["run-b"])] == [30, 20]
    # one trace drawn: its spans, read from the files holding them (every role's file here)
    chosen = by_run["run-b"][:1]
    spans = loaded.spans_of(chosen)
    assert {s["trace_id"] for s in spans} == {chosen[0].trace_id} and len(spans) == chosen[0].span_count
    # two runs given as two paths: the same rows, named by the paths
    two = store.load([str(campaign / "run-a"), str(campaign / "run-b")])
    assert sorted(r.row for r in two.rollouts) == sorted(r.row for r in loaded.rollouts)
    assert two.runs == [str(campaign / "run-a"), str(campaign / "run-b")]


def test_a_trace_whose_processes_wrote_in_two_runs_is_one_row(tmp_path):
    whole = write_synthetic_run(tmp_path / "whole", 40)["dir"]
    apart = tmp_path / "apart"
    (apart / "servers").mkdir(parents=True)  # the orchestrator's files in one run, the servers' in another
    (apart / "driver").mkdir()
    for file in whole.iterdir():
        (apart / ("driver" if file.name.startswith("orchestrator") else "servers") / file.name).write_bytes(
            file.read_bytes()
        )
    expected = sorted(r.row[: facts.R_FILES] for r in store.load([str(whole)]).rollouts)
    for _ in range(2):  # read, then from the paths' own table
        loaded = store.load([str(apart / "driver"), str(apart / "servers")])
        assert sorted(r.row[: facts.R_FILES] for r in loaded.rollouts) == expected and len(expected) == 42
        drawn = next(r for r in loaded.rollouts if r.is_rollout)
        assert {drawn.source.files[i].parent.name for i in drawn.files} == {"driver", "servers"}
        assert len(loaded.spans_of([drawn])) == drawn.span_count  # read from both runs' files
    one = next(r for r in loaded.rollouts if r.is_rollout)
    found = store.load([str(apart / "driver"), str(apart / "servers")], trace=one.trace_id[:10]).rollouts
    assert one.trace_id in {r.trace_id for r in found}


def test_cache_files_unused_for_a_month_are_pruned_at_most_daily(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv(store.CACHE_VARIABLE, str(tmp_path / "cache"))
    run = write_synthetic_run(tmp_path / "run", 5)["dir"]
    store.load([str(run)])
    root = store.cache_root()

    def cached() -> int:
        return len(list((root / "tables").iterdir())) + len(list((root / "files").iterdir()))

    kept, day = cached(), 86400
    assert kept >= 4  # the run's table, its ids, its (plain, still written) files' partials
    later = time.time() + (store.KEEP_DAYS - 1) * day
    store.prune(root, later)  # a month not yet past: every file kept
    assert cached() == kept
    later += 2 * day
    os.utime(root / ".pruned", (later - 3600, later - 3600))
    store.prune(root, later)  # looked an hour ago: not again
    assert cached() == kept
    os.utime(root / ".pruned", (later - 2 * day, later - 2 * day))
    store.prune(root, later)
    assert cached() == 0
    assert len(store.load([str(run)]).rollouts) == 7  # read again from the files


def test_the_summary_leads_on_a_terminal_and_a_pipe_gets_every_row(tmp_path):
    run = write_synthetic_run(tmp_path / "run", 1000)["dir"]  # the 1000th fails
    piped = _cli("view", str(run))
    assert len(_listed(piped.stdout)) == 1001  # the rollouts and the start-up (the job: its line)
    summed = _cli("view", str(run), "--summary", "--show", "failed")
    lines = summed.stdout.splitlines()
    assert lines[0].startswith("1000 rollouts, 1 job; failed 1 (0%) (") and "TimeoutError 1" in lines[0], lines[0]
    assert lines[2].startswith("duration: p50 ") and " p99 " in lines[2] and " max 189.0 ms" in lines[2]
    assert "the 1 newest failed rollouts" in summed.stdout
    (failed,) = _listed(summed.stdout)
    assert failed["status"] == "ERROR"
    assert "... and 1001 more traces: --all lists every trace" in summed.stdout
    # a real terminal: the summary without asking; --all lists every trace there
    for extra, summary in (([], True), (["--all"], False)):
        leader, follower = pty.openpty()
        env = {**os.environ, "COLUMNS": "200"}
        process = subprocess.Popen(_command() + ["view", str(run), *extra], stdout=follower, env=env)
        os.close(follower)
        output = b""
        while True:  # read as it writes (a terminal's buffer is small), to the end
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the end: no process has it open any more
                break
            if not chunk:
                break
            output += chunk
        os.close(leader)
        assert process.wait(timeout=120) == 0
        text = output.decode().replace("\r\n", "\n")
        assert text.startswith("1000 rollouts,") is summary
        assert len(_listed(text)) == (20 if summary else 1001)


def test_bad_gzip_sizes_and_cut_facts_lines_fall_back_to_the_spans(tmp_path):
    _writer_run(tmp_path, rollouts=10, batch=3)
    (segment,) = files.span_segments(tmp_path)
    expected = _resolved(facts.partials_of(segment_lines(segment)))
    facts_file = store._facts_file(segment)
    with open(facts_file, "a", encoding="utf-8") as handle:
        handle.write('{"from": 5, "at"')  # a line cut short at the end
    assert _resolved(store.segment_partials(segment)) == expected
    zipped = segment.with_name(segment.name + ".gz")
    zipped.write_bytes(gzip.compress(segment.read_bytes() + b"\n"))  # a gzip longer than its facts say
    segment.unlink()
    assert _resolved(store.segment_partials(zipped)) == expected


def test_a_closed_segments_facts_are_gzipped_with_it_and_still_read(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("GYM_AUTOINSTR_SEGMENT_MB", "0.07")  # (the smallest: 64 KiB) several segments
    _writer_run(tmp_path, rollouts=400, batch=50)
    segments.COMPRESSOR.drain(time.monotonic() + 30)
    found = files.span_segments(tmp_path)
    closed = [s for s in found if s.name.endswith(".gz")]
    assert len(found) >= 3 and len(closed) == len(found) - 1  # all but the open one
    for segment in found:
        facts_file = store._facts_file(segment)
        assert facts_file.name.endswith(".facts.gz") is segment.name.endswith(".gz"), facts_file
        assert store._facts_records(facts_file)
    # read from the facts (gzipped or not) and from the spans: the same rows (a trace cut by a
    # rotation is whole once its segments are merged)
    original, read = facts.partials_of, []
    monkeypatch.setattr(facts, "partials_of", lambda *args: read.append(args[1:2]) or original(*args))
    rows = {r.trace_id: r.row[: facts.R_FILES] for r in store.load([str(tmp_path)]).rollouts}
    assert read == []  # every segment's facts taken, none of its spans parsed
    monkeypatch.setattr(facts, "partials_of", original)
    merged: dict = {}
    for index, segment in enumerate(found):
        facts.partials_of(segment_lines(segment), into=merged, index=index)
    assert rows == {t: facts.resolve(t, p)[: facts.R_FILES] for t, p in merged.items()} and len(rows) == 401


def test_a_span_whose_facts_fail_is_kept_and_its_batch_read_from_the_spans(tmp_path, monkeypatch):
    from gym_autoinstr.fastpath import span_facts

    original = span_facts.fact
    calls = []

    def sometimes(span, kept):
        calls.append(1)
        if len(calls) == 5:
            raise ValueError("a value the facts cannot hold")
        return original(span, kept)

    monkeypatch.setattr(span_facts, "fact", sometimes)
    _writer_run(tmp_path, rollouts=10, batch=3)
    (segment,) = files.span_segments(tmp_path)
    from_spans = _resolved(facts.partials_of(segment_lines(segment)))
    assert sum(row[facts.R_COUNT] for row in from_spans.values()) == 31  # every span written, none lost
    lines = sum(1 for _line in segment_lines(segment))
    assert len(store._facts_records(store._facts_file(segment))) == lines - 1  # that batch has no facts line
    assert _resolved(store.segment_partials(segment)) == from_spans  # read from the spans past the gap
