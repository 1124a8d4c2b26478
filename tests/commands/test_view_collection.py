"""``gym-autoinstr view`` on a collection run of 300 rollouts with the server names of a real
Gym config: the orchestrator's start-up trace (24 s in a real run, 16 s here), the job's own
trace (as long as the whole job) and the rollouts linked to it (100-190 ms each).  What a
user of such a run reads: the filters, the list, the page's index, chart and first
waterfall.  The run is written by ``test_view_scale.write_synthetic_run``."""

from __future__ import annotations

import json
import re

import pytest

from tests.commands.test_view_scale import write_synthetic_run
from tests.commands.view_helpers import _cli, _dom, _listed, _rendered_dom, _run_chromium

N_ROLLOUTS = 300
NAMES = {"agent": "simple_weather_simple_agent", "model": "policy_model", "resources": "simple_weather"}


@pytest.fixture(scope="module")
def collection_run(tmp_path_factory) -> dict:
    return write_synthetic_run(tmp_path_factory.mktemp("collection") / "run", N_ROLLOUTS, names=NAMES)


@pytest.fixture(scope="module")
def collection_page(collection_run, tmp_path_factory) -> dict:
    page = tmp_path_factory.mktemp("collection-page") / "page.html"
    result = _cli("view", str(collection_run["dir"]), "--html", str(page))
    assert result.returncode == 0, result.stderr
    return {"path": page, "stdout": result.stdout, "document": _dom(page.read_text(encoding="utf-8"))}


# ------------------------------------------------------------------------- the filters


def test_service_matches_a_full_name_a_short_name_or_a_part_of_one(collection_run):
    directory = str(collection_run["dir"])
    rollouts = {t[:12] for t in collection_run["rollouts"]}
    # the README's example: `model` is part of one service's short name, policy_model's
    # (whose spans are in every rollout and in the start-up trace)
    for name in ("model", "MODEL", "policy_model", "nemo-gym/policy_model"):
        result = _cli("view", directory, "--service", name)
        assert result.returncode == 0, (name, result.stderr)
        assert {r["id"] for r in _listed(result.stdout)} == rollouts | {collection_run["startup"][:12]}, name
    # a short name that is whole wins over the longer one that contains it
    exact = _cli("view", directory, "--service", "simple_weather")
    assert exact.returncode == 0 and {r["id"] for r in _listed(exact.stdout)} >= rollouts
    # a part of two services' names: refused, naming both
    ambiguous = _cli("view", directory, "--service", "weather")
    assert ambiguous.returncode == 1 and ambiguous.stdout == ""
    assert ambiguous.stderr.strip() == (
        "gym-autoinstr view: --service weather matches 2 services: simple_weather, simple_weather_simple_agent; "
        "give one of them"
    )
    # no service of that name: refused, naming the run's services
    unknown = _cli("view", directory, "--service", "judge")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == (
        "gym-autoinstr view: --service judge matches no service; the run's services: orchestrator, policy_model, "
        "simple_weather, simple_weather_simple_agent"
    )


def test_slowest_ranks_rollout_traces_not_the_start_up_or_the_job(collection_run):
    directory = str(collection_run["dir"])
    result = _cli("view", directory, "--slowest", "2")
    assert result.returncode == 0, result.stderr
    rows = _listed(result.stdout)
    assert len(rows) == 2 and {r["id"] for r in rows} <= {t[:12] for t in collection_run["rollouts"]}
    assert "start-up traces" not in result.stdout
    records = json.loads(_cli("view", directory, "--slowest", "3", "--json").stdout)["traces"]
    assert [r["trace_id"] in collection_run["rollouts"] for r in records] == [True, True, True]
    assert [r["duration_ms"] for r in records] == [189.0, 189.0, 189.0]
    # filters that leave only the start-up trace: nothing to rank, and it says why
    startup_only = _cli("view", directory, "--slowest", "1", "--trace", "5555")
    assert startup_only.returncode == 1 and startup_only.stdout == ""
    assert "--slowest ranks rollout traces" in startup_only.stderr and "--sort duration" in startup_only.stderr


def test_a_trace_prefix_of_no_trace_says_so(collection_run):
    result = _cli("view", str(collection_run["dir"]), "--trace", "zzzz")
    assert result.returncode == 1 and result.stdout == ""
    read = N_ROLLOUTS + 2  # and the job's own trace, and the start-up trace
    assert result.stderr.strip() == f"gym-autoinstr view: no trace id starts with zzzz (of the {read} traces read)"


# ------------------------------------------------------------------------- the page


