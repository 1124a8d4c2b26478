"""``view --metrics`` from metrics files written by our file exporter (in-process, a real
SDK meter provider): counts, percentiles from buckets, several processes of one server."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gym_autoinstr.commands import slow
from gym_autoinstr.commands.view import command as view
from gym_autoinstr.setup import files
from gym_autoinstr.telemetry.metrics import DURATION_BOUNDARIES_MS


def _provider(run_dir, service: str) -> MeterProvider:
    """A meter provider of ``service`` writing to ``run_dir`` through our file exporter."""
    return MeterProvider(
        resource=Resource.create({"service.name": service}),
        metric_readers=[
            PeriodicExportingMetricReader(files.metric_exporter(run_dir, service), export_interval_millis=3_600_000)
        ],
    )


def _process(run_dir, service: str, values: list[float]) -> None:
    provider = _provider(run_dir, service)
    histogram = provider.get_meter("t").create_histogram(
        "gym.rollout.duration_ms", unit="ms", explicit_bucket_boundaries_advisory=list(DURATION_BOUNDARIES_MS)
    )
    for value in values:
        histogram.record(value, {"nemo.gym.rollout.outcome": "success"})
    provider.force_flush()
    for value in values[:1]:  # a second, later cumulative line: the summary reads the latest
        histogram.record(value, {"nemo.gym.rollout.outcome": "success"})
    provider.shutdown()


def test_summary_adds_processes_and_estimates_percentiles(tmp_path):
    _process(tmp_path, "nemo-gym/agent", [float(v) for v in range(1, 101)])  # 1..100 ms, then 1 once more
    # a second process of the same server (a uvicorn worker: its own file), then 1000 once more
    _process(tmp_path / "worker", "nemo-gym/agent", [1000.0] * 10)
    assert len(list(tmp_path.rglob(f"*{files.METRICS_SUFFIX}"))) == 2
    summary = slow.summarise(slow.read_run(tmp_path))
    (row,) = summary["nemo-gym/agent"]["gym.rollout.duration_ms"]
    assert row["count"] == 101 + 11
    assert 25 <= row["p50_ms"] <= 100  # the median falls in the 50-100 ms bucket region
    assert 250 < row["p99_ms"] <= 1000  # the slow worker's calls are the top 10 %
    text = slow.render_text(summary)
    assert text.splitlines()[0] == "nemo-gym/agent"
    assert " 112 " in text and "rollouts" in text


def test_no_metrics_files_gives_no_summary(tmp_path, capsys):
    assert slow.render_text(slow.summarise(slow.read_run(tmp_path))) == ""
    assert slow.render_html(slow.summarise(slow.read_run(tmp_path))) == ""
    assert view.main([str(tmp_path)], metrics=True) == 1
    assert capsys.readouterr().err.startswith(f"gym-autoinstr view: no metrics (*.metrics.jsonl) in {tmp_path}: they")


def test_waits_for_gyms_semaphores_and_sandbox_times_are_summarised(tmp_path):
    provider = _provider(tmp_path, "nemo-gym/model")
    meter = provider.get_meter("t")
    waits = meter.create_histogram("gym.concurrency.queue_wait_duration_ms", unit="ms")
    for value in (5.0, 50.0, 500.0):
        waits.record(
            value, {"nemo.gym.concurrency.site": "SimpleModelServer._semaphore", "nemo.gym.server.name": "model"}
        )
    meter.create_histogram("gym.sandbox.exec_duration_ms", unit="ms").record(
        1200.0, {"nemo.gym.sandbox.provider": "docker"}
    )
    provider.shutdown()
    lines = slow.render_text(slow.summarise(slow.read_run(tmp_path))).splitlines()
    (wait,) = [line for line in lines if "waits for a Gym limit" in line]
    assert "SimpleModelServer._semaphore" in wait and wait.split()[-4] == "3"
    (sandbox,) = [line for line in lines if "sandbox execs" in line]
    assert "docker" in sandbox and sandbox.split()[-4] == "1"


def test_the_page_section_draws_p50_and_p99_bars(tmp_path):
    import re

    _process(tmp_path, "nemo-gym/agent", [float(v) for v in range(1, 101)])
    summary = slow.summarise(slow.read_run(tmp_path))
    (row,) = summary["nemo-gym/agent"]["gym.rollout.duration_ms"]
    section = slow.render_html(summary)
    (bar,) = re.findall(r"<svg class=\"p-bar\"[^>]*>.*?</svg>", section)
    p99 = float(re.search(r'class="p99"[^>]*width="([\d.]+)"', bar)[1])
    p50 = float(re.search(r'class="p50"[^>]*width="([\d.]+)"', bar)[1])
    # the row with the slowest p99 fills the bar; its p50 is its share of that
    assert p99 == slow.CHART_WIDTH
    assert p50 == round(slow.CHART_WIDTH * row["p50_ms"] / row["p99_ms"], 1)
    assert f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms" in bar


def test_the_page_draws_gc_pauses_to_a_scale_of_their_own(tmp_path):
    """A process's start-up makes its longest garbage collections (hundreds of ms): the
    server's request bars are drawn to the scale of its requests, not of those pauses."""
    import re

    provider = _provider(tmp_path, "nemo-gym/policy_model")
    meter = provider.get_meter("t")
    requests = meter.create_histogram("http.server.request.duration", unit="s")
    for seconds in (0.010, 0.015, 0.020):
        requests.record(seconds, {"http.request.method": "POST", "http.route": "/v1/responses"})
    pauses = meter.create_histogram("gym.gc.pause_duration_ms", unit="ms")
    for ms, generation in ((300.0, 2), (250.0, 2), (0.2, 0), (0.3, 0)):  # the imports' collections, then serving's
        pauses.record(ms, {"nemo.gym.gc.generation": generation})
    provider.shutdown()
    section = slow.render_html(slow.summarise(slow.read_run(tmp_path)))
    bars = {
        label: float(re.search(r'class="p99"[^>]*width="([\d.]+)"', row)[1])
        for label, row in re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td>.*?(<svg.*?</svg>)", section)
    }
    assert bars["POST /v1/responses"] == slow.CHART_WIDTH  # not 160 * 20 / 300 px
    assert bars["gen 2"] == slow.CHART_WIDTH and bars["gen 0"] < 2
    heading = section.index("the process: its own scale (GC pauses count its start-up too)")
    assert section.index("POST /v1/responses") < heading < section.index("gen 2")
