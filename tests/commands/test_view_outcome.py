"""``gym-autoinstr view`` answers outcome questions on a collection run of 300 rollouts
(60 tasks x 5 repeats) and 4 rollouts sent to the agent directly: the reward and tokens
columns, ``--sort reward|tokens|task``, ``--where``, ``--by-task`` and the page's columns
and reward chart.

The run is written as the embedded default writes one (a directory of per-process
OTLP-JSON files, ``test_view_scale._Process``), in the shapes the advice gives a rollout:

* ``new`` (what the advice writes today): the outcome on the root CLIENT ``POST /run``
  (``invoke_agent``: reward, mask, task and repeat indexes, the rollout's total tokens as
  ``nemo.gym.rollout.usage.*``), on ``gym.rollout`` (the same), on the CLIENT
  ``/verify`` span and ``gym.verify`` (reward); each model call's ``gen_ai.usage.*`` on
  its CLIENT ``chat`` span alone (the model server's ``gym.model.responses`` seam is a
  ``chat`` span without them);
* ``interim`` (an earlier shape): the total as ``gen_ai.usage.*`` on the ``invoke_agent``
  spans, each call's usage on its CLIENT span and on its seam too;
* ``calls``: ``interim`` without the totals (tokens come from the calls, each once);
* ``old``: no operation on the root, tokens on the ``gym.model.*`` seams alone, the
  reward on ``gym.verify`` alone;
* ``fallback``: the root without a reward, ``gym.rollout`` and ``gym.verify`` with
  different ones (the first wins);
* ``outer``: ``gym.rollout``'s total differs from the root's (the root's wins).

Every expected value is computed here from what was written, not read back through the
view's own code.  The view runs in-process (``cli.main``), so the many ``--where``
cases cost no interpreter start each.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from gym_autoinstr.commands import cli
from gym_autoinstr.commands.view.model import build_traces
from gym_autoinstr.setup.files import read_path
from tests.commands.test_view import _assert_self_contained, _dom, _rendered_dom
from tests.commands.test_view_scale import _Process

TASKS, REPEATS = 60, 5
DIRECT = 4  # rollouts sent to the agent directly: no collection driver, no task index
STAGES = ("admission", "seed", "agent", "verification", "cleanup")
REWARDS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _shape(index: int) -> str:
    if index % 50 == 3:
        return "outer"
    if index % 11 == 4:
        return "old"
    if index % 13 == 6:
        return "fallback"
    if index % 7 == 2:
        return "calls"
    if index % 9 == 1:
        return "interim"
    return "new"


def _reward(task: int, repeat: int) -> float:
    if task % 10 == 0:
        return 1.0
    if task % 10 == 1:
        return 0.0
    return REWARDS[(task * 3 + repeat * 2) % 5]


def write_outcome_run(directory) -> dict:
    directory.mkdir(parents=True)
    roles = ("orchestrator", "agent", "model", "resources")
    procs = {role: _Process(directory, role, 200 + i, batch=64) for i, role in enumerate(roles)}
    counter = iter(range(1, 1 << 62))

    def sid() -> str:
        return format(next(counter), "016x")

    startup_trace = "5" * 32
    startup = sid()
    procs["orchestrator"].span(startup_trace, startup, None, "gym.startup", 1, -16_000, 0)
    job_trace, job_span = "a" * 32, sid()
    rollouts = []
    for index in range(TASKS * REPEATS + DIRECT):
        direct = index >= TASKS * REPEATS
        task, repeat = (None, None) if direct else divmod(index, REPEATS)
        shape = "new" if direct else _shape(index)
        trace_id = format((index + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128), "032x")
        t0 = index * 20.0
        took = 100 + (index * 37) % 190
        failed = not direct and index % 29 == 13
        stage = STAGES[(index // 29) % len(STAGES)] if failed else None
        masked = not direct and not failed and index % 37 == 5
        reward = 0.0 if masked else (0.5 if direct else _reward(task, repeat))
        if failed and stage != "cleanup":  # a rollout that failed before verify ended has no reward
            reward = None
        calls = 1 + index % 3
        usage = [(100 + 10 * k + index % 7, 20 + k) for k in range(calls)]
        per_call = (sum(u[0] for u in usage), sum(u[1] for u in usage))
        total = per_call if shape in ("new", "outer", "fallback", "interim") else None
        root_total = (per_call[0] + 11, per_call[1] + 3) if shape == "outer" else total
        # where the totals go: our own name today, gen_ai.usage.* on invoke_agent spans before
        total_keys = ("gen_ai.usage." if shape == "interim" else "nemo.gym.rollout.usage.") + "{}_tokens"
        outcome = {} if reward is None else {"nemo.gym.reward": reward, "nemo.gym.mask_sample": masked}
        failure = {"error.type": "RuntimeError", "nemo.gym.failure.stage": stage} if failed else {}

        rid = f"direct-{index}" if direct else f"{task}-{repeat}"
        root_attributes = {"http.request.method": "POST", "nemo.gym.rollout.id": rid}
        if shape != "old":
            root_attributes["gen_ai.operation.name"] = "invoke_agent"
            if shape != "fallback":
                root_attributes.update(outcome)
        if not direct:
            root_attributes.update({"nemo.gym.task.index": task, "nemo.gym.rollout.index": repeat})
        if root_total:
            root_attributes.update(dict(zip((total_keys.format("input"), total_keys.format("output")), root_total)))
        root_attributes.update(failure)
        if direct:
            root = sid()
            procs["agent"].span(trace_id, root, None, "POST /run", 2, t0, t0 + took, root_attributes)
            run = root
        else:
            root = sid()
            procs["orchestrator"].span(
                trace_id,
                root,
                None,
                "POST /run",
                3,
                t0,
                t0 + took,
                {
                    **root_attributes,
                    "nemo.gym.http.destination.server.name": "agent",
                    "nemo.gym.http.destination.route": "/run",
                },
                error=failed,
                links=[(job_trace, job_span)],
            )
            run = sid()
            procs["agent"].span(trace_id, run, root, "POST /run", 2, t0 + 1, t0 + took - 1, {"http.route": "/run"})
        seam_attributes = {} if shape == "old" else {"gen_ai.operation.name": "invoke_agent"}
        if shape not in ("old",):
            seam_attributes.update(outcome)
        if shape == "fallback" and reward is not None:
            seam_attributes["nemo.gym.reward"] = reward
        if not direct and shape != "old":
            seam_attributes.update({"nemo.gym.task.index": task, "nemo.gym.rollout.index": repeat})
        if total:
            seam_attributes.update({total_keys.format("input"): total[0], total_keys.format("output"): total[1]})
        seam = sid()
        procs["agent"].span(trace_id, seam, run, "gym.rollout", 1, t0 + 2, t0 + took - 2, seam_attributes)
        at = t0 + 3
        for tokens_in, tokens_out in usage:
            chat = {"gen_ai.operation.name": "chat"}
            counted = {"gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out}
            client = sid()
            procs["agent"].span(
                trace_id,
                client,
                seam,
                "POST /ng-rollout/{rollout_id}/v1/responses",
                3,
                at,
                at + 12,
                {
                    "nemo.gym.http.destination.server.name": "model",
                    "nemo.gym.http.destination.route": "/v1/responses",
                    **({} if shape == "old" else {**chat, **counted}),
                },
            )
            served = sid()
            procs["model"].span(trace_id, served, client, "POST /v1/responses", 2, at + 1, at + 11, {})
            on_seam = {**chat} if shape in ("new", "outer", "fallback") else {**chat, **counted}
            procs["model"].span(trace_id, sid(), served, "gym.model.responses", 1, at + 2, at + 10, on_seam)
            at += 14
        verify_outcome = dict(outcome)
        if shape == "fallback" and reward is not None:
            verify_outcome["nemo.gym.reward"] = reward + 0.125  # gym.rollout's comes first
        client = sid()
        procs["agent"].span(
            trace_id,
            client,
            seam,
            "POST /ng-rollout/{rollout_id}/verify",
            3,
            at,
            at + 8,
            {
                "nemo.gym.http.destination.server.name": "resources",
                "nemo.gym.http.destination.route": "/verify",
                **({} if shape == "old" else verify_outcome),
            },
            error=failed and stage == "verification",
        )
        served = sid()
        procs["resources"].span(trace_id, served, client, "POST /verify", 2, at + 1, at + 7, {"http.route": "/verify"})
        procs["resources"].span(trace_id, sid(), served, "gym.verify", 1, at + 2, at + 6, verify_outcome)
        rollouts.append(
            {
                "trace_id": trace_id,
                "task": task,
                "repeat": repeat,
                "shape": shape,
                "reward": reward,
                "masked": masked if reward is not None else None,
                "tokens": root_total or per_call,
                "duration_ms": float(took),
                "failed": failed,
                "stage": stage,
            }
        )
    procs["orchestrator"].span(
        job_trace, job_span, None, "gym.job", 1, 0, TASKS * REPEATS * 20.0 + 300, {"nemo.gym.job.id": "j" * 32}
    )
    for process in procs.values():
        process.close()
    return {"dir": directory, "rollouts": rollouts, "job": job_trace, "startup": startup_trace}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return write_outcome_run(tmp_path_factory.mktemp("outcome") / "run")


@pytest.fixture
def view(run, capsys, monkeypatch):
    """``gym-autoinstr view RUN ARGS...`` in-process, as a script reads it (no terminal):
    its exit code, standard output and standard error."""
    monkeypatch.delenv("COLUMNS", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = cli.main(["view", str(run["dir"]), *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


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


def _reward_shown(rollout: dict) -> str:
    if rollout["reward"] is None:
        return ""
    text = f"{rollout['reward']:.3f}".rstrip("0")
    return (text + "0" if text.endswith(".") else text) + ("*" if rollout["masked"] else "")


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