def test_the_page_opens_on_the_job_and_its_rollouts_start_up_apart(collection_run, collection_page):
    document = collection_page["document"]
    sections = [s.attrs["data-trace-id"] for s in document.find("section", "trace")]
    # the job's heading, then its rollouts (the job's own trace is its gym.job span alone)
    (heading,) = document.find("h2", "job")
    assert "300 linked rollout traces below" in heading.all_text()
    assert sections[0] == collection_run["rollouts"][0]
    # the start-up trace last, under a heading of its own
    assert sections[-1] == collection_run["startup"] and sections.count(collection_run["startup"]) == 1
    (apart,) = document.find("h2", "startup")
    assert apart.all_text() == "Start-up traces (processes starting, not rollouts): 1"
    # the index: the rollouts and the job's own trace first, the start-up trace in its own group below
    (table,) = [t for t in document.find("table") if t.attrs.get("id") == "index"]
    (run_rows, startup_rows) = table.find("tbody")
    assert "startup" in startup_rows.classes
    assert [r.attrs["data-trace-id"] for r in startup_rows.find("tr") if "data-trace-id" in r.attrs] == [
        collection_run["startup"]
    ]
    assert len(run_rows.find("tr")) == N_ROLLOUTS + 1


# Added to a copy of the page only: the start-up box unticked, what the browser shows.
STARTUP_PROBE = """<script>
const shown = (selector) => [...document.querySelectorAll(selector)].filter((e) => e.offsetHeight > 0).length;
const box = document.getElementById('startup-filter');
box.checked = false;
box.dispatchEvent(new Event('change'));
document.body.setAttribute('data-probe', JSON.stringify({
  group: shown('#index tr.group'), heading: shown('h2.startup'), rows: shown('#index tr.startup'),
  sections: shown('section.trace[data-trace-id="55555555555555555555555555555555"]'),
  count: document.getElementById('shown-count').textContent,
}));
</script>"""


def test_unticking_start_up_traces_hides_their_group_and_waterfalls(collection_page, tmp_path):
    probe = tmp_path / "startup-probe.html"
    probe.write_text(collection_page["path"].read_text().replace("</body>", STARTUP_PROBE + "</body>"))
    (body,) = _rendered_dom(tmp_path, probe).find("body")
    seen = json.loads(body.attrs["data-probe"])
    count = f"{N_ROLLOUTS + 1} of {N_ROLLOUTS + 2} shown"
    assert seen == {"group": 0, "heading": 0, "rows": 0, "sections": 0, "count": count}


def test_the_duration_chart_is_over_the_rollouts_alone(collection_page):
    (chart,) = collection_page["document"].find("figure", "chart")
    labels = [t.all_text() for t in chart.find("text")]
    assert labels == ["100 ms", "189 ms"]  # not the job's 3.2 s, not the start-up's 16 s
    caption = chart.find("figcaption")[0].all_text()
    assert caption.startswith(f"durations of {N_ROLLOUTS} rollout traces (the job's own and start-up traces aside)")
    tallest = int(re.search(r"tallest bar (\d+)", caption)[1])
    assert tallest < N_ROLLOUTS // 4 and len(chart.find("rect")) >= 20


# Added to a copy of the page only: where the browser laid out the index's columns, and
# which cells it cut (their text wider than the cell's content box).
INDEX_PROBE = """<script>
const box = document.querySelector('.index-table');
const cut = [];
for (const cell of document.querySelectorAll('#index th, #index td')) {
  const text = document.createRange();
  text.selectNodeContents(cell);
  const style = getComputedStyle(cell);
  const room = cell.getBoundingClientRect().width - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  if (text.getBoundingClientRect().width > room + 0.01) cut.push([cell.className, cell.textContent, cell.title]);
}
const heads = [...document.querySelectorAll('#index thead th')].map((th) => {
  const edges = th.getBoundingClientRect();
  return [th.textContent, edges.left, edges.right];
});
document.body.setAttribute('data-probe', JSON.stringify({
  right: box.getBoundingClientRect().right, client: box.clientWidth, scroll: box.scrollWidth, heads: heads, cut: cut,
}));
</script>"""


def test_the_index_fits_the_window_long_names_cut(collection_page, tmp_path):
    """At 1400 px, the index of a collection run (a start-up trace of every service, long
    server names) fits: no sideways scrolling, every heading, duration and status whole; a
    long root, service list or rollout id is cut with an ellipsis and whole in its tooltip."""
    probe = tmp_path / "index-probe.html"
    probe.write_text(collection_page["path"].read_text().replace("</body>", INDEX_PROBE + "</body>"))
    (body,) = _rendered_dom(tmp_path, probe).find("body")
    seen = json.loads(body.attrs["data-probe"])
    assert seen["scroll"] <= seen["client"], seen
    columns = {name: (left, right) for name, left, right in seen["heads"]}
    for name in ("duration", "status", "spans", "tokens"):
        assert columns[name][1] <= seen["right"] + 0.5, (name, columns[name], seen["right"])
    # what is cut: long names only (the services of every trace here), each whole in its tooltip
    assert seen["cut"]
    assert all(cls in ("root", "services", "rollout") and title == text for cls, text, title in seen["cut"]), [
        cell for cell in seen["cut"] if cell[0] not in ("root", "services", "rollout") or cell[1] != cell[2]
    ]
    screenshot = tmp_path / "index.png"
    _run_chromium(tmp_path, f"--screenshot={screenshot}", collection_page["path"].resolve().as_uri())
    assert screenshot.stat().st_size > 20_000
