"""``gym-autoinstr view`` answers outcome questions on a collection run of 300 rollouts
(60 tasks x 5 repeats) and 4 rollouts sent to the agent directly (``outcome_run.py``): the
reward and tokens columns, ``--sort reward|tokens|task``, ``--where`` and ``--by-task`` (the
page's columns and reward chart: ``test_view_outcome_page.py``).

Every expected value is computed here from what was written, not read back through the
view's own code.  The view runs in-process (``cli.main``, the ``view`` fixture of
``conftest.py``), so the many ``--where`` cases cost no interpreter start each.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from gym_autoinstr.commands.view.model import build_traces
from gym_autoinstr.setup.files import read_path
from tests.commands.outcome_run import DIRECT, REPEATS, STAGES, TASKS, _reward_shown


def _records(view, *args: str) -> list[dict]:
    code, out, err = view("--json", *args)
    assert code == 0, err
    return json.loads(out)["traces"]


def _by_id(run) -> dict[str, dict]:
    return {r["trace_id"]: r for r in run["rollouts"]}


# ------------------------------------------------------------------------- the data itself


def test_the_run_has_every_shape_and_outcome(run):
    """The synthetic run holds what the tests below need, so none of them passes vacuously."""
    rollouts = run["rollouts"]
    shapes = {r["shape"] for r in rollouts}
    assert shapes == {"new", "interim", "calls", "old", "fallback", "outer"}
    rewards = [r["reward"] for r in rollouts]
    assert 0.0 in rewards and 1.0 in rewards and None in rewards
    assert 3 <= sum(bool(r["masked"]) for r in rollouts) <= 12
    failed = [r for r in rollouts if r["failed"]]
    assert len(failed) >= 8 and {r["stage"] for r in failed} == set(STAGES)
    # tokens on a model call's CLIENT span and seam and a total on the invoke_agent spans
    # (interim, calls): a sum of every span's gen_ai.usage.* would count a call two or
    # three times; today's shape and the oldest have each call's once
    traces = {t.trace_id: t for t in build_traces(read_path(run["dir"]))}
    for rollout in rollouts:
        spans = traces[rollout["trace_id"]].spans
        naive = sum(s["attributes"].get("gen_ai.usage.input_tokens", 0) for s in spans)
        assert (naive > rollout["tokens"][0]) == (rollout["shape"] in ("interim", "calls")), rollout
    # today's shape: the calls' gen_ai.usage.* alone add up to the total (on the root as our own name)
    new = next(r for r in rollouts if r["shape"] == "new" and r["task"] is not None)
    root = traces[new["trace_id"]].root["attributes"]
    assert "gen_ai.usage.input_tokens" not in root and root["nemo.gym.rollout.usage.input_tokens"] == new["tokens"][0]


# ------------------------------------------------------------------------- the columns


def _column(line: str, header: str, name: str) -> str:
    """The value of a right-aligned column of the list: the word ending where its heading ends."""
    end = header.index(name) + len(name)
    return line[:end].rsplit(" ", 1)[-1]


def test_the_list_has_reward_and_tokens_columns(run, view):
    code, out, err = view()
    assert code == 0, err
    lines = out.splitlines()
    header = lines[0]
    assert header.split()[:12] == "start (UTC) trace duration spans status rollout reward tokens root services".split()
    by_prefix = {r["trace_id"][:12]: r for r in run["rollouts"]}
    shown = {}
    for line in lines[1:]:
        prefix = line[14:26]
        if prefix in by_prefix:
            shown[prefix] = (_column(line, header, "reward"), _column(line, header, "tokens"))
    assert len(shown) == len(run["rollouts"])
    for prefix, rollout in by_prefix.items():
        assert shown[prefix] == (_reward_shown(rollout), "{}/{}".format(*rollout["tokens"])), rollout
    # known traces, spelled out: a masked sample, a 1.0, a failure before verify, an older shape
    assert shown[run["rollouts"][5]["trace_id"][:12]][0] == "0.0*"
    assert shown[run["rollouts"][0]["trace_id"][:12]] == ("1.0", "100/20")
    assert shown[run["rollouts"][13]["trace_id"][:12]][0] == ""  # failed at admission: no reward
    assert run["rollouts"][4]["shape"] == "old" and shown[run["rollouts"][4]["trace_id"][:12]] == ("1.0", "218/41")
    # the footnote for the masked mark, and where the per-task summary is
    assert "* masked sample (nemo.gym.mask_sample): its reward is not a valid measurement" in lines
    assert "per task (rollouts, mean reward, p50/p95 duration, failures): --by-task" in lines


def test_json_records_carry_the_outcome(run, view):
    records = {r["trace_id"]: r for r in _records(view)}
    assert len(records) == len(run["rollouts"]) + 2  # and the job's own trace, the start-up trace
    for rollout in run["rollouts"]:
        record = records[rollout["trace_id"]]
        assert record["reward"] == rollout["reward"], rollout
        assert record["mask_sample"] == rollout["masked"], rollout
        assert (record["task_index"], record["rollout_index"]) == (rollout["task"], rollout["repeat"])
        tokens_in, tokens_out = rollout["tokens"]
        assert record["tokens"] == {"input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out}
        assert record["status"] == ("error" if rollout["failed"] else "ok")
        expected_failure = {"error_type": "RuntimeError", "stage": rollout["stage"]} if rollout["failed"] else None
        assert record["failure"] == expected_failure
    job = records[run["job"]]
    assert job["reward"] is None and job["tokens"] is None and job["task_index"] is None


def test_tokens_count_each_model_call_once(run):
    """The rollout's own total when it has one (the root's over ``gym.rollout``'s), else one
    count per call (its CLIENT span, not the seam under it too), else the seams."""
    traces = {t.trace_id: t for t in build_traces(read_path(run["dir"]))}
    seen = set()
    for rollout in run["rollouts"]:
        trace = traces[rollout["trace_id"]]
        assert trace.tokens == rollout["tokens"], rollout
        seen.add(rollout["shape"])
    assert seen == {"new", "interim", "calls", "old", "fallback", "outer"}
    outer = next(r for r in run["rollouts"] if r["shape"] == "outer")
    calls = 1 + run["rollouts"].index(outer) % 3
    assert outer["tokens"][0] == sum(100 + 10 * k + run["rollouts"].index(outer) % 7 for k in range(calls)) + 11


# ------------------------------------------------------------------------- --sort


def _reward_key(record: dict):
    return record["reward"]


def test_sort_reward_worst_first_and_reversed(run, view):
    records = _records(view, "--sort", "reward")
    rewards = [r["reward"] for r in records]
    present = [r for r in rewards if r is not None]
    assert present == sorted(present) and present[0] == 0.0 and present[-1] == 1.0
    assert rewards[: len(present)] == present and all(r is None for r in rewards[len(present) :])
    # ties stay in start order
    zeros = [r["start_ns"] for r in records if r["reward"] == 0.0]
    assert zeros == sorted(zeros) and len(zeros) > 10
    reversed_ = [r["reward"] for r in _records(view, "--sort", "reward", "--reverse")]
    assert reversed_[: len(present)] == sorted(present, reverse=True)
    assert all(r is None for r in reversed_[len(present) :])
    # the text list in the same order, flat (no job line)
    code, out, _err = view("--sort", "reward")
    assert code == 0 and not any(line.startswith("job ") for line in out.splitlines())
    order = [line[14:26] for line in out.splitlines()[1:] if re.match(r"\d\d:\d\d:\d\d\.\d{3}  ", line)]
    assert order[: len(present)] == [r["trace_id"][:12] for r in records[: len(present)]]


def test_sort_tokens_duration_and_task(run, view):
    tokens = [r["tokens"]["total"] if r["tokens"] else None for r in _records(view, "--sort", "tokens")]
    present = [t for t in tokens if t is not None]
    assert present == sorted(present, reverse=True) and tokens[len(present) :] == [None, None]
    durations = [r["duration_ms"] for r in _records(view, "--sort", "duration")]
    assert durations == sorted(durations, reverse=True)
    assert [r["duration_ms"] for r in _records(view, "--sort", "duration", "--reverse")] == sorted(durations)
    keys = [(r["task_index"], r["rollout_index"]) for r in _records(view, "--sort", "task")]
    collected = [k for k in keys if k[0] is not None]
    assert collected == [divmod(i, REPEATS) for i in range(TASKS * REPEATS)]
    assert keys[len(collected) :] == [(None, None)] * (DIRECT + 2)


# ------------------------------------------------------------------------- --where

OPERATORS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
# field -> what the test wrote (the job's own trace and the start-up trace have a duration too)
WHERE_FIELDS = {
    "reward": lambda r: r["reward"],
    "tokens": lambda r: sum(r["tokens"]) if "tokens" in r else None,
    "duration": lambda r: r["duration_ms"],
    "task": lambda r: r.get("task"),
    "repeat": lambda r: r.get("repeat"),
}


@pytest.mark.parametrize("field", list(WHERE_FIELDS))
def test_where_every_operator_on_every_field(run, view, field):
    value_of = WHERE_FIELDS[field]
    others = [
        {"trace_id": run["job"], "duration_ms": TASKS * REPEATS * 20.0 + 300, "reward": None},
        {"trace_id": run["startup"], "duration_ms": 16_000.0, "reward": None},
    ]
    written = run["rollouts"] + others
    values = sorted(value_of(r) for r in written if value_of(r) is not None)
    threshold = values[len(values) // 2]  # a value some trace has: == matches, the others split the run
    shown = f"{threshold:g}"
    assert float(shown) == threshold
    for op, compare in OPERATORS.items():
        expected = {r["trace_id"] for r in written if value_of(r) is not None and compare(value_of(r), threshold)}
        got = {r["trace_id"] for r in _records(view, "--where", f"{field}{op}{shown}")}
        assert got == expected, (field, op)
        assert 0 < len(expected) < len(written), (field, op)  # the threshold splits the run


def test_where_masked_leaves_masked_samples_out_or_in(run, view):
    rewarded = [r for r in run["rollouts"] if r["reward"] is not None]
    for condition, masked in (("masked==0", False), ("masked==1", True)):
        got = {r["trace_id"] for r in _records(view, "--where", condition)}
        assert got == {r["trace_id"] for r in rewarded if bool(r["masked"]) is masked}, condition
        assert got


def test_where_duration_units_spaces_and_and(run, view):
    ids = lambda *args: {r["trace_id"] for r in _records(view, *args)}  # noqa: E731
    in_ms = ids("--where", "duration>=200")
    assert 0 < len(in_ms) < len(run["rollouts"])
    for same in ("duration >= 200ms", "duration>=0.2s", "DURATION>=0.2S", " duration>= 200 "):
        assert ids("--where", same) == in_ms, same
    # conditions ANDed: the slow rollouts that scored 0
    expected = {r["trace_id"] for r in run["rollouts"] if r["reward"] == 0.0 and r["duration_ms"] > 250}
    assert ids("--where", "reward==0", "--where", "duration>250") == expected and expected
    # a trace without the field matches no condition on it, != included
    no_reward = {r["trace_id"] for r in run["rollouts"] if r["reward"] is None}
    assert no_reward and not no_reward & ids("--where", "reward!=12345")
    # with the other filters and --by-task
    errors = ids("--where", "task<10", "--status", "error")
    assert errors == {r["trace_id"] for r in run["rollouts"] if r["failed"] and r["task"] < 10} and errors


BAD = {
    "rewrd<0.5": "--where 'rewrd<0.5': unknown field 'rewrd'; the fields: reward (the verifier's reward), "
    "tokens (model tokens, in + out), duration (ms; or with a unit: 2s, 150ms), task (task index), "
    "repeat (the task's repeat index), masked (1 for a masked sample, 0 for a valid reward)",
    "reward=0.5": "--where 'reward=0.5': unknown operator '='"
    " (== compares for equality); the operators: <= >= == != < >",
    "reward=>0.5": "--where 'reward=>0.5': unknown operator '=>'; the operators: <= >= == != < >",
    "reward 0.5": "--where 'reward 0.5': no operator after 'reward'; write FIELD OPERATOR NUMBER "
    "(--where 'reward<0.5'), an operator among: <= >= == != < >",
    "reward<high": "--where 'reward<high': 'high' is not a number; write FIELD OPERATOR NUMBER (--where 'reward<0.5')",
    "reward<": "--where 'reward<': no number after '<'; write FIELD OPERATOR NUMBER (--where 'reward<0.5')",
    "task<2s": "--where 'task<2s': '2s' is not a number; write FIELD OPERATOR NUMBER (--where 'reward<0.5')",
    "duration>2min": "--where 'duration>2min': '2min' is not a duration; write milliseconds (150) or give the "
    "unit (150ms, 2s)",
    "<0.5": "--where '<0.5': no field; write FIELD OPERATOR NUMBER (--where 'reward<0.5'), a field among: "
    "reward (the verifier's reward), tokens (model tokens, in + out), duration (ms; or with a unit: 2s, 150ms), "
    "task (task index), repeat (the task's repeat index), masked (1 for a masked sample, 0 for a valid reward)",
}


@pytest.mark.parametrize("condition", list(BAD))
def test_where_refuses_bad_input_naming_the_problem_and_the_fix(view, condition):
    code, out, err = view("--where", condition)
    assert (code, out) == (2, "")
    assert err.strip() == f"gym-autoinstr view: {BAD[condition]}"


# ------------------------------------------------------------------------- --by-task


def _nearest_rank(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


def _expected_task(rollouts: list[dict], task) -> dict:
    rewards = [r["reward"] for r in rollouts if r["reward"] is not None and not r["masked"]]
    durations = [r["duration_ms"] for r in rollouts]
    return {
        "task_index": task,
        "rollouts": len(rollouts),
        "mean_reward": pytest.approx(sum(rewards) / len(rewards)) if rewards else None,
        "rewarded": len(rewards),
        "masked": sum(1 for r in rollouts if r["masked"]),
        "p50_duration_ms": _nearest_rank(durations, 0.5),
        "p95_duration_ms": _nearest_rank(durations, 0.95),
        "failures": sum(1 for r in rollouts if r["failed"]),
    }


def test_by_task_json_rows_match_the_data_written(run, view):
    code, out, err = view("--by-task", "--json")
    assert code == 0, err
    summary = json.loads(out)
    collected = [r for r in run["rollouts"] if r["task"] is not None]
    expected = [_expected_task([r for r in collected if r["task"] == task], task) for task in range(TASKS)]
    assert summary["tasks"] == expected
    assert summary["all"] == _expected_task(collected, None)
    assert summary["rollouts_without_task_index"] == DIRECT
    # the rows that say something: all 1.0, all 0.0, a task with failures, one with a masked sample
    assert summary["tasks"][0]["mean_reward"] == 1.0 and summary["tasks"][1]["mean_reward"] == 0.0
    assert sum(row["failures"] for row in summary["tasks"]) == sum(r["failed"] for r in collected) >= 8
    assert sum(row["masked"] for row in summary["tasks"]) >= 3
    # 5 repeats: p50 the 3rd shortest, p95 the longest
    first = sorted(r["duration_ms"] for r in collected if r["task"] == 0)
    assert (summary["tasks"][0]["p50_duration_ms"], summary["tasks"][0]["p95_duration_ms"]) == (first[2], first[4])


def test_by_task_text_and_with_filters(run, view):
    code, out, err = view("--by-task")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == "task rollouts mean reward rewarded masked p50 duration p95 duration failures".split()
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.strip() and line.split()[0].isdigit()}
    assert sorted(rows, key=int) == [str(t) for t in range(TASKS)] and list(rows) == [str(t) for t in range(TASKS)]
    collected = [r for r in run["rollouts"] if r["task"] is not None]
    for task in (0, 1, 2, 13):
        expected = _expected_task([r for r in collected if r["task"] == task], task)
        mean = "" if expected["mean_reward"] is None else f"{expected['mean_reward'].expected:.3f}"
        words = [
            str(task),
            "5",
            *([mean] if mean else []),
            str(expected["rewarded"]),
            str(expected["masked"]),
            f"{expected['p50_duration_ms']:.1f}",
            "ms",
            f"{expected['p95_duration_ms']:.1f}",
            "ms",
            str(expected["failures"]),
        ]
        assert rows[str(task)] == words, task
    (overall,) = [line for line in lines if line.split()[:1] == ["all"]]
    assert overall.split()[1] == str(TASKS * REPEATS)
    assert f"{DIRECT} rollout traces without a task index not counted" in lines
    # filters first: one repeat of each task
    code, out, _err = view("--by-task", "--json", "--where", "repeat==0")
    summary = json.loads(out)
    assert [row["rollouts"] for row in summary["tasks"]] == [1] * TASKS and summary["rollouts_without_task_index"] == 0
    # no task index among what is left: said, not an empty table
    code, out, err = view("--by-task", "--trace", run["rollouts"][-1]["trace_id"])
    assert (code, out) == (1, "") and "no rollout trace here carries a task index" in err
