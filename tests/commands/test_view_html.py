"""``gym-autoinstr view --html``: the page of the hand-built run (``handbuilt_run``, in
``conftest.py``) in real headless Chromium: its DOM, layout, controls and a screenshot, and
counts of one in the text and on the page.  Without Chromium these tests fail when
``CI=true`` and skip otherwise.
"""

from __future__ import annotations

import json

from gym_autoinstr.commands.view.model import build_traces
from gym_autoinstr.setup.files import read_path
from tests.commands.view_helpers import (
    BASE_NS,
    MS,
    _assert_page_matches_traces,
    _assert_self_contained,
    _cli,
    _dom,
    _png_size,
    _probe_layout,
    _rendered_dom,
    _run_chromium,
    _text_blocks,
    _tracer,
)


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
