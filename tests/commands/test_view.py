"""``gym-autoinstr view`` in the terminal and as JSON, on ``handbuilt_run`` (``conftest.py``):
three rollouts written through the real ``OtlpJsonFileExporter`` by three "processes" (one
provider and one file each), with rollout ids, fixed timestamps and one ERROR span, for the
filters whose inputs a healthy real Gym 0.4.0 run (``real_run``, in ``test_realgym_view.py``)
lacks.  The page in Chromium: ``test_view_html.py``; the helpers: ``view_helpers.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gym_autoinstr.commands.view.filters import select
from gym_autoinstr.commands.view.model import build_traces, summary
from gym_autoinstr.setup.files import read_path
from tests.commands.view_helpers import (
    BASE_NS,
    HANDBUILT,
    MS,
    _assert_text_matches_rows,
    _assert_tree_shape,
    _cli,
    _command,
    _header_trace_id,
    _listed,
    _text_blocks,
    _tracer,
)

# ------------------------------------------------------------------------- hand-built run


def test_handbuilt_traces_are_shown_in_start_order_not_file_order(handbuilt_run):
    traces = build_traces(read_path(handbuilt_run["dir"]))
    assert [sorted(t.rollout_ids) for t in traces] == [["7-0"], ["7-1"], ["7-2"]]
    for trace, (total, *_rest) in zip(traces, HANDBUILT.values()):
        _assert_tree_shape(trace)
        assert trace.duration_ms == pytest.approx(total)
        assert [r.depth for r in trace.rows] == [0, 1, 2, 3, 2, 3, 2, 3]


def test_handbuilt_summary_numbers(handbuilt_run):
    traces = build_traces(read_path(handbuilt_run["dir"]))
    for trace, (total, model_ms, tool_ms, verify_ms, _fails) in zip(traces, HANDBUILT.values()):
        assert summary(trace) == pytest.approx(
            {"total": total, "model": model_ms, "tools": tool_ms, "verify": verify_ms}
        )


def test_trace_filter_selects_exactly_that_trace(handbuilt_run):
    traces = build_traces(read_path(handbuilt_run["dir"]))
    wanted = traces[1].trace_id
    result = _cli("view", str(handbuilt_run["dir"]), "--trace", wanted.upper())
    assert result.returncode == 0, result.stderr
    assert [_header_trace_id(b) for b in _text_blocks(result.stdout)] == [wanted]
    unknown = _cli("view", str(handbuilt_run["dir"]), "--trace", "0" * 32)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == f"gym-autoinstr view: no trace id starts with {'0' * 32} (of the 3 traces read)"


def test_rollout_filter_selects_exactly_that_trace(handbuilt_run):
    directory = str(handbuilt_run["dir"])
    traces = build_traces(read_path(handbuilt_run["dir"]))
    for index in HANDBUILT:
        rollout_id = f"7-{index}"
        (chosen,) = select(traces, rollout=rollout_id)
        assert chosen is traces[index]
        assert {s["span_id"] for s in chosen.spans} == {s["span_id"] for s in traces[index].spans}
        result = _cli("view", directory, "--rollout", rollout_id)
        assert result.returncode == 0, result.stderr
        blocks = _text_blocks(result.stdout)
        assert len(blocks) == 1 and _header_trace_id(blocks[0]) == chosen.trace_id
        assert f"rollout {rollout_id}" in blocks[0][0]
        _assert_text_matches_rows(blocks[0], chosen)
    result = _cli("view", directory, "--rollout", "7-9")
    assert result.returncode == 1 and "matching the filters" in result.stderr


def test_errors_filter_selects_the_trace_with_an_error_span(handbuilt_run):
    traces = build_traces(read_path(handbuilt_run["dir"]))
    (chosen,) = select(traces, errors=True)
    assert chosen.rollout_ids == {"7-1"}
    for flag in (["--errors"], ["--status", "error"]):
        result = _cli("view", str(handbuilt_run["dir"]), *flag)
        assert result.returncode == 0, result.stderr
        (row,) = _listed(result.stdout)
        assert row["id"] == chosen.trace_id[:12] and row["status"] == "ERROR" and row["rest"].startswith("7-1 ")
    healthy = _listed(_cli("view", str(handbuilt_run["dir"]), "--status", "ok").stdout)
    assert [r["id"] for r in healthy] == [traces[0].trace_id[:12], traces[2].trace_id[:12]]
    # its waterfall: the failing span's line says ERROR and why
    result = _cli("view", str(handbuilt_run["dir"]), "--rollout", "7-1")
    (block,) = _text_blocks(result.stdout)
    assert _header_trace_id(block) == chosen.trace_id and block[0].endswith(", ERROR")
    error_lines = [line for line in block[2:] if " ERROR " in line]
    assert len(error_lines) == 1 and "POST /get_weather" in error_lines[0] and "error=TimeoutError" in error_lines[0]
    # filters combine: the one error trace is also among the two slowest
    assert select(traces, errors=True, slowest=2) == [chosen]


def test_slowest_returns_n_traces_longest_first(handbuilt_run):
    traces = build_traces(read_path(handbuilt_run["dir"]))
    assert [sorted(t.rollout_ids) for t in select(traces, slowest=2)] == [["7-1"], ["7-2"]]
    assert [t.duration_ms for t in select(traces, slowest=5)] == pytest.approx([300, 200, 100])
    result = _cli("view", str(handbuilt_run["dir"]), "--slowest", "2")
    assert result.returncode == 0
    assert [r["id"] for r in _listed(result.stdout)] == [traces[1].trace_id[:12], traces[2].trace_id[:12]]
    by_duration = _cli("view", str(handbuilt_run["dir"]), "--sort", "duration")
    longest_first = [traces[1], traces[2], traces[0]]
    assert [r["id"] for r in _listed(by_duration.stdout)] == [t.trace_id[:12] for t in longest_first]


def test_exit_codes(tmp_path, handbuilt_run):
    missing = _cli("view", str(tmp_path / "no-such-run"))
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr and missing.stdout == ""
    (tmp_path / "empty").mkdir()
    empty = _cli("view", str(tmp_path / "empty"))
    assert empty.returncode == 1 and "no traces found" in empty.stderr and empty.stdout == ""
    blank = _cli("view", "-", stdin="")
    assert blank.returncode == 1 and "no traces found" in blank.stderr
    # a missing path among good ones still fails: nothing half-read is shown
    mixed = _cli("view", str(handbuilt_run["dir"]), str(tmp_path / "no-such-run"))
    assert mixed.returncode == 2 and mixed.stdout == ""
    ok = _cli("view", str(handbuilt_run["dir"]))
    assert ok.returncode == 0 and [r["id"] for r in _listed(ok.stdout)] == [
        t.trace_id[:12] for t in build_traces(read_path(handbuilt_run["dir"]))
    ]
    # a directory and a file inside it: each span is shown once
    twice = _cli("view", str(handbuilt_run["dir"]), str(sorted(handbuilt_run["dir"].glob("*.jsonl"))[0]))
    assert twice.returncode == 0 and twice.stdout == ok.stdout
    for bad in ("0", "-1", "many"):
        refused = _cli("view", str(handbuilt_run["dir"]), "--slowest", bad)
        assert refused.returncode == 2 and "--slowest" in refused.stderr and refused.stdout == ""
    refused = _cli("view", str(handbuilt_run["dir"]), "--attr", "no-equals-sign")
    assert refused.returncode == 2 and "KEY=VALUE" in refused.stderr and refused.stdout == ""
    # two orders at once: refused, naming both and the fix
    both = _cli("view", str(handbuilt_run["dir"]), "--slowest", "2", "--sort", "reward")
    assert both.returncode == 2 and both.stdout == ""
    assert "--slowest ranks by duration, --sort reward orders by reward: give one of them" in both.stderr
    # nothing found: what was read, and why
    assert f"no span files (*.jsonl, *.jsonl.gz) in {tmp_path / 'empty'}" in empty.stderr
    assert "OTLP endpoint configured" in empty.stderr
    none = _cli("view", str(handbuilt_run["dir"]), "--where", "reward>5")
    assert none.returncode == 1 and "no traces found matching the filters, of the 3 read in" in none.stderr
    unknown = _cli("view", str(handbuilt_run["dir"]), "--rollout", "nope")
    assert unknown.returncode == 1 and "loosen them (--rollout, --trace," in unknown.stderr
    nothing_piped = _cli("view", "-", stdin="")
    assert (
        nothing_piped.returncode == 1 and "no spans on standard input; pipe a span file's lines" in nothing_piped.stderr
    )


def test_no_path_is_the_newest_run_here(tmp_path, handbuilt_run):
    nothing = subprocess.run(_command() + ["view"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 2 and "no run here (no ./gym-autoinstr-runs/<run id>/)" in nothing.stderr
    runs = tmp_path / "gym-autoinstr-runs"
    shutil.copytree(handbuilt_run["dir"], runs / "older")
    (runs / "newer").mkdir()
    (runs / "newer" / "x-1.jsonl").write_text(sorted(handbuilt_run["dir"].glob("*.jsonl"))[0].read_text())
    for file in (runs / "older").iterdir():
        os.utime(file, (1, 1))
    newest = subprocess.run(_command() + ["view"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert newest.returncode == 0, newest.stderr
    assert "the newest run, gym-autoinstr-runs/newer (another: gym-autoinstr view PATH)" in newest.stderr
    spans = lambda output: sum(r["spans"] for r in _listed(output))  # noqa: E731
    assert 0 < spans(newest.stdout) < spans(_cli("view", str(runs / "older")).stdout)  # one process's file of three


def test_stdin_reads_a_single_file_the_same_as_the_directory(handbuilt_run):
    joined = "".join(p.read_text() for p in sorted(handbuilt_run["dir"].glob("*.jsonl")))
    from_stdin = _cli("view", "-", stdin=joined)
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == _cli("view", str(handbuilt_run["dir"])).stdout


def test_a_ray_worker_span_is_drawn_under_its_submit_span_with_its_wait(tmp_path):
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    directory = tmp_path / "ray-run"
    server = _tracer(directory, "nemo-gym/code_gen", "resources_servers")
    worker = _tracer(directory, "nemo-gym/code_gen/ray", "")
    verify = server.start_span(
        "POST /verify", kind=SpanKind.SERVER, start_time=BASE_NS, attributes={"http.route": "/verify"}
    )
    submit = server.start_span(
        "ray.submit check_correctness_remote",
        context=trace.set_span_in_context(verify),
        kind=SpanKind.PRODUCER,
        start_time=BASE_NS + 1 * MS,
    )
    submit.end(end_time=BASE_NS + 2 * MS)
    execute = worker.start_span(
        "ray.execute check_correctness_remote",
        context=trace.set_span_in_context(submit),
        kind=SpanKind.CONSUMER,
        start_time=BASE_NS + 40 * MS,
        attributes={"ray.task.wait.duration": 0.0385, "ray.node.id": "8f182d92ab1af534b665"},
    )
    execute.end(end_time=BASE_NS + 90 * MS)
    verify.end(end_time=BASE_NS + 95 * MS)
    (only,) = build_traces(read_path(directory))
    result = _cli("view", str(directory), "--trace", only.trace_id[:6])  # a prefix is enough
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (submit_line,) = [line for line in lines if "ray.submit check_correctness_remote" in line]
    (execute_line,) = [line for line in lines if "ray.execute check_correctness_remote" in line]
    assert execute_line.startswith("  nemo-gym/code_gen/ray")
    # indented one level below the submit span, which is one below POST /verify
    (verify_line,) = [line for line in lines if "POST /verify" in line]
    assert (
        execute_line.index("ray.execute")
        == submit_line.index("ray.submit") + 2
        == verify_line.index("POST /verify") + 4
    )
    assert "wait=38.5ms" in execute_line and "node=8f182d92" in execute_line


def test_list_json_filters_and_width(handbuilt_run):
    directory = str(handbuilt_run["dir"])
    traces = build_traces(read_path(handbuilt_run["dir"]))
    listed = json.loads(_cli("view", directory, "--json").stdout)["traces"]
    assert [r["trace_id"] for r in listed] == [t.trace_id for t in traces]
    first = listed[0]
    assert first["span_count"] == 8 and first["status"] == "ok" and first["rollout_ids"] == ["7-0"]
    assert first["duration_ms"] == pytest.approx(100) and first["root"] == "POST /run" and not first["startup"]
    assert first["services"] == ["nemo-gym/agent", "nemo-gym/model", "nemo-gym/resources"]
    assert "spans" not in first
    # one trace: its spans, depth-first, CLIENT spans with their callee
    (one,) = json.loads(_cli("view", directory, "--rollout", "7-2", "--json").stdout)["traces"]
    assert [s["span_id"] for s in one["spans"]] == [r.span["span_id"] for r in traces[2].rows]
    assert [s["callee"] for s in one["spans"] if s["kind"] == "CLIENT"] == [
        "→ model /v1/responses",
        "→ resources /get_weather",
        "→ resources /verify",
    ]
    # filters: a service (short or full name), an attribute (span or resource)
    assert len(_listed(_cli("view", directory, "--service", "model").stdout)) == 3
    assert len(_listed(_cli("view", directory, "--service", "nemo-gym/model").stdout)) == 3
    assert _cli("view", directory, "--service", "judge").returncode == 1
    (row,) = _listed(_cli("view", directory, "--attr", "nemo.gym.rollout.id=7-2").stdout)
    assert row["id"] == traces[2].trace_id[:12]
    resource_attr = "nemo.gym.server.type=resources_servers"
    both = _cli("view", directory, "--attr", "error.type=TimeoutError", "--attr", resource_attr)
    assert [r["id"] for r in _listed(both.stdout)] == [traces[1].trace_id[:12]]
    # a narrow terminal: no line wider, names cut with an ellipsis
    for args in ([], ["--rollout", "7-1"]):
        narrow = _cli("view", directory, *args, columns=60)
        assert narrow.returncode == 0
        lines = narrow.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 60
        assert any(line.endswith("…") for line in lines)
    wide = _cli("view", directory, "--rollout", "7-1").stdout
    assert "POST → resources /get_weather" in wide and "POST /get_weather" in wide


def test_callee_of_older_files_comes_from_the_url():
    from gym_autoinstr.commands.view.model import callee

    client = {"kind": "CLIENT", "attributes": {"url.full": "http://10.0.0.2:8000/ng-rollout/3-1/v1/responses"}}
    assert callee(client) == "→ 10.0.0.2:8000 /v1/responses"
    named = {"kind": "CLIENT", "attributes": {**client["attributes"], "nemo.gym.http.destination.server.name": "m"}}
    assert callee(named) == "→ m /v1/responses"
    assert callee({"kind": "SERVER", "attributes": {"url.full": "http://x/y"}}) == ""
    assert callee({"kind": "CLIENT", "attributes": {}}) == ""


def test_without_a_terminal_nothing_is_cut(handbuilt_run):
    """Output to a file or a script (no terminal, no ``COLUMNS``): whole lines."""
    directory = str(handbuilt_run["dir"])
    drawn = _cli("view", directory, "--rollout", "7-1", columns=None).stdout
    assert "…" not in drawn and max(len(line) for line in drawn.splitlines()) > 120
    assert "ERROR route=/get_weather error=TimeoutError" in drawn
    listed = _cli("view", directory, columns=None).stdout
    assert "…" not in listed and "agent,model,resources" in listed
