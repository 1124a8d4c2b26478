"""``gym-autoinstr view --html`` on the outcome run (``outcome_run.py``): the page's reward and
tokens columns, its reward chart (a dot per rollout, a row per task), and its filters, sorting
and live updates driven in headless Chromium.
"""

from __future__ import annotations

import json

from tests.commands.outcome_run import TASKS, _reward_shown
from tests.commands.view_helpers import _assert_self_contained, _dom, _rendered_dom

# ------------------------------------------------------------------------- the page


def test_the_page_has_the_columns_and_a_dot_per_rollout(run, view, tmp_path):
    page = tmp_path / "outcome.html"
    code, out, err = view("--html", str(page))
    assert code == 0, err
    document = _dom(page.read_text(encoding="utf-8"))
    _assert_self_contained(page, document)
    (table,) = [t for t in document.find("table") if t.attrs.get("id") == "index"]
    heads = [th.all_text() for th in table.find("th") if th.parent.parent.tag == "thead"]
    assert heads[heads.index("status") + 1 : heads.index("status") + 3] == ["reward", "tokens"]
    rows = {tr.attrs["data-trace-id"]: tr for tr in table.find("tr") if "data-trace-id" in tr.attrs}
    for rollout in run["rollouts"]:
        row = rows[rollout["trace_id"]]
        (reward,) = row.find("td", "reward")
        (tokens,) = row.find("td", "tokens")
        assert reward.all_text() == _reward_shown(rollout) and ("masked" in reward.classes) == bool(rollout["masked"])
        assert tokens.all_text() == "{}/{}".format(*rollout["tokens"])
        # what the page's sort and where box read
        assert row.attrs.get("data-reward") == (None if rollout["reward"] is None else repr(rollout["reward"]))
        assert row.attrs["data-tokens"] == str(sum(rollout["tokens"]))
        assert row.attrs.get("data-task") == (None if rollout["task"] is None else str(rollout["task"]))
    # the chart: a dot per rollout trace (not the job's own, not the start-up), failures red
    (scatter,) = document.find("figure", "scatter")
    dots = scatter.find("circle")
    assert sorted(d.attrs["data-trace-id"] for d in dots) == sorted(r["trace_id"] for r in run["rollouts"])
    failed = {r["trace_id"] for r in run["rollouts"] if r["failed"]}
    assert {d.attrs["data-trace-id"] for d in dots if "error" in d.classes} == failed
    masked = {r["trace_id"] for r in run["rollouts"] if r["masked"]}
    assert {d.attrs["data-trace-id"] for d in dots if "masked" in d.classes} == masked
    # reward up: a 1.0 dot above a 0.0 dot; no reward: below the plot
    y = {d.attrs["data-trace-id"]: float(d.attrs["cy"]) for d in dots}
    top = {r["trace_id"] for r in run["rollouts"] if r["reward"] == 1.0}
    bottom = {r["trace_id"] for r in run["rollouts"] if r["reward"] == 0.0}
    none = {r["trace_id"] for r in run["rollouts"] if r["reward"] is None}
    assert max(y[t] for t in top) < min(y[t] for t in bottom) < min(y[t] for t in none)
    caption = scatter.find("figcaption")[0].all_text()
    assert f"of {len(run['rollouts'])} rollout traces: {len(failed)} failed (red), {len(masked)} masked" in caption
    # beside the duration histogram
    (charts,) = document.find("div", "charts")
    assert [c.attrs["class"] for c in charts.children] == ["chart", "scatter"]
    # the per-task table, folded under the controls: a row per task, the same numbers as --by-task
    (tasks,) = document.find("table", "tasks")
    task_rows = [tr for tr in tasks.find("tr") if "data-task" in tr.attrs]
    assert [tr.attrs["data-task"] for tr in task_rows] == [str(t) for t in range(TASKS)]
    code, out, _err = view("--by-task")
    listed = {words[0]: words for words in map(str.split, out.splitlines()) if words[:2] and words[1].isdigit()}
    for tr in task_rows:
        cells = [td.all_text() for td in tr.find("td")]
        assert " ".join(c for c in cells if c).split() == listed[tr.attrs["data-task"]]


