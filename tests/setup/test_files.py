"""The embedded default's files: OTLP-JSON lines, one file per process, bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from gym_autoinstr._log import forget_said
from gym_autoinstr.setup import files


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
    assert exporter.path.parent == tmp_path and exporter.path.name == f"nemo-gym_agent-{os.getpid()}.jsonl"
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
    written = sorted(tmp_path.glob("*.jsonl"))
    assert len(written) == 4  # one file per process
    for file in written:
        for line in file.read_text().splitlines():
            json.loads(line)  # every line whole
    spans = files.read_path(tmp_path)
    assert len(spans) == 4 * 1500
    assert len({(s["trace_id"], s["span_id"]) for s in spans}) == 6000


def test_the_bound_drops_spans_with_one_clear_message(tmp_path, monkeypatch, caplog):
    forget_said()
    monkeypatch.setenv(files.MAX_MB_VARIABLE, "0.002")  # about 2 KB
    exporter = files.OtlpJsonFileExporter(tmp_path, "agent")
    tracer = _provider(exporter).get_tracer("t")
    for i in range(50):
        with tracer.start_as_current_span(f"span-{i}", attributes={"pad": "y" * 100}):
            pass
    assert exporter.path.stat().st_size <= 2 * 1024 * 1.024
    assert 0 < len(files.read_path(tmp_path)) < 50
    messages = [r.getMessage() for r in caplog.records if "reached its bound" in r.getMessage()]
    assert len(messages) == 1 and files.MAX_MB_VARIABLE in messages[0]


def test_an_unwritable_directory_is_reported_once_and_never_raises(tmp_path, caplog):
    forget_said()
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    exporter = files.OtlpJsonFileExporter(blocker / "runs", "agent")
    tracer = _provider(exporter).get_tracer("t")
    for _ in range(3):
        with tracer.start_as_current_span("x"):
            pass
    assert not (blocker / "runs").exists()
    messages = [r.getMessage() for r in caplog.records if "cannot write traces" in r.getMessage()]
    assert len(messages) == 1 and files.OUTPUT_DIR_VARIABLE in messages[0]


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
