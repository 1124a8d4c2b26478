"""The embedded default's files: OTLP-JSON lines, each process's own segments, gzipped once
closed, under one disk budget for the run, every loss counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from gym_autoinstr import losses
from gym_autoinstr._log import forget_said
from gym_autoinstr.fastpath import wire_json
from gym_autoinstr.fastpath.batching import EncodingSpanProcessor
from gym_autoinstr.setup import files, notes, segments
from gym_autoinstr.setup.flush import WatchedExporter


def _provider(exporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "nemo-gym/agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_round_trip_in_the_collector_file_format(tmp_path):
    exporter = files.OtlpJsonFileExporter(tmp_path, "nemo-gym/agent")
    tracer = _provider(exporter).get_tracer("t")
    with tracer.start_as_current_span(
        "POST /run", kind=SpanKind.SERVER, attributes={"http.response.status_code": 200}
    ) as root:
        with tracer.start_as_current_span("HTTP POST", kind=SpanKind.CLIENT, attributes={"url.full": "http://m/v1"}):
            pass
    assert exporter.path.parent == tmp_path and exporter.path.name == f"nemo-gym_agent-{os.getpid()}.0001.jsonl"
    lines = exporter.path.read_text().splitlines()
    assert len(lines) == 2
    raw = json.loads(lines[0])
    span = raw["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16) == root.get_span_context().trace_id
    assert span["kind"] == 3  # enums as integers, as OTLP/JSON requires
    spans = files.read_path(tmp_path)
    by_name = {s["name"]: s for s in spans}
    assert by_name["HTTP POST"]["parent_span_id"] == format(root.get_span_context().span_id, "016x")
    assert by_name["POST /run"]["kind"] == "SERVER" and by_name["POST /run"]["parent_span_id"] is None
    assert by_name["POST /run"]["attributes"]["http.response.status_code"] == 200
    assert by_name["HTTP POST"]["resource"]["service.name"] == "nemo-gym/agent"


def test_concurrent_processes_never_interleave_or_lose_a_line(tmp_path):
    writer = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from gym_autoinstr.setup.files import OtlpJsonFileExporter
        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(
                OtlpJsonFileExporter(Path(sys.argv[1]), "w"), schedule_delay_millis=5, max_export_batch_size=7
            )
        )
        tracer = provider.get_tracer("t")
        for i in range(1500):
            with tracer.start_as_current_span(f"s{i}", attributes={"payload": "x" * 200}):
                pass
        provider.shutdown()
        """
    )
    processes = [subprocess.Popen([sys.executable, "-c", writer, str(tmp_path)]) for _ in range(4)]
    assert [p.wait(120) for p in processes] == [0, 0, 0, 0]
    written = files.span_segments(tmp_path)
    assert len(written) == 4  # one file per process
    for file in written:
        for line in files.segment_lines(file):
            json.loads(line)  # every line whole
    spans = files.read_path(tmp_path)
    assert len(spans) == 4 * 1500
    assert len({(s["trace_id"], s["span_id"]) for s in spans}) == 6000


