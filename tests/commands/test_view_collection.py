"""``gym-autoinstr view`` on a collection run of 300 rollouts with the server names of a real
Gym config: the orchestrator's start-up trace (24 s in a real run, 16 s here), the job's own
trace (as long as the whole job) and the rollouts linked to it (100-190 ms each).  What a
user of such a run reads: the filters, the list, the page's chart.  The run is written by
``test_view_scale.write_synthetic_run``."""

from __future__ import annotations

import json
import re

import pytest

from tests.commands.test_view import _cli, _dom, _listed
from tests.commands.test_view_scale import write_synthetic_run

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


def test_the_duration_chart_is_over_the_rollouts_alone(collection_page):
    (chart,) = collection_page["document"].find("figure", "chart")
    labels = [t.all_text() for t in chart.find("text")]
    assert labels == ["100 ms", "189 ms"]  # not the job's 3.2 s, not the start-up's 16 s
    caption = chart.find("figcaption")[0].all_text()
    assert caption.startswith(f"durations of {N_ROLLOUTS} rollout traces (the job's own and start-up traces aside)")
    tallest = int(re.search(r"tallest bar (\d+)", caption)[1])
    assert tallest < N_ROLLOUTS // 4 and len(chart.find("rect")) >= 20
