"""``gym-autoinstr export`` on real collection runs: the two jobs of ``campaign_jobs`` (Gym
0.4.0, 30 tasks x 3 repeats each, rewards known per task, the second job's verify slower by
``SLOWER_MS``), in one run directory shared with the session's other jobs.  Every row is
checked against Gym's own output rows, the join docs/export.md shows is run as written,
and ``--spans`` against the rollout rows it belongs to.

CSV and JSONL come from the runner's command; Parquet needs pyarrow, which the runner venv
has from Gym (else the Gym 0.4.0 venv's python writes and reads it)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
from pathlib import Path

import pytest

from tests.commands.test_export import read_rows
from tests.commands.view_helpers import _cli
from tests.harness.campaign import REPEATS, SLOWER_MS, TASKS, reward_after, reward_before

pytestmark = pytest.mark.realgym

HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One runs cache for the module: the first export reads the run directory, the rest its table."""
    return str(tmp_path_factory.mktemp("export-cache"))


def _export(cache: str, *args: str) -> str:
    result = _cli("export", *args, env={"XDG_CACHE_HOME": cache})
    assert result.returncode == 0, result.stderr
    return result.stdout


def _gym_python() -> str:
    from tests.harness.gym_install import gym_venv

    return str(gym_venv("0.4.0") / "bin" / "python")


def _parquet(cache: str, path: Path, *args: str) -> list[dict]:
    """Export to ``path`` (Parquet) and read it back: here when pyarrow is, else in Gym's venv."""
    if HAVE_PYARROW:
        _export(cache, *args, "--to", str(path))
        return read_rows(path)
    command = [_gym_python(), "-m", "gym_autoinstr.commands.cli", "export", *args, "--to", str(path)]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "XDG_CACHE_HOME": cache}, timeout=300)
    reader = (
        "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n"
        "t = pq.read_table(sys.argv[1])\n"
        "t = t.set_column(t.schema.get_field_index('start'), 'start', t.column('start').cast(pa.int64()))\n"
        "print(json.dumps(t.to_pylist()))\n"
    )
    read = subprocess.run([_gym_python(), "-c", reader, str(path)], check=True, capture_output=True, text=True)
    return json.loads(read.stdout)


def _check_rows(rows: list[dict], job, reward, files: Path) -> None:
    """Each row against its job's own output row: reward, task and repeat, tokens."""
    assert len(rows) == len(job.rows) == TASKS * REPEATS
    gym = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in job.rows}
    assert {(r["task_index"], r["rollout_index"]) for r in rows} == set(gym)
    for row in rows:
        out = gym[(row["task_index"], row["rollout_index"])]
        assert row["reward"] == out["reward"] == reward(row["task_index"])
        assert (row["input_tokens"], row["output_tokens"]) == (
            out["response"]["usage"]["input_tokens"],
            out["response"]["usage"]["output_tokens"],
        )
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
        assert row["job_id"] == job.job_id and row["run"] == str(files)
        assert row["trace_kind"] == "rollout" and row["failed"] is False and row["error_type"] is None
        assert row["start_ns"] >= job.start_ns and 0 <= row["start_ns"] - row["start"] < 1000  # text: to the µs
        assert row["duration_ms"] >= row["model_ms"] + row["tools_ms"] + row["verify_ms"] > 0
        assert row["span_count"] > 5 and re.fullmatch("[0-9a-f]{16}", row["root_span_id"])
        assert row["root_name"].startswith("POST") and len(row["services"]) >= 3
    assert len({r["trace_id"] for r in rows}) == len(rows)
    assert [r["start_ns"] for r in rows] == sorted(r["start_ns"] for r in rows)


