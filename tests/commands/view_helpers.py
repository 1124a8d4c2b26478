"""Helpers of the ``gym-autoinstr view`` tests: the command as a user runs it and its text
output parsed, the checks of a drawn trace, the hand-built run's tracers, and the HTML page
in headless Chromium (a DOM parser, and what the page must show).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gym_autoinstr.commands.view.model import callee as callee_text
from gym_autoinstr.commands.view.model import display_name
from gym_autoinstr.setup.files import OtlpJsonFileExporter
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


# ------------------------------------------------------------------------- the hand-built run (conftest.py)


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
