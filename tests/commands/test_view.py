"""``gym-autoinstr view``: traces read back from real runs, in the terminal and in a browser.

Two fixtures:

* ``real_run`` (in ``test_realgym_view.py``, with the tests that read it): one real Gym
  0.4.0 trio under ``opentelemetry-instrument`` with nothing configured (the embedded
  default writes one OTLP-JSON file per process), every span group on, a few sequential
  rollouts.  Gym 0.4.0 has no rollout ids and no failures.
* ``handbuilt_run``: three rollouts written through the real ``OtlpJsonFileExporter``
  by three "processes" (one provider and one file each), with rollout ids, fixed
  timestamps and one ERROR span, for the filters whose inputs a healthy 0.4.0 run lacks.

The HTML page is loaded in real headless Chromium: ``--dump-dom`` for the DOM the
browser built (plus a layout probe added to a copy of the page), ``--screenshot`` for a
PNG.  Without Chromium the browser tests fail when ``CI=true`` and skip otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gym_autoinstr.commands.view.filters import select
from gym_autoinstr.commands.view.model import build_traces, display_name, summary
from gym_autoinstr.commands.view.model import callee as callee_text
from gym_autoinstr.setup.files import OtlpJsonFileExporter, read_path
from tests.harness.browser import require_chromium

BASE_NS = 1_700_000_000_000_000_000
MS = 1_000_000


# ------------------------------------------------------------------------- helpers


def _service(span: dict) -> str:
    return span["resource"].get("service.name", "")


def _command() -> list[str]:
    """The installed ``gym-autoinstr`` command (the console script)."""
    script = Path(sys.executable).parent / "gym-autoinstr"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gym_autoinstr.commands.cli"]


def _cli(
    *args: str, stdin: str | None = None, columns: int | None = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The command as a user runs it, in a terminal ``columns`` wide (``COLUMNS``; None: no
    terminal at all, output captured as a script would); ``env`` added to the environment."""
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, **(env or {})}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(_command() + list(args), input=stdin, capture_output=True, text=True, timeout=120, env=env)


def _text_blocks(stdout: str) -> list[list[str]]:
    """The text output split into one list of lines per trace."""
    return [block.splitlines() for block in stdout.strip().split("\n\n")]


LIST_ROW = re.compile(r"(\d\d:\d\d:\d\d\.\d{3})  ([0-9a-f]{12})  +(\S+ m?s)  +(\d+)  (ok|ERROR) +(.*)")


def _listed(stdout: str) -> list[dict]:
    """The list's trace lines: start, id prefix, duration, spans, status, and the rest."""
    rows = []
    for line in stdout.splitlines():
        match = LIST_ROW.fullmatch(line)
        if match:
            start, prefix, took, spans, status, rest = match.groups()
            rows.append({"start": start, "id": prefix, "spans": int(spans), "status": status, "rest": rest})
    return rows


def _header_trace_id(block: list[str]) -> str:
    match = re.match(r"trace ([0-9a-f]{32})  ", block[0])
    assert match, block[0]
    return match.group(1)


def _depth_of(span: dict, by_id: dict[str, dict]) -> int:
    depth = 0
    while span.get("parent_span_id") in by_id:
        span = by_id[span["parent_span_id"]]
        depth += 1
    return depth


def _assert_tree_shape(trace) -> None:
    """Every span once; a child right under its parent's subtree, one level deeper;
    siblings by start time."""
    rows = trace.rows
    assert sorted(r.span["span_id"] for r in rows) == sorted(s["span_id"] for s in trace.spans)
    index = {r.span["span_id"]: i for i, r in enumerate(rows)}
    by_id = {s["span_id"]: s for s in trace.spans}
    last_child_start: dict = {}
    for i, row in enumerate(rows):
        parent_id = row.span.get("parent_span_id")
        if parent_id in by_id:
            parent = index[parent_id]
            assert parent < i, f"{row.span['name']} drawn before its parent"
            assert row.depth == rows[parent].depth + 1
            # nothing shallower than the child sits between parent and child
            assert all(rows[j].depth > rows[parent].depth for j in range(parent + 1, i))
        else:
            assert row.depth == 0
        assert row.depth == _depth_of(row.span, by_id)
        previous = last_child_start.get(parent_id)
        assert previous is None or previous <= row.span["start_ns"], "siblings out of start order"
        last_child_start[parent_id] = row.span["start_ns"]


