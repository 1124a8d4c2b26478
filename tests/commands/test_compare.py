"""``gym-autoinstr compare``: its statistics against published values, the comparison of
synthetic runs whose every number is known, and the command as a user runs it.

The synthetic runs are in the embedded file exporter's format (``test_view_scale``'s
``_Process``): per rollout, the collection driver's CLIENT ``POST /run`` (the root: task and
repeat indexes, reward, mask, job id, the rollout's tokens) and the SERVER spans of the
model, a tool and ``/verify`` (the seams), each from its own process."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from gym_autoinstr.commands.compare import comparison, stats
from gym_autoinstr.commands.runs import store
from tests.commands.test_view_scale import _Process
from tests.commands.view_helpers import _cli, _dom

# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        # two-sided 95% (p = 0.975) and 99% (p = 0.995) critical values, as every t table prints them
        (0.975, 1, 12.7062),
        (0.975, 2, 4.3027),
        (0.975, 5, 2.5706),
        (0.975, 10, 2.2281),
        (0.975, 29, 2.0452),
        (0.975, 100, 1.9840),
        (0.975, 1000, 1.9623),
        (0.975, 10**6, 1.9600),
        (0.995, 10, 3.1693),
        (0.995, 30, 2.7500),
        (0.95, 4, 2.1318),
        (0.025, 10, -2.2281),
    ],
)
def test_t_quantiles_match_the_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=6e-5)


def test_t_quantile_is_continuous_across_its_two_methods_and_inverts_the_cdf():
    # below 1000 df the incomplete beta, from 1000 Cornish-Fisher: no step between them
    assert stats.t_quantile(0.975, 999.99) == pytest.approx(stats.t_quantile(0.975, 1000), abs=1e-7)  # true step 2e-8
    for df in (1, 2.5, 7, 40.3, 600):
        for p in (0.6, 0.9, 0.975, 0.999):
            assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)


@pytest.mark.parametrize(
    ("x", "n", "low", "high"),
    # Newcombe 1998 ("Two-sided confidence intervals for the single proportion"), Table I, method 3
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_intervals_match_newcombes_examples(x, n, low, high):
    found = stats.wilson(x, n)
    assert found == pytest.approx((low, high), abs=6e-5)


@pytest.mark.parametrize(
    ("a", "b", "low", "high"),
    # Newcombe 1998 ("Interval estimation for the difference between independent proportions"),
    # Table II, method 10: (a) 56/70 - 48/80, (b) 9/10 - 3/10, (d) 5/56 - 0/29, (e) 0/10 - 0/20,
    # (f) 0/10 - 0/10, (g) 10/10 - 0/20, (h) 10/10 - 0/10 (here B - A: the first is B)
    [
        ((48, 80), (56, 70), 0.0524, 0.3339),
        ((3, 10), (9, 10), 0.1705, 0.8090),
        ((0, 29), (5, 56), -0.0381, 0.1926),
        ((0, 20), (0, 10), -0.1611, 0.2775),
        ((0, 10), (0, 10), -0.2775, 0.2775),
        ((0, 20), (10, 10), 0.6791, 1.0),
        ((0, 10), (10, 10), 0.6075, 1.0),
    ],
)
def test_newcombe_intervals_match_newcombes_examples(a, b, low, high):
    assert stats.newcombe(*a, *b) == pytest.approx((low, high), abs=6e-5)


def test_welch_interval_matches_scipy():
    # SciPy 1.18: ttest_ind(b, a, equal_var=False).confidence_interval()
    a, b = [0.2, 0.5, 0.4, 0.9, 0.3], [0.6, 0.8, 0.7, 1.0, 0.9, 0.75]
    assert stats.welch(a, b) == pytest.approx((0.0009981, 0.6623352), abs=1e-7)
    assert stats.welch([1.0, 1.0, 1.0], [0.5, 0.5]) == (-0.5, -0.5)  # neither varies: the change itself
    assert stats.welch([1.0], [0.5, 0.7]) is None


def test_clustered_interval_is_the_t_interval_of_the_per_task_changes():
    changes = [0.1, 0.2, 0.3, 0.4]
    sd = math.sqrt(sum((c - 0.25) ** 2 for c in changes) / 3)
    half = 3.182446305 * sd / 2  # t(0.975, 3)
    assert stats.clustered(changes) == pytest.approx((0.25 - half, 0.25 + half), abs=1e-9)
    assert stats.clustered([0.3]) is None


def test_mann_whitney_p_values_match_scipy():
    # SciPy 1.18: mannwhitneyu(a, b, method="asymptotic").pvalue (tie and continuity corrected)
    assert stats.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0121858, abs=1e-7)
    assert stats.mann_whitney_p([1, 1, 2], [1, 2, 2, 2]) == pytest.approx(0.4142162, abs=1e-7)
    assert stats.mann_whitney_p([1, 1, 1], [1, 1]) == 1.0
    assert stats.mann_whitney_p([], [1.0]) is None


# ----------------------------------------------------------------------------- synthetic runs

_IDS = itertools.count(1)  # span and trace ids, unique across every run written here


def write_run(directory: Path, rollouts: list[dict]) -> Path:
    """A run directory with these rollouts: each a dict of ``task``, ``repeat``, ``reward``,
    ``masked``, ``job``, ``start`` (ms), ``model``, ``tools``, ``verify`` (ms in each),
    ``tokens`` ((in, out)), ``error``; a ``gym.job`` trace per job."""
    directory.mkdir(parents=True)
    procs = {role: _Process(directory, role, 100 + i) for i, role in enumerate(("orchestrator", "model", "resources"))}

    def sid() -> str:
        return format(next(_IDS), "016x")

    jobs: dict[str, tuple[float, float]] = {}
    for number, rollout in enumerate(rollouts):
        trace = format(next(_IDS) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128), "032x")
        start = rollout.get("start", number * 10.0)
        model, tools, verify = rollout.get("model", 30.0), rollout.get("tools", 5.0), rollout.get("verify", 10.0)
        end = start + model + tools + verify + 4
        attributes = {"http.request.method": "POST", "nemo.gym.http.destination.route": "/run"}
        for key, name in (
            ("task", "nemo.gym.task.index"),
            ("repeat", "nemo.gym.rollout.index"),
            ("reward", "nemo.gym.reward"),
            ("masked", "nemo.gym.mask_sample"),
            ("job", "nemo.gym.job.id"),
        ):
            if rollout.get(key) is not None:
                attributes[name] = rollout[key]
        if rollout.get("tokens"):
            attributes["nemo.gym.rollout.usage.input_tokens"] = rollout["tokens"][0]
            attributes["nemo.gym.rollout.usage.output_tokens"] = rollout["tokens"][1]
            attributes["gen_ai.operation.name"] = "invoke_agent"
        root = sid()
        procs["orchestrator"].span(
            trace, root, None, "POST /run", 3, start, end, attributes, rollout.get("error", False)
        )
        at = start + 1
        for role, route, took in (("model", "/v1/responses", model), ("resources", "/get_weather", tools)):
            procs[role].span(trace, sid(), root, f"POST {route}", 2, at, at + took, {"http.route": route})
            at += took + 1
        procs["resources"].span(trace, sid(), root, "POST /verify", 2, at, at + verify, {"http.route": "/verify"})
        if rollout.get("job"):
            first, last = jobs.get(rollout["job"], (start, end))
            jobs[rollout["job"]] = (min(first, start), max(last, end))
    for job, (first, last) in jobs.items():
        procs["orchestrator"].span(sid() * 2, sid(), None, "gym.job", 1, first - 1, last + 1, {"nemo.gym.job.id": job})
    for process in procs.values():
        process.close()
    return directory


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _binary_side(job: str, better: bool, slower_verify: float = 0.0, start: float = 0.0) -> list[dict]:
    """Tasks 0-9 with 8 repeats: task t passes (8 - t) times of 8; with ``better``, every repeat
    of tasks 0-4; verify takes 10-13 ms (and ``slower_verify`` more); task 10 on A alone, 11 on
    B alone; a rollout without a task index and a masked one of task 0."""
    rollouts = []
    for task in range(10):
        for repeat in range(8):
            passes = 8 - task if not (better and task < 5) else 8
            rollouts.append(
                {
                    "task": task,
                    "repeat": repeat,
                    "reward": 1.0 if repeat < passes else 0.0,
                    "job": job,
                    "start": start + len(rollouts) * 5.0,
                    "verify": 10.0 + slower_verify + (repeat % 4),
                    "tokens": (100 + task, 20 + repeat),
                }
            )
    only = 11 if better else 10
    rollouts += [{"task": only, "repeat": r, "reward": 1.0, "job": job, "start": start + 500 + r} for r in range(3)]
    rollouts.append({"reward": 0.0, "job": job, "start": start + 600})  # no task index
    rollouts.append({"task": 0, "repeat": 9, "reward": 0.0, "masked": True, "job": job, "start": start + 700})
    return rollouts


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, Path]:
    before = write_run(tmp_path / "before", _binary_side("job-before-1", better=False))
    after = write_run(tmp_path / "after", _binary_side("job-after-2", better=True, slower_verify=20.0))
    return before, after


def test_two_pass_rate_runs_compare_task_by_task(two_runs):
    a = store.load([str(two_runs[0])]).rollouts
    b = store.load([str(two_runs[1])]).rollouts
    record = comparison.compare(a, b)
    assert record["reward_kind"] == "pass rate"
    rows = {row["task_index"]: row for row in record["tasks"]}
    assert sorted(rows) == list(range(10))
    for task, row in rows.items():
        passes_a = max(0, 8 - task)
        passes_b = 8 if task < 5 else passes_a
        assert row["a"]["rollouts"] == 9 if task == 0 else 8  # task 0: the masked sample too
        assert row["a"]["rewarded"] == 8 and row["a"]["masked"] == (1 if task == 0 else 0)
        assert row["a"]["mean_reward"] == passes_a / 8 and row["b"]["mean_reward"] == passes_b / 8
        reward = row["changes"]["reward"]
        assert reward["method"] == "newcombe"
        assert reward["change"] == pytest.approx((passes_b - passes_a) / 8)
        assert reward["interval"] == pytest.approx(list(stats.newcombe(passes_a, 8, passes_b, 8)))
        # 8/8 against 4/8 excludes 0; against 7/8, 6/8, 5/8 it does not; the rest: no change
        assert reward["mark"] == ("better" if task == 4 else None), task
        assert row["a"]["tokens"]["input_mean"] == 100 + task and row["b"]["tokens"]["output_mean"] == 23.5
    assert [o["task_index"] for o in record["only_a"]] == [10] and [o["task_index"] for o in record["only_b"]] == [11]
    assert record["without_task"] == {"a": 1, "b": 1}
    overall = record["overall"]
    # overall: every rollout (the one-sided tasks' and the one without a task index too)
    assert overall["a"]["rollouts"] == 80 + 3 + 1 + 1
    assert overall["a"]["mean_reward"] == pytest.approx((sum(max(0, 8 - t) for t in range(10)) + 3) / 84)
    paired = overall["changes"]["reward"]["paired"]
    changes = [t / 8 if t < 5 else 0.0 for t in range(10)]
    assert paired["tasks"] == 10 and paired["change"] == pytest.approx(sum(changes) / 10)
    assert paired["interval"] == pytest.approx(list(stats.clustered(changes)))
    assert paired["mark"] is None  # 5 tasks up, 5 unchanged: t(0.975, 9) with this spread holds 0
    verify = overall["changes"]["times_ms"]["verify"]
    assert verify["p50_change"] == pytest.approx(20.0, abs=0.01) and verify["mark"] == "slower"
    assert verify["p_value"] < 1e-10
    assert overall["changes"]["times_ms"]["model"]["mark"] is None
    assert "slower verify" in overall["marks"]


def test_any_rewards_take_welchs_interval(tmp_path):
    def side(shift: float) -> list[dict]:
        return [
            {"task": t, "repeat": r, "reward": 0.1 * r + shift * (t == 0), "start": 10.0 * (8 * t + r)}
            for t in range(3)
            for r in range(5)
        ]

    a = store.load([str(write_run(tmp_path / "a", side(0.0)))]).rollouts
    b = store.load([str(write_run(tmp_path / "b", side(0.5)))]).rollouts
    record = comparison.compare(a, b)
    assert record["reward_kind"] == "any"
    first, second = record["tasks"][0], record["tasks"][1]
    rewards = [0.1 * r for r in range(5)]
    assert first["changes"]["reward"]["method"] == "welch"
    assert first["changes"]["reward"]["interval"] == pytest.approx(
        list(stats.welch(rewards, [x + 0.5 for x in rewards]))
    )
    assert first["changes"]["reward"]["mark"] == "better"
    assert second["changes"]["reward"]["change"] == pytest.approx(0.0) and second["changes"]["reward"]["mark"] is None


# ----------------------------------------------------------------------------- the command


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_the_text_fits_the_terminal_and_marks_what_changed(two_runs, tmp_path):
    result = _cli("compare", str(two_runs[0]), str(two_runs[1]), columns=100, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines)
    wide = _cli("compare", str(two_runs[0]), str(two_runs[1]), columns=400, env=_env(tmp_path)).stdout
    assert wide.splitlines()[0] == f"A: {two_runs[0]}: 85 rollouts, 11 tasks"  # (cut to 100 above: a long path)
    verify = next(line for line in lines if line.startswith("verify p50"))
    # A: 25 rollouts of 10 ms, 20 each of 11, 12, 13: the 43rd of 85 is 11; B: 5 of 10 ms, then 30-33
    assert verify.split()[2:6] == ["11.0", "ms", "31.0", "ms"] and "+20.0 ms (+182%)" in verify
    assert verify.endswith("slower")
    table = lines.index(next(line for line in lines if line.lstrip().startswith("task  rollouts")))
    task_lines = lines[table + 1 : table + 11]
    assert [line.split()[0] for line in task_lines] == [str(t) for t in range(10)]
    for task, line in enumerate(task_lines):
        assert ("better" in line) == (task == 4), line
    assert any(line.startswith("only in A: 1 task (3 rollouts): 10") for line in lines)
    assert any(line.startswith("only in B: 1 task (3 rollouts): 11") for line in lines)


def test_json_groups_and_the_page(two_runs, tmp_path):
    result = _cli("compare", str(two_runs[0]), "--vs", str(two_runs[1]), "--json", columns=None, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sides"]["a"] == {"paths": [str(two_runs[0])], "job_id": None}
    assert len(record["tasks"]) == 10 and record["overall"]["b"]["rollouts"] == 85

    # groups: both runs against the second alone
    grouped = _cli("compare", *map(str, two_runs), "--vs", str(two_runs[1]), "--json", env=_env(tmp_path))
    record = json.loads(grouped.stdout)
    assert record["overall"]["a"]["rollouts"] == 170 and record["overall"]["b"]["rollouts"] == 85

    page = tmp_path / "compare.html"
    result = _cli("compare", *map(str, two_runs), "--html", str(page), env=_env(tmp_path))
    assert result.returncode == 0 and result.stdout.strip() == f"wrote the comparison to {page}"
    document = _dom(page.read_text())
    bars = [e for e in document.walk() if e.tag == "rect" and "bar" in (e.attrs.get("class") or "").split()]
    assert [int(e.attrs["data-task"]) for e in bars] == list(range(10))
    assert [e.attrs["class"] for e in bars] == ["bar same"] * 4 + ["bar better"] + ["bar same"] * 5
    figures = [e.attrs.get("data-time") for e in document.find("figure", "times")]
    assert figures == ["duration", "model", "tools", "verify"]
    raw = page.read_text()
    assert "<script" not in raw and "http" not in raw.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_two_jobs_of_one_run_by_id_prefix(tmp_path):
    run = write_run(
        tmp_path / "run",
        _binary_side("3f2a9c-before", better=False) + _binary_side("3f77d1-after", better=True, start=10_000),
    )
    result = _cli("compare", str(run), "--jobs", "3f2a", "3f7", "--json", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sides"]["a"]["job_id"] == "3f2a9c-before" and record["sides"]["b"]["job_id"] == "3f77d1-after"
    assert [row["task_index"] for row in record["tasks"] if row["changes"]["reward"]["mark"]] == [4]

    ambiguous = _cli("compare", str(run), "--jobs", "3f", "3f7", env=_env(tmp_path))
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    assert "job '3f' matches 2 jobs" in ambiguous.stderr
    assert "3f2a9c-before (85 rollouts)" in ambiguous.stderr and "3f77d1-after (85 rollouts)" in ambiguous.stderr
    unknown = _cli("compare", str(run), "--jobs", "zz", "3f7", env=_env(tmp_path))
    assert unknown.returncode == 2 and "no job 'zz' in" in unknown.stderr and "its jobs: " in unknown.stderr


def test_bad_sides_are_refused_saying_what_to_give(two_runs, tmp_path):
    one = _cli("compare", str(two_runs[0]), env=_env(tmp_path))
    assert one.returncode == 2 and "gym-autoinstr compare: 1 paths given and no --vs" in one.stderr
    assert "A... --vs B..." in one.stderr
    missing = _cli("compare", str(two_runs[0]), str(tmp_path / "nope"), env=_env(tmp_path))
    assert missing.returncode == 2 and f"{tmp_path / 'nope'}: no such file or directory" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = _cli("compare", str(two_runs[0]), str(empty), env=_env(tmp_path))
    said = f"gym-autoinstr compare: side B ({empty}): no traces found: no span files (*.jsonl, *.jsonl.gz) in {empty}. "
    assert nothing.returncode == 1 and nothing.stderr.startswith(said + "Is it a run directory")
    startup_only = tmp_path / "startup-only"
    startup_only.mkdir()
    process = _Process(startup_only, "orchestrator", 300)
    process.span("ab" * 16, "cd" * 8, None, "gym.startup", 1, 0.0, 5.0, {}, False)
    process.close()
    no_rollout = _cli("compare", str(two_runs[0]), str(startup_only), env=_env(tmp_path))
    assert no_rollout.returncode == 1 and f"side B ({startup_only}): 1 traces read, none a rollout" in no_rollout.stderr
    unwritable = [(tmp_path / "no" / "c.html", 2, f"no directory {tmp_path / 'no'} to write it in; create it")]
    for html, code, why in unwritable + [(empty, 1, "Is a directory; nothing written: give a file you can write")]:
        unwritten = _cli("compare", *map(str, two_runs), "--html", str(html), env=_env(tmp_path))
        assert (unwritten.returncode, unwritten.stderr) == (code, f"gym-autoinstr compare: --html {html}: {why}\n")