def test_embedded_default_only_without_explicit_configuration():
    assert files.embedded_default_applies({})
    assert not files.embedded_default_applies({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not files.embedded_default_applies({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318"})
    assert not files.embedded_default_applies({"OTEL_TRACES_EXPORTER": "console"})


def test_the_run_directory_is_resolved_once_and_inherited(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ: dict[str, str] = {}
    directory = files.resolve_output_dir("run-1", environ)
    assert directory == tmp_path / "gym-autoinstr-runs" / "run-1"
    assert environ[files.OUTPUT_DIR_VARIABLE] == str(directory)
    monkeypatch.chdir(Path("/"))
    assert files.resolve_output_dir("other", environ) == directory  # a child with another cwd


def _fast_provider(exporter, **options) -> tuple[TracerProvider, EncodingSpanProcessor]:
    """The embedded default's pipeline: spans encoded as JSON when they end, batched."""
    provider = TracerProvider(resource=Resource.create({"service.name": "nemo-gym/agent"}))
    settings = {"max_queue_size": 10_000, "schedule_delay_millis": 60_000, "max_export_batch_size": 64}
    settings.update(options)
    processor = EncodingSpanProcessor(WatchedExporter(exporter, "files"), encoding=wire_json, label="files", **settings)
    provider.add_span_processor(processor)
    return provider, processor


def _spans_of(tracer, count: int, pad: int = 200) -> list[int]:
    ids = []
    for i in range(count):
        with tracer.start_as_current_span(f"span-{i}", attributes={"pad": "p" * pad, "i": i}) as span:
            ids.append(span.get_span_context().span_id)
    return ids


def test_segments_rotate_and_are_gzipped_and_read_back_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_AUTOINSTR_SEGMENT_MB", "0.0625")  # 64 KB
    exporter = files.OtlpJsonFileExporter(tmp_path, "nemo-gym/agent")
    provider, processor = _fast_provider(exporter)
    ids = _spans_of(provider.get_tracer("t"), 3000)
    processor.force_flush()
    deadline = time.monotonic() + 30
    while segments.COMPRESSOR._queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    names = sorted(p.name for p in tmp_path.iterdir())
    stem = f"nemo-gym_agent-{os.getpid()}"
    closed = [n for n in names if n.endswith(".jsonl.gz")]
    assert len(closed) >= 3 and all(n.startswith(stem + ".") for n in closed)
    assert names[-1] == exporter.path.name and exporter.path.name.endswith(".jsonl")  # the open one, plain
    assert not [n for n in names if n.startswith(".")]  # no partial left
    files.seal_writers(time.monotonic() + 10)
    assert not list(tmp_path.glob("*.jsonl"))  # a clean exit gzips the open one too
    ids += _spans_of(provider.get_tracer("t"), 5)  # spans ending after that: the next segment
    processor.force_flush()
    assert exporter.path.exists() and not exporter.path.with_name(exporter.path.name + ".gz").exists()
    files.seal_writers(time.monotonic() + 10)
    spans = files.read_path(tmp_path)
    assert [int(s["span_id"], 16) for s in spans] == ids  # all, in order, each once
    first = files.span_segments(tmp_path)[0]
    plain = sum(len(line) for line in files.segment_lines(first))
    assert plain > 5 * first.stat().st_size  # gzip pays: OTLP-JSON shrinks more than 5x


def test_a_segment_cut_short_by_a_crash_is_read_up_to_the_cut(tmp_path, caplog):
    forget_said()
    exporter = files.OtlpJsonFileExporter(tmp_path, "agent")
    provider, processor = _fast_provider(exporter, max_export_batch_size=10)
    _spans_of(provider.get_tracer("t"), 400)
    processor.force_flush()
    path = exporter.path
    assert segments.compress(path)
    zipped = path.with_name(path.name + ".gz")
    data = zipped.read_bytes()
    zipped.write_bytes(data[: len(data) * 2 // 3])  # the process died while writing it
    spans = files.read_path(tmp_path)
    assert 0 < len(spans) < 400
    assert any("ends early" in r.getMessage() for r in caplog.records)


def test_a_plain_segment_gzipped_while_read_is_read_from_its_gzip(tmp_path):
    exporter = files.OtlpJsonFileExporter(tmp_path, "agent")
    provider, processor = _fast_provider(exporter, max_export_batch_size=5)
    _spans_of(provider.get_tracer("t"), 50)
    processor.force_flush()
    path = exporter.path
    first = next(iter(files.segment_lines(path)))
    assert segments.compress(path) and not path.exists()
    rest = list(files.segment_lines(path, skip=len(first.encode())))  # where a follower left off
    assert len(rest) == 9 and first not in rest


def test_the_run_budget_drops_spans_says_so_once_and_counts_them(tmp_path, monkeypatch, caplog):
    forget_said()
    losses.LEDGER.forget()
    (tmp_path / "other-process.0001.jsonl").write_bytes(b"x" * 40_000)  # the run's other files count too
    monkeypatch.setenv("GYM_AUTOINSTR_RUN_MAX_GB", str(60_000 / 1024**3))
    exporter = files.OtlpJsonFileExporter(tmp_path, "agent")
    provider, processor = _fast_provider(exporter, max_export_batch_size=10)
    _spans_of(provider.get_tracer("t"), 300)
    processor.force_flush()
    written = len(files.read_path(tmp_path))
    assert 0 < written < 300
    assert segments.run_bytes(tmp_path) <= 60_000
    lost = {(e["exporter"], e["reason"]): e["count"] for e in losses.LEDGER.entries()}
    assert lost == {("files", "disk_budget"): 300 - written}
    said = [r.getMessage() for r in caplog.records if "budget" in r.getMessage()]
    assert any("% of its budget" in m for m in said)  # near it, once
    reached = [m for m in said if "further spans are dropped" in m]
    assert len(reached) == 1 and "GYM_AUTOINSTR_RUN_MAX_GB" in reached[0]


def test_an_unwritable_directory_is_reported_once_counted_and_never_raises(tmp_path, caplog):
    forget_said()
    losses.LEDGER.forget()
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    exporter = files.OtlpJsonFileExporter(blocker / "runs", "agent")
    provider, processor = _fast_provider(exporter, max_export_batch_size=2)
    _spans_of(provider.get_tracer("t"), 6)
    processor.force_flush()
    assert not (blocker / "runs").exists()
    messages = [r.getMessage() for r in caplog.records if "cannot write telemetry" in r.getMessage()]
    assert len(messages) == 1 and files.OUTPUT_DIR_VARIABLE in messages[0]
    assert [(e["reason"], e["count"]) for e in losses.LEDGER.entries()] == [("unwritable", 6)]


def test_the_process_note_counts_spans_and_losses(tmp_path, monkeypatch):
    losses.LEDGER.forget()
    monkeypatch.setattr(losses.LEDGER, "sources", [])  # this test's processor alone
    exporter = files.OtlpJsonFileExporter(tmp_path, "nemo-gym/agent")
    provider, processor = _fast_provider(exporter, max_queue_size=5, max_export_batch_size=100)
    _spans_of(provider.get_tracer("t"), 40)  # the queue holds 5: most are dropped
    note = notes.NoteWriter(tmp_path, files.process_stem("nemo-gym/agent"), "nemo-gym/agent")
    note.write()
    [read] = notes.process_notes(tmp_path)
    assert read["alive"] is True and read["final"] is False and read["service"] == "nemo-gym/agent"
    [lost] = read["lost"]
    assert (lost["exporter"], lost["reason"]) == ("files", "queue_full") and lost["count"] >= 25
    assert read["spans"]["ended"] == 40 and read["spans"]["queued"] + read["spans"]["written"] + lost["count"] == 40
    processor.force_flush()
    note.close()
    [final] = notes.process_notes(tmp_path)
    assert final["final"] is True and final["alive"] is False and final["spans"]["queued"] == 0
    assert final["spans"]["written"] == len(files.read_path(tmp_path)) == 40 - lost["count"]
    text = losses.describe([final])
    assert text.startswith(f"{lost['count']} spans of 40 lost: ") and "agent (files), queue full" in text


def test_a_segment_that_cannot_be_written_in_an_existing_directory_is_counted_as_unwritable(tmp_path, caplog):
    forget_said()
    losses.LEDGER.forget()
    exporter = files.OtlpJsonFileExporter(tmp_path, "agent")
    exporter.path.mkdir()  # the segment's name taken by a directory: open() fails, the directory exists
    provider, processor = _fast_provider(exporter, max_export_batch_size=3)
    _spans_of(provider.get_tracer("t"), 6)
    processor.force_flush()
    assert [(e["reason"], e["count"]) for e in losses.LEDGER.entries()] == [("unwritable", 6)]
    messages = [r.getMessage() for r in caplog.records if "cannot write telemetry" in r.getMessage()]
    assert len(messages) == 1 and str(exporter.path) in messages[0]
