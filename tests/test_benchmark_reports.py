"""The benchmark's reports of saved runs (``./run-benchmarks --across``, the ``files``
variant's run directory, ``--memory-over-time``): arithmetic on results shaped as ``--json``
writes them; and its ``--help``, which builds nothing.  No trio is started here."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks.memory import FLEET, memory_report, memory_rows, quarter_index
from benchmarks.report import across_report
from benchmarks.rundir import count_telemetry, directory_bytes, disk_report, record_trio, spans_with_tags

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = {
    "run": "",
    "attribution": "--attribution",
    "instructions": "--instructions",
    "trio_instructions": "--trio-instructions",
    "memory": "--memory-over-time",
    "campaign": "--campaign",
}


@pytest.mark.parametrize("mode", MODES)
def test_every_modes_options_are_declared_with_the_standard_library_alone(mode):
    # -S: no site-packages (no psutil, no Gym, no OpenTelemetry), as a python3 outside any venv
    result = subprocess.run(
        [sys.executable, "-S", "-m", "benchmarks.options", mode, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: run-benchmarks {MODES[mode]}".rstrip() + " [-h]")


def test_run_benchmarks_and_run_demo_help_build_nothing(tmp_path):
    cache = tmp_path / "cache"  # where tools/runner-venv and ./run-demo would build their venvs
    benchmarks = (["--help"], ["--quick", "-h"], ["--attribution", "--help"], ["--memory-over-time", "-h"])
    for script, *arguments in [("run-benchmarks", *a) for a in benchmarks] + [("run-demo", "--rollouts", "2", "-h")]:
        result = subprocess.run(
            [str(REPO / script), *arguments],
            env={**os.environ, "GYM_AUTOINSTR_TEST_CACHE": str(cache)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0 and result.stdout.startswith(f"usage: {script}"), result.stderr
    assert not cache.exists()


def _run(bare: list, off: list, default: list, sampled: list, together: list | None = None) -> dict:
    def row(key, cpu):
        return {"key": key, "cpu_ms": cpu, "bare_cpu_ms": bare}

    results = {
        "variants": [{"key": "bare", "cpu_ms": bare}, row("off", off), row("default", default), row("sampled", sampled)]
    }
    if together is not None:  # windows: (bare, default, sampled) CPU per rollout
        results["sampled_together"] = {
            key: [{"n": 100, "cpu_ms": w[i], "set": 0} for w in together]
            for i, key in enumerate(("bare", "default", "sampled"))
        }
    return results


def _close(got: float, want: float) -> bool:
    return abs(got - want) < 5e-4  # (the report prints three decimals)


def test_across_runs_splits_a_dropped_rollouts_overhead_into_span_groups_off_and_the_dropped_path():
    # run a: off +0.2, default +1.0, sampled +0.5 ms in every repetition; run b: +0.0, +2.0, +0.4
    a = _run(
        [10.0, 11.0, 12.0],
        [10.2, 11.2, 12.2],
        [11.0, 12.0, 13.0],
        [10.5, 11.5, 12.5],
        together=[(10.0, 11.0, 10.2), (10.0, 11.0, 10.2), (10.0, 11.0, 10.2)],
    )
    b = _run(
        [10.0, 10.0, 10.0],
        [10.0, 10.0, 10.0],
        [12.0, 12.0, 12.0],
        [10.4, 10.4, 10.4],
        together=[(10.0, 12.0, 10.6), (10.0, 12.0, 10.6), (10.0, 12.0, 10.6)],
    )
    text = across_report([("a", a), ("b", b), ("other", {"variants": {"not": "a run"}})])
    lines = text.splitlines()
    row_a = next(line for line in lines if line.startswith("| a |"))
    assert [c.strip() for c in row_a.split("|")[2:9]] == ["3", "+0.20", "+1.00", "+0.50", "0.200", "0.300", "0.500"]
    row_b = next(line for line in lines if line.startswith("| b |"))
    assert [c.strip() for c in row_b.split("|")[6:9]] == ["0.000", "0.200", "0.200"]
    assert any(line.startswith("| other |") and "left out" in line for line in lines)
    pooled = {line.split(":")[0]: float(line.split(": ")[1].split()[0]) for line in lines if line.startswith("- ")}
    # ratio of sums over all six repetitions: off 0.6/9.0, dropped (1.5-0.6 + 1.2)/9.0, sampled 2.7/9.0
    assert _close(pooled["- span groups off over traced"], 0.6 / 9.0)
    assert _close(pooled["- the dropped path (sampled out - off) over traced"], 2.1 / 9.0)
    assert _close(pooled["- a sampled-out rollout over a traced one (target <= 0.20)"], 2.7 / 9.0)
    together = next(v for k, v in pooled.items() if k.startswith("- the same, loaded together (6 windows of 2 run(s))"))
    assert _close(together, (3 * 0.2 + 3 * 0.6) / (3 * 1.0 + 3 * 2.0))
    # capacity, pooled: bare's CPU over the variant's, summed over both runs' repetitions
    capacity = {k.split(" (")[0]: v for k, v in pooled.items() if k.startswith(("- off (", "- default ("))}
    assert _close(capacity["- default"], 63.0 / 72.0) and _close(capacity["- off"], 63.0 / 63.6)


# ------------------------------------------------------------------ the files variant's run directory


def _spans_line(trace_ids: list[str]) -> str:
    spans = [{"traceId": t, "spanId": "00" * 8, "name": "x"} for t in trace_ids]
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}]})


def _metrics_line(points: int) -> str:
    metric = {"name": "m", "sum": {"dataPoints": [{"asInt": "1"}] * points}}
    return json.dumps({"resourceMetrics": [{"resource": {}, "scopeMetrics": [{"scope": {}, "metrics": [metric]}]}]})


def test_a_run_directory_is_summed_whatever_its_files_are_named_and_its_spans_counted_by_tag(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    tag_a, tag_b = "b34c0501", "b34c0502"
    # an open segment, uncompressed, whose last line was cut short by a crash
    (run / "agent-11.1.jsonl").write_text(
        _spans_line([tag_a + "0" * 24] * 3) + "\n" + _spans_line([tag_b + "1" * 24])[:40] + "\n"
    )
    # a closed segment, gzip-compressed; and one cut short mid-stream (its process killed)
    (run / "agent-11.0.jsonl.gz").write_bytes(gzip.compress((_spans_line([tag_b + "2" * 24] * 2) + "\n").encode()))
    whole = gzip.compress(("\n".join([_spans_line([tag_a + "3" * 24])] * 50) + "\n").encode())
    (run / "resources-12.0.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (run / "agent-11.metrics.jsonl").write_text(_metrics_line(4) + "\n" + _metrics_line(3) + "\n")
    (run / "agent-11.process.json").write_text('{"lost": 0}')
    (run / "run.json").write_text("{}")
    sizes = sum(p.stat().st_size for p in run.iterdir())
    assert directory_bytes(run) == (sizes, 6)
    assert directory_bytes(tmp_path / "absent") == (0, 0)

    counted = count_telemetry(run)
    assert counted["spans_by_tag"][tag_b] == 2  # the cut line is not counted
    assert 3 <= counted["spans_by_tag"][tag_a] < 3 + 50  # the truncated gzip: what it holds up to the cut
    assert counted["metric_points"] == 7
    assert counted["bad_lines"] >= 1
    plain_agent = len((run / "agent-11.1.jsonl").read_bytes()) + len(_spans_line([tag_b + "2" * 24] * 2)) + 1
    assert (
        plain_agent
        < counted["plain_bytes"]
        < plain_agent
        + 51 * len(_spans_line([tag_a + "3" * 24]))
        + len((run / "agent-11.metrics.jsonl").read_bytes())
        + 1
    )

    trio = record_trio(run, rollouts=4, label="trio 1")
    assert trio["bytes"] == sizes and trio["rollouts"] == 4
    assert spans_with_tags([trio], [bytes.fromhex(tag_b)]) == 2
    assert spans_with_tags([trio, trio], [bytes.fromhex(tag_b), bytes.fromhex("b34c0503")]) == 4


def test_the_disk_report_gives_bytes_per_completed_rollout_per_trio_and_over_all():
    trios = [
        {
            "trio": "trio 1",
            "bytes": 30_000,
            "files": 5,
            "rollouts": 10,
            "metric_points": 7,
            "bad_lines": 0,
            "plain_bytes": 450_000,
        },
        {
            "trio": "trio 2",
            "bytes": 10_000,
            "files": 4,
            "rollouts": 30,
            "metric_points": 1,
            "bad_lines": 2,
            "plain_bytes": 150_000,
        },
    ]
    lines = disk_report([{"label": "bare"}, {"label": "ours, files", "disk": trios}])
    cells = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:10]] for line in lines if "| ours" in line
    }
    assert cells["trio 1"] == ["5", "30,000", "10", "3,000", "45,000", "7", "0"]
    assert cells["trio 2"] == ["4", "10,000", "30", "333", "5,000", "1", "2"]
    assert cells["all"] == ["9", "40,000", "40", "**1,000**", "**15,000**", "8", "2"]
    assert disk_report([{"label": "bare", "disk": []}]) == []


# ------------------------------------------------------------------ memory over time


def _memory_results() -> dict:
    # 9 samples, 10 s apart: the first quarter ends at t=20 (sample 2)
    times = [10.0 * i for i in range(9)]
    bare_agent = [100, 110, 120, 121, 122, 124, 125, 127, 130]  # MB
    ours_agent = [150, 170, 180, 180, 181, 180, 181, 182, 182]
    samples = [
        {
            "t": t,
            "rss_kb": {
                "bare": {"orchestrator": 50 * 1024, "agent": a * 1024},
                "files": {"orchestrator": 60 * 1024 + 512 * i, "agent": o * 1024},
            },
            "rollouts": {"bare": 1000 * i, "files": 500 * i},
            "policy_kb": 40 * 1024,
        }
        for i, (t, a, o) in enumerate(zip(times, bare_agent, ours_agent))
    ]
    variants = [
        {"key": "bare", "label": "bare", "roles": {"orchestrator": [1], "agent": [2]}, "errors": 0},
        {
            "key": "files",
            "label": "ours, files",
            "roles": {"orchestrator": [3], "agent": [4, 5]},
            "errors": 0,
            "spans_per_rollout": 16.0,
            "disk": [{"trio": "trio 1", "bytes": 8_000_000, "files": 9, "rollouts": 4_000}],
        },
    ]
    return {
        "gym": "0.4.0",
        "concurrency": 32,
        "warmup": 10.0,
        "interval": 10.0,
        "samples": samples,
        "variants": variants,
        "machine": {"nproc": 2, "cpu": "x", "memory_gb": 8, "python_gym": "3.12", "load_avg_at_start": [0, 0, 0]},
    }


def test_memory_over_time_reads_growth_from_the_first_quarter_to_the_end():
    assert quarter_index([0.0, 10.0, 20.0, 30.0, 80.0]) == 2  # the first sample at or after 20 s
    assert quarter_index([5.0, 6.0]) == 1
    results = _memory_results()
    rows = {(r["label"], r["process"]): r for r in memory_rows(results)}
    agent = rows[("bare", "agent")]
    assert (agent["start_mb"], agent["quarter_mb"], agent["end_mb"], agent["peak_mb"]) == (100, 120, 130, 130)
    assert agent["growth_mb"] == 10 and agent["growth_per_10k_mb"] == pytest.approx(10 / 6000 * 1e4)
    assert rows[("ours, files", "agent")]["processes"] == 2
    fleet = rows[("ours, files", FLEET)]
    # orchestrator 60 MB + 0.5 MB a sample: +3 MB from sample 2 to 8; the agent +2 MB
    assert fleet["growth_mb"] == pytest.approx(5.0) and fleet["processes"] == 3 and fleet["rollouts"] == 4000
    assert rows[("bare", FLEET)]["growth_mb"] == pytest.approx(10.0)
    policy = next(r for r in memory_rows(results) if r["process"].startswith("policy model"))
    assert policy["growth_mb"] == 0 and policy["rollouts"] == 12_000

    text = memory_report(results)
    assert "Fleet growth after the first quarter: bare +10.0 MB, ours, files +5.0 MB" in text
    assert "the first quarter ends at the sample of 20 s" in text
    row = next(line for line in text.splitlines() if line.startswith("| ours, files | **fleet"))
    assert [c.strip() for c in row.split("|")[3:11]] == [
        "3",
        "4,000",
        "210.0",
        "241.0",  # 61 + 180
        "246.0",  # 64 + 182
        "246.0",
        "**+5.0**",
        "+16.7",  # 5 MB over the 3,000 rollouts served after the first quarter (1,000 to 4,000)
    ]
    assert "| ours, files | trio 1 | 9 | 8,000,000 | 4,000 | 2,000 |" in text