def _assert_text_matches_rows(block: list[str], trace) -> None:
    """The rendered waterfall: one line per row, in row order, the name indented by depth."""
    lines = block[2:]
    assert len(lines) == len(trace.rows)
    service_width = max(len(_service(r.span)) for r in trace.rows)
    for line, row in zip(lines, trace.rows):
        assert line[2:].split()[0] == _service(row.span)
        name_field = line[2 + service_width + 2 :]
        indent = len(name_field) - len(name_field.lstrip(" "))
        assert indent == 2 * row.depth, (line, row.depth)
        assert name_field.lstrip(" ").startswith(display_name(row.span))


# ------------------------------------------------------------------------- fixtures


def _tracer(directory: Path, service: str, server_type: str):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": service, "nemo.gym.server.type": server_type})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(directory, service)))
    return provider.get_tracer("tests.view")


# rollout index -> (rollout duration ms, model ms, tool ms, verify ms, tool fails)
HANDBUILT = {0: (100, 30, 10, 5, False), 1: (300, 60, 20, 8, True), 2: (200, 45, 15, 6, False)}


@pytest.fixture
def handbuilt_run(tmp_path) -> dict:
    """Three rollouts, three processes' files, one ERROR span (rollout ``7-1``'s tool call)."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode

    directory = tmp_path / "handbuilt-run"
    agent = _tracer(directory, "nemo-gym/agent", "responses_api_agents")
    model = _tracer(directory, "nemo-gym/model", "responses_api_models")
    resources = _tracer(directory, "nemo-gym/resources", "resources_servers")
    ids: dict = {}

    def span(tracer, name, kind, start_ms, end_ms, parent, **attributes):
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        started = tracer.start_span(
            name, context=context, kind=kind, start_time=BASE_NS + int(start_ms * MS), attributes=attributes
        )
        ids.setdefault(name, []).append(format(started.get_span_context().span_id, "016x"))
        return started

    def end(opened, end_ms):
        opened.end(end_time=BASE_NS + int(end_ms * MS))

    # Written newest rollout first: the order on disk must not be the order shown.
    for index in sorted(HANDBUILT, reverse=True):
        total, model_ms, tool_ms, verify_ms, fails = HANDBUILT[index]
        t0 = index * 1000
        rollout_id = f"7-{index}"
        run = span(
            agent,
            "POST /run",
            SpanKind.SERVER,
            t0,
            t0 + total,
            None,
            **{"http.route": "/run", "nemo.gym.rollout.id": rollout_id},
        )
        seam = span(
            agent, "gym.rollout", SpanKind.INTERNAL, t0 + 1, t0 + total - 1, run, **{"nemo.gym.rollout.id": rollout_id}
        )
        calls = [
            (model, "POST /v1/responses", "/v1/responses", model_ms, False),
            (resources, "POST /get_weather", "/get_weather", tool_ms, fails),
            (resources, "POST /verify", "/verify", verify_ms, False),
        ]
        at = t0 + 2
        for tracer, name, route, duration, error in calls:
            callee = "model" if tracer is model else "resources"
            client = span(
                agent,
                f"POST /ng-rollout/{{rollout_id}}{route}",
                SpanKind.CLIENT,
                at,
                at + duration + 2,
                seam,
                **{
                    "http.request.method": "POST",
                    "url.full": f"http://127.0.0.1:1/ng-rollout/{rollout_id}{route}",
                    # what egress adds for a Gym server of the fleet
                    "nemo.gym.http.destination.server.name": callee,
                    "nemo.gym.http.destination.route": route,
                },
            )
            server = span(
                tracer,
                name,
                SpanKind.SERVER,
                at + 1,
                at + 1 + duration,
                client,
                **{"http.route": route, "note": "<b>not markup</b>"},
            )
            if error:
                server.set_attribute("error.type", "TimeoutError")
                server.set_status(Status(StatusCode.ERROR))
                ids["error"] = format(server.get_span_context().span_id, "016x")
            end(server, at + 1 + duration)
            end(client, at + duration + 2)
            at += duration + 4
        end(seam, t0 + total - 1)
        end(run, t0 + total)
    assert len(list(directory.glob("*.jsonl"))) == 3
    return {"dir": directory, "ids": ids}


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


# ------------------------------------------------------------------------- the page in Chromium

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,1000",
)

# Added to a copy of the page only: measures what the browser laid out.
LAYOUT_PROBE = """<script>
for (const row of document.querySelectorAll('details.span')) {
  const box = (selector) => row.querySelector(selector).getBoundingClientRect();
  const bar = box('.bar'), cell = box('.bar-cell'), line = box('summary');
  row.setAttribute('data-probe', JSON.stringify({
    bar: [bar.left, bar.width], cell: [cell.left, cell.width], height: line.height,
    indent: parseFloat(getComputedStyle(row.querySelector('.name')).paddingLeft),
    colour: getComputedStyle(row.querySelector('.bar')).backgroundColor,
  }));
}
</script>"""


ERROR_RED = "rgb(216, 74, 74)"


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{uuid.uuid4().hex[:8]}"
    profile.mkdir()
    command = [
        require_chromium("the HTML page of `gym-autoinstr view` is checked"),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


class _Element:
    def __init__(self, tag: str, attrs: dict, parent: _Element | None) -> None:
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, tag: str, cls: str | None = None) -> list[_Element]:
        return [e for e in self.walk() if e.tag == tag and (cls is None or cls in e.classes)]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class _DomParser(HTMLParser):
    VOID = {"meta", "br", "img", "link", "input", "hr", "source", "wbr", "area", "base", "col", "embed"}

    def __init__(self) -> None:
        super().__init__()
        self.root = _Element("#document", {}, None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        element = _Element(tag, dict(attrs), self.current)
        self.current.children.append(element)
        if tag not in self.VOID:
            self.current = element

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.text += data


def _dom(markup: str) -> _Element:
    parser = _DomParser()
    parser.feed(markup)
    parser.close()
    return parser.root


def _rendered_dom(tmp_path: Path, page: Path) -> _Element:
    result = _run_chromium(tmp_path, "--dump-dom", page.resolve().as_uri())
    assert "<section" in result.stdout, result.stdout[:2000]
    return _dom(result.stdout)


def _assert_self_contained(page: Path, document: _Element) -> None:
    raw = page.read_text()
    # inline script and style only: nothing fetched
    assert not re.search(r"<script[^>]*\bsrc\s*=", raw) and "<link" not in raw and "@import" not in raw
    assert not re.search(r"\b(fetch|XMLHttpRequest|import)\s*\(", raw)
    assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//", raw)
    for element in document.walk():
        for name in ("src", "href", "srcset", "poster", "data", "action", "background"):
            value = (element.attrs.get(name) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//")), (element.tag, name, value)


def _assert_page_matches_traces(document: _Element, traces) -> None:
    sections = document.find("section", "trace")
    assert len(sections) == len(traces)
    for section, trace in zip(sections, traces):
        assert section.attrs["data-trace-id"] == trace.trace_id
        rows = [c for c in section.children if c.tag == "details"]
        assert len(rows) == len(trace.spans) == len(section.find("details", "span"))
        assert [r.attrs["data-span-id"] for r in rows] == [r.span["span_id"] for r in trace.rows]
        assert [r.attrs["data-kind"] for r in rows] == [r.span["kind"] for r in trace.rows]
        for row, model_row in zip(rows, trace.rows):
            (summary_element,) = [c for c in row.children if c.tag == "summary"]
            assert summary_element.find("span", "label")[0].all_text() == model_row.span["name"]
            callee = summary_element.find("span", "callee")
            expected = callee_text(model_row.span)
            assert [c.all_text() for c in callee] == ([expected] if expected else [])
            assert int(row.attrs["data-depth"]) == model_row.depth
            assert ("error" in row.classes) == (model_row.span["status"] == "ERROR")


def _probe_layout(tmp_path: Path, page: Path, traces) -> None:
    """Bars inside their cell, as long as the span is (or the minimum), deeper rows indented more."""
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    document = _rendered_dom(tmp_path, probe)
    for section, trace in zip(document.find("section", "trace"), traces):
        rows = [c for c in section.children if c.tag == "details"]
        measured = [json.loads(r.attrs["data-probe"]) for r in rows]
        total = trace.end_ns - trace.start_ns
        for m, row in zip(measured, trace.rows):
            (bar_left, bar_width), (cell_left, cell_width) = m["bar"], m["cell"]
            assert m["height"] > 5 and cell_width > 200
            assert (
                bar_width >= 1 and cell_left - 0.5 <= bar_left and bar_left + bar_width <= cell_left + cell_width + 0.5
            )
            share = (row.span["end_ns"] - row.span["start_ns"]) / total
            assert bar_width == pytest.approx(max(share, 0.003) * cell_width, abs=1.5)
            offset = (row.span["start_ns"] - trace.start_ns) / total
            assert bar_left - cell_left == pytest.approx(min(offset * cell_width, cell_width - bar_width), abs=1.5)
        # error bars, and only they, are red
        for m, row in zip(measured, trace.rows):
            assert (m["colour"] == ERROR_RED) == (row.span["status"] == "ERROR"), (row.span["name"], m["colour"])
        by_id = {r.span["span_id"]: m for r, m in zip(trace.rows, measured)}
        for row in trace.rows:
            parent = by_id.get(row.span.get("parent_span_id"))
            if parent is not None:
                assert by_id[row.span["span_id"]]["indent"] > parent["indent"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_html_page_marks_the_error_in_chromium(handbuilt_run, tmp_path):
    page = tmp_path / "errors.html"
    result = _cli("view", str(handbuilt_run["dir"]), "--html", str(page))
    assert result.returncode == 0, result.stderr
    traces = build_traces(read_path(handbuilt_run["dir"]))

    document = _rendered_dom(tmp_path, page)
    _assert_page_matches_traces(document, traces)
    _assert_self_contained(page, document)
    (error_row,) = document.find("details", "error")
    assert error_row.attrs["data-span-id"] == handbuilt_run["ids"]["error"]
    assert error_row.parent.attrs["data-trace-id"] == traces[1].trace_id
    assert [("error" in s.classes) for s in document.find("section", "trace")] == [False, True, False]
    assert "ERROR" in error_row.parent.find("h2")[0].all_text()
    assert "TimeoutError" in error_row.all_text()
    # attribute values are text, never markup
    assert not document.find("b") and "<b>not markup</b>" in document.all_text()
    _probe_layout(tmp_path, page, traces)

    only_errors = tmp_path / "only-errors.html"
    assert _cli("view", str(handbuilt_run["dir"]), "--errors", "--html", str(only_errors)).returncode == 0
    _assert_page_matches_traces(_rendered_dom(tmp_path, only_errors), [traces[1]])

    screenshot = tmp_path / "errors.png"
    _run_chromium(tmp_path, f"--screenshot={screenshot}", page.resolve().as_uri())
    assert _png_size(screenshot) == (1400, 1000)


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


# Added to a copy of the page only: drives the page's own controls like a user, and
# records what the browser then shows (laid out, not just flagged).
INTERACTION_PROBE = """<script>
const out = {};
const shown = (selector) => [...document.querySelectorAll(selector)].filter((e) => e.offsetHeight > 0);
const ids = (elements) => elements.map((e) => e.dataset.traceId);
const set = (id, value, event) => {
  const control = document.getElementById(id);
  if (typeof value === 'boolean') control.checked = value; else control.value = value;
  control.dispatchEvent(new Event(event));
};
out.initial = ids(shown('#index tbody tr'));
set('search', '7-1', 'input');
out.search = {rows: ids(shown('#index tbody tr')), sections: ids(shown('section.trace')),
              count: document.getElementById('shown-count').textContent};