# Added to a copy of the page only: the where box, the reward heading clicked twice and a
# task's row clicked, as a user would, and what the browser then shows.
PAGE_PROBE = """<script>
const rows = () => [...document.querySelectorAll('#index tbody tr[data-trace-id]')];
const visible = () => rows().filter((r) => r.offsetHeight > 0);
const circles = () => [...document.querySelectorAll('figure.scatter circle')];
const dots = () => circles().filter((d) => getComputedStyle(d).display !== 'none');
const box = document.getElementById('where');
const type = (text) => { box.value = text; box.dispatchEvent(new Event('input')); };
const seen = {};
type('reward<0.5 duration>250');
seen.where = visible().map((r) => r.dataset.traceId);
seen.dots = dots().map((d) => d.dataset.traceId);
seen.count = document.getElementById('shown-count').textContent;
type('reward<0.5 bogus>1');
seen.invalid = box.classList.contains('invalid');
seen.invalidRows = visible().length;
type('');
const heading = [...document.querySelectorAll('#index thead th')].find((th) => th.textContent === 'reward');
heading.click();
seen.ascending = visible().map((r) => r.dataset.traceId);
heading.click();
seen.descending = visible().map((r) => r.dataset.traceId);
[...document.querySelectorAll('#index thead th')].find((th) => th.textContent === 'tokens').click();
seen.tokens = visible().map((r) => r.dataset.traceId);
document.querySelector('details.tasks').open = true;
document.querySelector('table.tasks tr[data-task="7"]').click();
seen.task = visible().map((r) => r.dataset.traceId);
seen.taskBox = box.value;
document.body.setAttribute('data-probe', JSON.stringify(seen));
</script>"""


def test_the_page_filters_sorts_and_follows_in_chromium(run, view, tmp_path):
    page = tmp_path / "outcome.html"
    assert view("--html", str(page))[0] == 0
    probe = tmp_path / "outcome-probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PAGE_PROBE + "</body>"))
    (body,) = _rendered_dom(tmp_path, probe).find("body")
    seen = json.loads(body.attrs["data-probe"])
    rollouts = run["rollouts"]
    low_and_slow = [
        r["trace_id"] for r in rollouts if r["reward"] is not None and r["reward"] < 0.5 and r["duration_ms"] > 250
    ]
    assert seen["where"] == low_and_slow and low_and_slow
    assert sorted(seen["dots"]) == sorted(low_and_slow)
    assert seen["count"] == f"{len(low_and_slow)} of {len(rollouts) + 2} shown"
    # a box it cannot read: marked, and filtering on nothing
    assert seen["invalid"] is True and seen["invalidRows"] == len(rollouts) + 2
    # reward: lowest first, then highest first, those without one last (start order among equals)
    rewarded = [r for r in rollouts if r["reward"] is not None]
    ascending = [r["trace_id"] for r in sorted(rewarded, key=lambda r: r["reward"])]
    descending = [r["trace_id"] for r in sorted(rewarded, key=lambda r: -r["reward"])]
    assert seen["ascending"][: len(ascending)] == ascending
    assert seen["descending"][: len(descending)] == descending
    assert len(seen["ascending"]) == len(rollouts) + 2
    assert run["job"] in seen["ascending"][len(ascending) :] and run["startup"] in seen["ascending"][len(ascending) :]
    # tokens: most first, equal counts in the order shown before (by reward, highest first)
    tokens = {r["trace_id"]: sum(r["tokens"]) for r in rollouts}
    by_tokens = sorted((t for t in seen["descending"] if t in tokens), key=lambda t: -tokens[t])
    assert seen["tokens"][: len(by_tokens)] == by_tokens
    # a task's row in the per-task table: that task's rollouts alone
    assert seen["taskBox"] == "task==7"
    assert sorted(seen["task"]) == sorted(r["trace_id"] for r in rollouts if r["task"] == 7)
