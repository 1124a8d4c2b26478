"""``gym-autoinstr compare`` on two real collection jobs (``campaign_jobs``: Gym 0.4.0, 30
tasks x 3 repeats each, in one run directory, the second's verify slower by ``SLOWER_MS``),
checked against Gym's own output rows: every per-task rollout count, mean reward and token
mean, the overall means, the tasks marked better and worse, the slower verify; then the
text in a terminal and the page."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from tests.commands.view_helpers import _cli, _dom
from tests.harness.campaign import SLOWER_MS

pytestmark = pytest.mark.realgym


def _tasks(rows: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[row["_ng_task_index"]].append(row)
    return grouped


def _verify_ms(files, sides: dict[str, str]) -> dict[str, list[float]]:
    """Per rollout of each job (``sides``: job id -> side), the ms its trace spent in the
    resources server's ``/verify``, from the spans as ``setup.files`` reads them."""
    from gym_autoinstr.setup.files import read_path

    spans = list(read_path(files))
    job_of = {
        s["trace_id"]: sides.get(str(s["attributes"].get("nemo.gym.job.id"))) for s in spans if not s["parent_span_id"]
    }
    took: dict[str, float] = defaultdict(float)
    for span in spans:
        resources = span["resource"].get("nemo.gym.server.type") == "resources_servers"
        if resources and span["kind"] == "SERVER" and span["attributes"].get("http.route") == "/verify":
            took[span["trace_id"]] += (span["end_ns"] - span["start_ns"]) / 1e6
    found: dict[str, list[float]] = {"a": [], "b": []}
    for trace, side in job_of.items():
        if side and trace in took:
            found[side].append(took[trace])
    return found


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_two_jobs_compare_as_gyms_rows_say(campaign_jobs, tmp_path):
    before, after = campaign_jobs.before, campaign_jobs.after
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = str(campaign_jobs.files)
    jobs = ("--jobs", before.job_id[:12], after.job_id[:12])  # a prefix will do

    result = _cli("compare", run, *jobs, "--json", columns=None, env=env)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sides"]["a"]["job_id"] == before.job_id and record["sides"]["b"]["job_id"] == after.job_id
    rows_a, rows_b = _tasks(before.rows), _tasks(after.rows)
    assert sorted(rows_a) == sorted(rows_b) == [row["task_index"] for row in record["tasks"]]
    assert record["only_a"] == record["only_b"] == [] and record["without_task"] == {"a": 0, "b": 0}
    changed = {}
    for row in record["tasks"]:
        task = row["task_index"]
        for side, rows in (("a", rows_a[task]), ("b", rows_b[task])):
            assert row[side]["rollouts"] == len(rows)
            assert row[side]["mean_reward"] == pytest.approx(_mean(r["reward"] for r in rows), abs=1e-12)
            usage = [r["response"]["usage"] for r in rows]
            assert row[side]["tokens"]["input_mean"] == pytest.approx(_mean(u["input_tokens"] for u in usage))
            assert row[side]["tokens"]["output_mean"] == pytest.approx(_mean(u["output_tokens"] for u in usage))
        difference = _mean(r["reward"] for r in rows_b[task]) - _mean(r["reward"] for r in rows_a[task])
        changed[task] = difference
        assert row["changes"]["reward"]["change"] == pytest.approx(difference, abs=1e-12)
        # each task's repeats score alike: the interval is the change itself, marked where it is not 0
        expected = "better" if difference > 1e-9 else "worse" if difference < -1e-9 else None
        assert row["changes"]["reward"]["mark"] == expected, (task, row["changes"]["reward"])
    assert any(v > 0 for v in changed.values()) and any(v < 0 for v in changed.values())

    overall = record["overall"]
    assert overall["a"]["rollouts"] == len(before.rows) and overall["b"]["rollouts"] == len(after.rows)
    assert overall["a"]["mean_reward"] == pytest.approx(_mean(r["reward"] for r in before.rows), abs=1e-12)
    assert overall["b"]["mean_reward"] == pytest.approx(_mean(r["reward"] for r in after.rows), abs=1e-12)
    paired = overall["changes"]["reward"]["paired"]
    assert paired["tasks"] == len(changed) and paired["change"] == pytest.approx(_mean(changed.values()), abs=1e-12)
    for side, rows in (("a", before.rows), ("b", after.rows)):
        tokens = overall[side]["tokens"]
        assert tokens["input_mean"] == pytest.approx(_mean(r["response"]["usage"]["input_tokens"] for r in rows))
        assert tokens["output_mean"] == pytest.approx(_mean(r["response"]["usage"]["output_tokens"] for r in rows))
    # verify: each job's p50 as the spans themselves say (read apart: the resources server's
    # SERVER spans of /verify, per trace), and the after job's slower by its sleep
    verify_ms = _verify_ms(campaign_jobs.files, {before.job_id: "a", after.job_id: "b"})
    for side in ("a", "b"):
        times = sorted(verify_ms[side])
        assert len(times) == len(before.rows)
        assert overall[side]["times_ms"]["verify"]["p50"] == pytest.approx(times[math.ceil(len(times) / 2) - 1])
    assert min(verify_ms["b"]) >= SLOWER_MS  # every after-job verify sleeps SLOWER_MS
    verify = overall["changes"]["times_ms"]["verify"]
    assert verify["mark"] == "slower" and verify["p_value"] < 0.01, verify
    # (by about SLOWER_MS on an idle machine; under load, the before job's verify alone
    # varies by tens of ms: 2-55 ms measured with the suite's two workers busy)
    assert overall["b"]["times_ms"]["verify"]["p50"] > SLOWER_MS and verify["p50_change"] > SLOWER_MS / 4
    assert overall["changes"]["failure_rate"]["change"] == 0 and overall["a"]["failures"] == 0

    text = _cli("compare", run, *jobs, columns=120, env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines)
    assert lines[0].startswith(f"A: {run} (job {before.job_id[:8]}")
    verify_line = next(line for line in lines if line.startswith("verify p50"))
    assert verify_line.endswith("slower")
    heading = next(i for i, line in enumerate(lines) if line.lstrip().startswith("task  rollouts"))
    task_lines = lines[heading + 1 : heading + 1 + len(changed)]
    for line in task_lines:
        task = int(line.split()[0])
        mark = "better" if changed[task] > 1e-9 else "worse" if changed[task] < -1e-9 else None
        assert (mark or "") in line and (("better" in line) == (mark == "better")), line

    page = tmp_path / "compare.html"
    assert _cli("compare", run, *jobs, "--html", str(page), env=env).returncode == 0
    document = _dom(page.read_text(encoding="utf-8"))
    bars = [e for e in document.walk() if e.tag == "rect" and "bar" in (e.attrs.get("class") or "").split()]
    assert sorted(int(e.attrs["data-task"]) for e in bars) == sorted(changed)
    for bar in bars:
        difference = changed[int(bar.attrs["data-task"])]
        kind = "better" if difference > 1e-9 else "worse" if difference < -1e-9 else "same"
        assert bar.attrs["class"] == f"bar {kind}"
    assert [e.attrs.get("data-time") for e in document.find("figure", "times")] == [
        "duration",
        "model",
        "tools",
        "verify",
    ]