set('search', 'POST 7-2', 'input');
out.searchWords = ids(shown('#index tbody tr'));
set('search', document.querySelectorAll('#index tbody tr')[2].dataset.traceId.slice(0, 7), 'input');
out.searchId = ids(shown('#index tbody tr'));
set('search', '', 'input');
set('status-filter', 'error', 'change');
out.status = ids(shown('#index tbody tr'));
set('status-filter', '', 'change');
set('service-filter', 'model', 'change');
out.service = ids(shown('#index tbody tr'));
set('service-filter', '', 'change');
const rows = [...document.querySelector('section.trace').querySelectorAll(':scope > details.span')];
const visible = () => rows.map((r) => r.offsetHeight > 0);
const fold = (row) => row.querySelector('button.fold').click();
fold(rows[2]);
out.foldInner = visible();
fold(rows[1]);
out.foldOuter = visible();
out.outerOpen = rows[1].open;
fold(rows[1]);
out.unfoldOuter = visible();
out.buttons = rows.map((r) => (r.querySelector('button.fold') || {}).textContent || '');
document.body.setAttribute('data-probe', JSON.stringify(out));
</script>"""


def test_html_page_search_filters_and_folding_in_chromium(handbuilt_run, tmp_path):
    """The index's search and filters, and folding a subtree, driven in Chromium; the time
    axis, resource attributes, callee names and the durations chart on the page."""
    page = tmp_path / "page.html"
    assert _cli("view", str(handbuilt_run["dir"]), "--html", str(page)).returncode == 0
    traces = build_traces(read_path(handbuilt_run["dir"]))
    ids = [t.trace_id for t in traces]
    probe = tmp_path / "interaction.html"
    probe.write_text(page.read_text().replace("</body>", INTERACTION_PROBE + "</body>"))
    document = _rendered_dom(tmp_path, probe)
    (body,) = document.find("body")
    seen = json.loads(body.attrs["data-probe"])
    assert seen["initial"] == ids
    assert seen["search"] == {"rows": [ids[1]], "sections": [ids[1]], "count": "1 of 3 shown"}
    assert seen["searchWords"] == [ids[2]]  # every word, case-insensitive
    assert seen["searchId"] == [ids[2]]  # a prefix of the trace id
    assert seen["status"] == [ids[1]]
    assert seen["service"] == ids
    # rows of the first trace: depths 0 1 2 3 2 3 2 3; folding row 2 hides row 3, folding
    # row 1 hides everything below it, unfolding row 1 leaves row 2's fold as it was
    assert seen["foldInner"] == [True, True, True, False, True, True, True, True]
    assert seen["foldOuter"] == [True, True, False, False, False, False, False, False]
    assert seen["outerOpen"] is False  # the fold button does not open the attributes
    assert seen["unfoldOuter"] == [True, True, True, False, True, True, True, True]
    assert seen["buttons"] == ["−", "−", "+", "", "−", "", "−", ""]

    document = _rendered_dom(tmp_path, page)
    _assert_self_contained(page, document)
    sections = document.find("section", "trace")
    # the time axis: five ticks from 0 to the trace's duration
    ticks = [t.all_text() for t in sections[1].find("span", "tick")]
    assert ticks == ["0.0 ms", "75.0 ms", "150 ms", "225 ms", "300 ms"]
    # resource attributes, one table per service
    (resources,) = sections[1].find("div", "resources")
    assert [h.all_text() for h in resources.find("h4")] == [
        "nemo-gym/agent",
        "nemo-gym/model",
        "nemo-gym/resources",
    ]
    assert "resources_servers" in resources.all_text()
    # CLIENT rows name the Gym server and route they called
    callees = [c.all_text() for c in sections[0].find("span", "callee")]
    assert callees == ["→ model /v1/responses", "→ resources /get_weather", "→ resources /verify"]
    # the index links each drawn trace; the chart counts the traces
    links = [a.attrs["href"] for a in document.find("a")]
    assert links == [f"#t-{i}" for i in ids]
    (chart,) = document.find("figure", "chart")
    assert chart.find("svg") and len(chart.find("rect")) >= 2
    assert "durations of 3 rollout traces" in chart.all_text()
    assert not document.find("p", "note")


def test_html_page_draws_at_most_the_limit_and_says_how_to_see_the_rest(handbuilt_run, tmp_path):
    page = tmp_path / "bounded.html"
    result = _cli("view", str(handbuilt_run["dir"]), "--html", str(page), "--html-max-traces", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote 3 traces to {page} (2 drawn, every one listed)"
    traces = build_traces(read_path(handbuilt_run["dir"]))
    document = _dom(page.read_text())
    # the error trace and the slowest of the rest, in start order; all three listed
    assert [s.attrs["data-trace-id"] for s in document.find("section", "trace")] == [
        traces[1].trace_id,
        traces[2].trace_id,
    ]
    assert len(document.find("table")[0].find("tbody")[0].find("tr")) == 3
    (note,) = document.find("p", "note")
    assert "2 of the 3 traces listed are drawn" in note.all_text() and "--trace" in note.all_text()
    unwritten = _cli("view", str(handbuilt_run["dir"]), "--html", str(tmp_path / "no" / "x.html"))
    why = "No such file or directory; nothing written: give a file you can write"
    assert (unwritten.returncode, unwritten.stderr) == (1, f"gym-autoinstr view: --html {tmp_path}/no/x.html: {why}\n")


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


def test_one_of_a_thing_is_not_plural(tmp_path):
    """A run of one trace of one span: "1 trace", "1 span", "1 service" wherever counted."""
    directory = tmp_path / "one"
    agent = _tracer(directory, "nemo-gym/agent", "responses_api_agents")
    agent.start_span("POST /run", start_time=BASE_NS).end(end_time=BASE_NS + 5 * MS)
    (only,) = build_traces(read_path(directory))
    (block,) = _text_blocks(_cli("view", str(directory), "--trace", only.trace_id[:8]).stdout)
    assert block[0] == f"trace {only.trace_id}  1 span, 1 service"
    page = tmp_path / "one.html"
    result = _cli("view", str(directory), "--html", str(page))
    assert result.stdout.strip() == f"wrote 1 trace to {page}"
    document = _dom(page.read_text())
    assert document.find("p", "count")[0].all_text() == "1 trace listed, 1 drawn"
    assert document.find("p", "summary")[0].all_text().endswith(" · 1 span · 1 service")
    assert document.find("div", "resources")[0].find("summary")[0].all_text() == "resource attributes (1 service)"