def test_every_exported_row_is_gyms_own_output_row(campaign_jobs, cache, tmp_path):
    files, before, after = campaign_jobs.files, campaign_jobs.before, campaign_jobs.after
    as_jsonl, as_csv = tmp_path / "before.jsonl", tmp_path / "before.csv"
    said = _export(cache, str(files), "--job", before.job_id, "--to", str(as_jsonl))
    assert said.startswith(f"wrote {TASKS * REPEATS} rollouts to {as_jsonl} (")
    _export(cache, str(files), "--job", before.job_id[:12], "--to", str(as_csv))
    rows = read_rows(as_jsonl)
    _check_rows(rows, before, reward_before, files)
    assert read_rows(as_csv) == rows  # the same table, whichever format
    after_rows = _parquet(cache, tmp_path / "after.parquet", str(files), "--job", after.job_id)
    _check_rows(after_rows, after, reward_after, files)
    # the second job's verify is slower by SLOWER_MS: every rollout's verify_ms says so
    assert min(r["verify_ms"] for r in after_rows) >= SLOWER_MS
    assert statistics.median(r["verify_ms"] for r in rows) < SLOWER_MS
    # both jobs at once: 180 rows, each job's 90
    both = tmp_path / "both.jsonl"
    _export(cache, str(files), "--job", before.job_id, "--job", after.job_id, "--to", str(both))
    assert sorted(r["trace_id"] for r in read_rows(both)) == sorted(r["trace_id"] for r in rows + after_rows)


def _quantile(values: list[float], q: float) -> float:
    """pandas' default quantile (linear between the two nearest ranks)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def test_the_docs_join_with_gyms_output_answers_slow_rollouts_that_scored_0(campaign_jobs, cache, tmp_path):
    after = campaign_jobs.after
    rows = _parquet(cache, tmp_path / "rollouts.parquet", str(campaign_jobs.files), "--job", after.job_id)
    (tmp_path / "gym_output.jsonl").write_text("".join(json.dumps(row) + "\n" for row in after.rows))
    # the join itself, in plain Python: every rollout meets its output row
    gym = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in after.rows}
    joined = [(row, gym[(row["task_index"], row["rollout_index"])]) for row in rows]
    assert len(joined) == TASKS * REPEATS and all(row["reward"] == out["reward"] for row, out in joined)
    threshold = _quantile([r["duration_ms"] for r in rows], 0.9)
    wanted = {(r["task_index"], r["rollout_index"]) for r in rows if r["reward"] == 0 and r["duration_ms"] >= threshold}
    # the docs' pandas example, as written, where pandas is
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    example = re.search(r"### pandas: slow rollouts that scored 0\n\n```python\n(.*?)```", docs, re.S)
    assert example, "docs/export.md lost its pandas example"
    namespace: dict = {}
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(example[1], "docs/export.md", "exec"), namespace)
    finally:
        os.chdir(here)
    answer = namespace["joined"]
    assert set(zip(answer["task_index"], answer["rollout_index"])) == wanted
    assert list(answer["reward_gym"]) == [0] * len(wanted)
    assert len(namespace["gym"]) == len(namespace["rollouts"]) == TASKS * REPEATS


def test_spans_of_a_job_are_each_rollouts_spans(campaign_jobs, cache, tmp_path):
    files, after = str(campaign_jobs.files), campaign_jobs.after
    rollouts, spans = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    _export(cache, files, "--job", after.job_id, "--where", "task<2", "--to", str(rollouts))
    said = _export(cache, files, "--job", after.job_id, "--where", "task<2", "--spans", "--to", str(spans))
    chosen = {row["trace_id"]: row for row in read_rows(rollouts)}
    assert len(chosen) == 2 * REPEATS
    from gym_autoinstr.commands.export.columns import SPAN_COLUMNS

    span_rows = read_rows(spans, SPAN_COLUMNS)
    assert said.startswith(f"wrote {len(span_rows)} spans of {2 * REPEATS} rollouts")
    for trace_id, row in chosen.items():
        mine = [s for s in span_rows if s["trace_id"] == trace_id]
        assert len(mine) == row["span_count"]
        assert all(
            (s["job_id"], s["task_index"], s["rollout_index"])
            == (after.job_id, row["task_index"], row["rollout_index"])
            for s in mine
        )
        (root,) = [s for s in mine if s["span_id"] == row["root_span_id"]]
        assert root["parent_span_id"] is None and root["start_ns"] == row["start_ns"]
        verify = [s for s in mine if s["kind"] == "SERVER" and s["name"].endswith("/verify")]
        assert len(verify) == 1 and verify[0]["duration_ms"] >= SLOWER_MS
        assert sum(s["duration_ms"] for s in verify) == pytest.approx(row["verify_ms"])
        assert json.loads(root["attributes"])["nemo.gym.task.index"] == row["task_index"]
