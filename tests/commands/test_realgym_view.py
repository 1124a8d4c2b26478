"""``gym-autoinstr view`` on a real run: one real Gym 0.4.0 trio under
``opentelemetry-instrument`` with nothing configured (the embedded default writes one
OTLP-JSON file per process), every span group on, a few sequential rollouts (``real_run``),
read back in the terminal and in headless Chromium.  Gym 0.4.0 has no rollout ids and no
failures: the filters those need are in ``test_view.py``, the helpers used here in
``view_helpers.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_autoinstr.commands.view.filters import select
from gym_autoinstr.commands.view.model import build_traces, summary
from gym_autoinstr.setup.files import METRICS_SUFFIX, read_path, segment_files, segment_lines, span_segments
from tests.commands.view_helpers import (
    _assert_page_matches_traces,
    _assert_self_contained,
    _assert_text_matches_rows,
    _assert_tree_shape,
    _cli,
    _header_trace_id,
    _listed,
    _png_size,
    _probe_layout,
    _rendered_dom,
    _run_chromium,
    _service,
    _text_blocks,
)

pytestmark = pytest.mark.realgym

N_ROLLOUTS = 4


# ------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A run directory written by a real 0.4.0 trio with nothing configured."""
    from tests.harness.trio import GymTrio, PolicyModel

    version = "0.4.0"
    workdir = tmp_path_factory.mktemp("view-gym")
    with PolicyModel() as model:
        trio = GymTrio.for_version(
            version,
            workdir,
            policy_url=model.url,
            instrument=True,
            env={"GYM_AUTOINSTR_SPAN_GROUPS": "all"},
        )
        with trio:
            results = trio.rollouts(N_ROLLOUTS, concurrency=1)  # sequential: trace order is rollout order
    assert [r["reward"] for r in results] == [1.0] * N_ROLLOUTS
    runs = list((workdir / "gym-autoinstr-runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def real_spans(real_run) -> list[dict]:
    return read_path(real_run)


@pytest.fixture(scope="module")
def real_rollouts(real_spans) -> list:
    """The rollouts' traces (those rooted at the agent's ``POST /run``), in start order."""
    from tests.harness.trio import AGENT

    traces = [
        t
        for t in build_traces(real_spans)
        if any(
            r.depth == 0 and r.span["name"] == "POST /run" and _service(r.span) == f"nemo-gym/{AGENT}" for r in t.rows
        )
    ]
    assert len(traces) == N_ROLLOUTS
    return traces


# ------------------------------------------------------------------------- real run: model


def test_real_run_is_one_trace_per_rollout_in_start_order(real_run, real_spans, real_rollouts):
    traces = build_traces(real_spans)
    starts = [t.start_ns for t in traces]
    assert starts == sorted(starts)
    # sequential rollouts: each rollout's work is over before the next begins.  The root
    # SERVER span (`POST /run`) is the exception: it ends when the agent's app returns,
    # a moment after the response reached the client, which may already have sent the
    # next rollout by then.
    for earlier, later in zip(real_rollouts, real_rollouts[1:]):
        (root,) = [s for s in earlier.spans if not s["parent_span_id"]]
        assert root["start_ns"] < later.start_ns
        assert max(s["end_ns"] for s in earlier.spans if s is not root) <= later.start_ns
    # one file per process, every process in every rollout
    processes = {p.name.rsplit("-", 1)[0] for p in span_segments(real_run)}
    assert len(processes) == 4  # the three servers, and the orchestrator's start-up spans
    assert {p.name.rsplit("-", 1)[0] for p in segment_files(real_run, METRICS_SUFFIX)} == processes
    assert all(len(t.services) == 3 for t in real_rollouts)


def test_real_run_tree_shape_with_seam_spans(real_rollouts):
    from tests.harness.trio import MODEL, RESOURCES

    for trace in real_rollouts:
        _assert_tree_shape(trace)
        assert [r.depth for r in trace.rows].count(0) == 1
        by_id = {s["span_id"]: s for s in trace.spans}
        parent_name = lambda span: by_id[span["parent_span_id"]]["name"]  # noqa: E731
        names = [r.span["name"] for r in trace.rows]
        assert names[:2] == ["POST /run", "gym.rollout"]
        models = [s for s in trace.spans if s["name"] == "gym.model.responses"]
        assert len(models) == 2  # two model calls per rollout
        for span in models:
            assert _service(span) == f"nemo-gym/{MODEL}" and parent_name(span) == "POST /v1/responses"
        verify = [s for s in trace.spans if s["name"] == "gym.verify"]
        assert len(verify) == 1 and parent_name(verify[0]) == "POST /verify"
        assert _service(verify[0]) == f"nemo-gym/{RESOURCES}"


def test_real_run_summary_counts_the_callees_server_spans(real_rollouts):
    from tests.harness.trio import MODEL, RESOURCES

    def server_ms(trace, service, name=None):
        return sum(
            (s["end_ns"] - s["start_ns"]) / 1e6
            for s in trace.spans
            if s["kind"] == "SERVER" and _service(s) == f"nemo-gym/{service}" and (name is None or s["name"] == name)
        )

    for trace in real_rollouts:
        numbers = summary(trace)
        assert numbers["total"] == pytest.approx((trace.end_ns - trace.start_ns) / 1e6)
        assert numbers["model"] == pytest.approx(server_ms(trace, MODEL))
        assert numbers["tools"] == pytest.approx(server_ms(trace, RESOURCES, "POST /get_weather"))
        assert numbers["verify"] == pytest.approx(server_ms(trace, RESOURCES, "POST /verify"))
        assert 0 < numbers["model"] and 0 < numbers["tools"] and 0 < numbers["verify"]
        assert numbers["model"] + numbers["tools"] + numbers["verify"] < numbers["total"]


# ------------------------------------------------------------------------- real run: CLI


def test_cli_lists_every_real_trace_then_draws_each_as_its_tree(real_run, real_spans):
    result = _cli("view", str(real_run))
    assert result.returncode == 0, result.stderr
    traces = build_traces(real_spans)
    # the list: the rollouts in start order, then the start-up traces apart
    startup = [t for t in traces if t.is_startup]
    assert startup and all(t.root["name"] in ("gym.startup", "gym.server.startup") for t in startup)
    rollouts_first = [t for t in traces if not t.is_startup] + startup
    assert [r["id"] for r in _listed(result.stdout)] == [t.trace_id[:12] for t in rollouts_first]
    assert "start-up traces (processes starting, not rollouts): " in result.stdout
    # CLIENT rows name the Gym server and route they called
    first = _cli("view", str(real_run), "--trace", traces[-1].trace_id[:10]).stdout
    assert "POST → " in first and " /v1/responses" in first
    for trace in traces:
        shown = _cli("view", str(real_run), "--trace", trace.trace_id[:16])
        assert shown.returncode == 0, shown.stderr
        (block,) = _text_blocks(shown.stdout)
        assert _header_trace_id(block) == trace.trace_id
        assert block[0].startswith(f"trace {trace.trace_id}  {len(trace.spans)} spans, {len(trace.services)} services")
        numbers = summary(trace)
        assert block[1].strip() == (
            f"total {numbers['total']:.1f} ms | model {numbers['model']:.1f} ms | tools {numbers['tools']:.1f} ms"
            f" | verify {numbers['verify']:.1f} ms"
        )
        _assert_text_matches_rows(block, trace)
        assert "ERROR" not in "\n".join(block)


def test_cli_slowest_errors_and_rollout_on_the_real_run(real_run, real_spans):
    traces = build_traces(real_spans)
    # the N slowest rollouts, slowest first: the start-up traces (the longest) are not ranked
    by_duration = sorted((t for t in traces if not t.is_startup), key=lambda t: t.duration_ms, reverse=True)
    assert len(traces) > len(by_duration)  # a start-up trace at least
    for n in (1, 2, len(traces)):
        chosen = select(traces, slowest=n)
        assert [t.trace_id for t in chosen] == [t.trace_id for t in by_duration[:n]]
        result = _cli("view", str(real_run), "--slowest", str(n))
        assert result.returncode == 0, result.stderr
        assert [r["id"] for r in _listed(result.stdout)] == [t.trace_id[:12] for t in by_duration[:n]]
        assert "start-up traces" not in result.stdout
    # a healthy 0.4.0 run: no errors, and no rollout ids to select by
    for args in (["--errors"], ["--rollout", "0-0"]):
        result = _cli("view", str(real_run), *args)
        assert result.returncode == 1 and result.stdout == ""
        assert "no traces found matching the filters" in result.stderr


def test_cli_reads_standard_input(real_run):
    joined = "".join("".join(segment_lines(p)) for p in span_segments(real_run))
    from_stdin = _cli("view", "-", stdin=joined)
    from_dir = _cli("view", str(real_run))
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_dir.stdout and from_stdin.stdout.startswith("start (UTC)")


def test_html_page_of_the_real_run_in_chromium(real_run, real_spans, tmp_path):
    page = tmp_path / "page.html"
    result = _cli("view", str(real_run), "--html", str(page))
    assert result.returncode == 0, result.stderr
    traces = build_traces(real_spans)
    assert result.stdout.strip() == f"wrote {len(traces)} traces to {page}"
    # the page opens on the first rollout: the start-up traces are drawn after the rest
    assert traces[0].is_startup
    traces = [t for t in traces if not t.is_startup] + [t for t in traces if t.is_startup]

    document = _rendered_dom(tmp_path, page)
    _assert_page_matches_traces(document, traces)
    _assert_self_contained(page, document)
    assert "http://127.0.0.1" in document.all_text()  # url.full is shown as text, never loaded
    assert not document.find("details", "error")
    _probe_layout(tmp_path, page, traces)

    screenshot = tmp_path / "page.png"
    _run_chromium(tmp_path, f"--screenshot={screenshot}", page.resolve().as_uri())
    assert _png_size(screenshot) == (1400, 1000)
    assert screenshot.stat().st_size > 20_000  # a blank page is a few kB


def test_why_is_it_slow_summary_of_the_real_run(real_run):
    """``view --metrics`` on the real run's metrics files: one block per server, its routes
    with counts and percentiles, rollouts, model calls, verify, event-loop lag, GC."""
    from tests.harness.trio import AGENT, MODEL, RESOURCES

    result = _cli("view", str(real_run), "--metrics")
    assert result.returncode == 0, result.stderr
    blocks = {block[0]: block[1:] for block in _text_blocks(result.stdout)}
    assert {f"nemo-gym/{n}" for n in (AGENT, MODEL, RESOURCES)} <= set(blocks)

    def row(service: str, section: str, label: str) -> list[str]:
        found = [
            line.split() for line in blocks[f"nemo-gym/{service}"] if line.strip().startswith(section) and label in line
        ]
        assert len(found) == 1, (section, label, blocks[f"nemo-gym/{service}"])
        return found[0]

    # count, p50, p99, total are the last four columns
    assert int(row(AGENT, "requests", "POST /run 200")[-4]) == N_ROLLOUTS
    assert int(row(AGENT, "rollouts", "success")[-4]) == N_ROLLOUTS
    assert int(row(RESOURCES, "verify", "success")[-4]) == N_ROLLOUTS
    model = row(MODEL, "model calls", "responses")
    assert int(model[-4]) == 2 * N_ROLLOUTS and 0 < float(model[-3]) <= float(model[-2])  # p50 <= p99
    for service in (AGENT, MODEL, RESOURCES):
        assert int(row(service, "event-loop lag", "")[-4]) > 0
    assert any(line.strip().startswith("GC pauses") for line in blocks[f"nemo-gym/{AGENT}"])


def test_html_page_of_the_real_run_has_the_summary(real_run, tmp_path):
    page = tmp_path / "with-metrics.html"
    assert _cli("view", str(real_run), "--html", str(page)).returncode == 0
    text = page.read_text()
    assert text.count('<section class="why-slow"') == 1
    assert "Why is it slow" in text and "nemo-gym/" in text[text.index('<section class="why-slow"') :]
