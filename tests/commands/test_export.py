"""``gym-autoinstr export`` on synthetic runs whose every number is known: each column of
every format against the spans written, ``--spans`` against the files read back, the
filters, the refusals, the atomic write and the dispatch to ``scores``.

The runs are ``test_view_scale.write_synthetic_run``'s (the embedded exporter's format;
rollout ``i`` starts at ``10 i`` ms and lasts ``100 + 37 i mod 90`` ms, 11 spans, two model
calls of 30 and 25 ms with 201 tokens in and 40 out, a tool of 8 ms, ``/verify`` 5 ms,
every 1000th rollout's tool failing), with what Gym's collection driver adds to a
rollout's root rewritten into its lines (``_grade``): task ``i // 3``, repeat ``i % 3``,
reward ``(task % 5) / 4``, mask on every tenth task, the job id; the model's name on the
model's spans, the agent's on ``gym.rollout``, a failure stage on the failing tool's span."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
from datetime import datetime
from pathlib import Path

import pytest

from gym_autoinstr.commands import cli
from gym_autoinstr.commands.export import columns, formats
from gym_autoinstr.setup.files import read_path
from tests.commands.test_view_scale import BASE_NS, MS, _kv, write_synthetic_run
from tests.commands.view_helpers import _cli

N = 1000  # rollout 999's tool call fails
JOB = "ab" * 16
SERVICES = ["nemo-gym/agent", "nemo-gym/model", "nemo-gym/orchestrator", "nemo-gym/resources"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _grade(run: dict, job: str, renamed: bool = False) -> dict:
    """Rewrite a synthetic run's lines as Gym's driver would have written them (and, when
    ``renamed``, with trace ids of its own, so two runs' traces are not one); returns ``run``
    with its trace ids and each rollout's root span id."""
    rename = (lambda t: hashlib.md5(t.encode()).hexdigest()) if renamed else (lambda t: t)
    roots: dict[str, str] = {}
    for path in sorted(run["dir"].glob("*.jsonl")):
        lines = []
        for line in path.read_text().splitlines():
            request = json.loads(line)
            for resource_spans in request["resourceSpans"]:
                for scope_spans in resource_spans["scopeSpans"]:
                    for span in scope_spans["spans"]:
                        _grade_span(span, job, roots)
                        span["traceId"] = rename(span["traceId"])
                        for link in span.get("links", ()):
                            link["traceId"] = rename(link["traceId"])
            lines.append(json.dumps(request, separators=(",", ":")))
        path.write_text("\n".join(lines) + "\n")
    rollouts = [rename(t) for t in run["rollouts"]]
    return {**run, "rollouts": rollouts, "roots": [roots[t] for t in run["rollouts"]], "job_id": job}


def _grade_span(span: dict, job: str, roots: dict[str, str]) -> None:
    attributes = {kv["key"]: kv for kv in span.get("attributes", ())}
    rollout_id = attributes.get("nemo.gym.rollout.id", {}).get("value", {}).get("stringValue")
    added: dict = {}
    if span["name"] == "gym.job":
        added["nemo.gym.job.id"] = job
    elif rollout_id and not span.get("parentSpanId"):  # the driver's CLIENT POST /run: the root
        task, repeat = divmod(int(rollout_id.split("-")[1]), 3)
        added = {
            "nemo.gym.job.id": job,
            "nemo.gym.task.index": task,
            "nemo.gym.rollout.index": repeat,
            "nemo.gym.reward": (task % 5) / 4,
            "nemo.gym.mask_sample": task % 10 == 7,
        }
        roots[span["traceId"]] = span["spanId"]
    elif span["name"] == "POST /v1/responses":
        added["gen_ai.request.model"] = "policy-x"
    elif span["name"] == "gym.rollout":
        added["gen_ai.agent.name"] = "simple_agent"
    elif "error.type" in attributes:
        added["nemo.gym.failure.stage"] = "tool"
    for key in added:
        attributes.pop(key, None)
    span["attributes"] = [*attributes.values(), *_kv(added)]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    return _grade(write_synthetic_run(tmp_path_factory.mktemp("export") / "run", N), JOB)


def _expected(run: dict, i: int) -> dict:
    """Rollout ``i``'s row, from how the synthetic run was written."""
    task, repeat = divmod(i, 3)
    failed = i % 1000 == 999
    return {
        "trace_id": run["rollouts"][i],
        "run": str(run["dir"]),
        "job_id": run["job_id"],
        "task_index": task,
        "rollout_index": repeat,
        "reward": (task % 5) / 4,
        "mask_sample": task % 10 == 7,
        "failed": failed,
        "error_type": "TimeoutError" if failed else None,
        "failure_stage": "tool" if failed else None,
        "input_tokens": 201,
        "output_tokens": 40,
        "duration_ms": float(100 + (i * 37) % 90),
        "model_ms": 55.0,
        "tools_ms": 8.0,
        "verify_ms": 5.0,
        "start": BASE_NS + i * 10 * MS,
        "start_ns": BASE_NS + i * 10 * MS,
        "span_count": 11,
        "services": SERVICES,
        "rollout_id": f"0-{i}",
        "root_span_id": run["roots"][i],
        "root_name": "POST /run",
        "trace_kind": "rollout",
        "request_model": "policy-x",
        "agent_name": "simple_agent",
        "gym_run_id": "synthetic-16k",
    }


def _ns(text: str) -> int:
    """An ISO time written by export, as nanoseconds (it is to the microsecond)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (int(moment.timestamp()) * 1_000_000 + moment.microsecond) * 1000


def _typed(value: str, kind: str):
    if value == "":
        return None
    return {
        "int": int,
        "float": float,
        "bool": {"true": True, "false": False}.__getitem__,
        "list": lambda text: text.split(";"),
        "timestamp": _ns,
    }.get(kind, str)(value)


def read_rows(path: Path, table=columns.ROLLOUT_COLUMNS) -> list[dict]:
    """An exported file's rows, each value as Python has it (times as nanoseconds)."""
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        read = pq.read_table(path)
        starts = read.column("start").cast(pa.int64()).to_pylist()
        rows = read.drop_columns(["start"]).to_pylist()
        return [{**row, "start": start} for row, start in zip(rows, starts)]
    opened = gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8")
    with opened as handle:
        if ".csv" in name:
            reader = csv.DictReader(handle)
            assert reader.fieldnames == [c.name for c in table]
            kinds = {c.name: c.kind for c in table}
            return [{key: _typed(value, kinds[key]) for key, value in row.items()} for row in reader]
        rows = [json.loads(line) for line in handle]
    for row in rows:
        assert list(row) == [c.name for c in table]
        row["start"] = _ns(row["start"])
    return rows


def _export(*args: str) -> int:
    return cli.main(["export", *args])


FORMAT_FILES = ["rollouts.parquet", "rollouts.csv", "rollouts.jsonl", "rollouts.csv.gz", "rollouts.jsonl.gz"]


@pytest.mark.parametrize("name", FORMAT_FILES)
def test_every_column_of_every_rollout_in_each_format(graded, tmp_path, capsys, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    out = tmp_path / name
    assert _export(str(graded["dir"]), "--to", str(out)) == 0
    assert capsys.readouterr().out.startswith(f"wrote {N} rollouts to {out} (")
    rows = read_rows(out)
    assert len(rows) == N
    for i, row in enumerate(rows):  # in start order: rollout i is row i
        assert row == _expected(graded, i), i
    assert [p.name for p in tmp_path.iterdir() if p.name != "cache"] == [name]  # no temporary file left


def test_all_traces_adds_the_start_up_and_job_traces(graded, tmp_path):
    out = tmp_path / "all.jsonl"
    assert _export(str(graded["dir"]), "--all-traces", "--to", str(out)) == 0
    rows = read_rows(out)
    assert len(rows) == N + 2
    kinds = {row["trace_id"]: row["trace_kind"] for row in rows}
    assert kinds[graded["startup"]] == "startup" and kinds[graded["job"]] == "job"
    job = next(row for row in rows if row["trace_kind"] == "job")
    assert job["job_id"] == JOB and job["root_name"] == "gym.job" and job["reward"] is None
    startup = next(row for row in rows if row["trace_kind"] == "startup")
    assert startup["span_count"] == 4 and startup["duration_ms"] == 16_000.0 and startup["job_id"] is None


def test_where_chooses_the_rows_view_would(graded, tmp_path):
    out = tmp_path / "slow-zero.csv"
    assert _export(str(graded["dir"]), "--where", "reward==0", "--where", "duration >= 170ms", "--to", str(out)) == 0
    wanted = [i for i in range(N) if (i // 3) % 5 == 0 and 100 + (i * 37) % 90 >= 170]
    assert 10 < len(wanted) < N // 5
    assert [row["trace_id"] for row in read_rows(out)] == [graded["rollouts"][i] for i in wanted]


def test_spans_every_span_of_the_rollouts(graded, tmp_path, capsys):
    """A row per span, as the files hold it; and its trace's run, job, task and repeat."""
    index = {trace_id: i for i, trace_id in enumerate(graded["rollouts"])}
    spans = [s for s in read_path(graded["dir"]) if s["trace_id"] in index]
    assert len(spans) == N * 11
    names = ["spans.csv", "spans.jsonl"] + (["spans.parquet"] if formats.parquet_missing() is None else [])
    for name in names:
        out = tmp_path / name
        assert _export(str(graded["dir"]), "--spans", "--to", str(out)) == 0
        assert capsys.readouterr().out.startswith(f"wrote {N * 11} spans of {N} rollouts to {out} (")
        rows = read_rows(out, columns.SPAN_COLUMNS)
        assert len(rows) == len(spans)
        by_id = {row["span_id"]: row for row in rows}
        for span in spans:
            row = by_id[span["span_id"]]
            i = index[span["trace_id"]]
            assert json.loads(row["attributes"]) == span["attributes"]
            assert row == {
                "trace_id": span["trace_id"],
                "span_id": span["span_id"],
                "parent_span_id": span["parent_span_id"],
                "name": span["name"],
                "kind": span["kind"],
                "service": span["resource"]["service.name"],
                "start": span["start_ns"],
                "start_ns": span["start_ns"],
                "end_ns": span["end_ns"],
                "duration_ms": (span["end_ns"] - span["start_ns"]) / 1e6,
                "status": span["status"],
                "attributes": row["attributes"],
                "run": str(graded["dir"]),
                "job_id": JOB,
                "task_index": i // 3,
                "rollout_index": i % 3,
            }, name
        errors = [row for row in rows if row["status"] == "ERROR"]
        assert [(r["name"], index[r["trace_id"]]) for r in errors] == [("POST /get_weather", 999)]


def test_spans_of_a_few_rollouts_and_their_count(graded, tmp_path, capsys):
    out = tmp_path / "few.jsonl"
    assert _export(str(graded["dir"]), "--spans", "--where", "task==5", "--to", str(out)) == 0
    assert capsys.readouterr().out.startswith(f"wrote 33 spans of 3 rollouts to {out} (")
    rows = read_rows(out, columns.SPAN_COLUMNS)
    assert sorted({row["trace_id"] for row in rows}) == sorted(graded["rollouts"][15:18])
    assert sum(row["parent_span_id"] is None for row in rows) == 3  # each trace's root


def test_parquet_is_written_in_row_groups(graded, tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(formats, "ROW_GROUP", 128)
    out = tmp_path / "groups.parquet"
    assert _export(str(graded["dir"]), "--to", str(out)) == 0
    metadata = pq.ParquetFile(out).metadata
    assert metadata.num_rows == N and metadata.num_row_groups == math.ceil(N / 128)


def _two_runs(tmp_path) -> tuple[Path, dict, dict]:
    campaign = tmp_path / "campaign"
    a = _grade(write_synthetic_run(campaign / "run-a", 30), "a1" * 16)
    b = _grade(write_synthetic_run(campaign / "run-b", 30), "b2" * 16, renamed=True)
    return campaign, a, b


def test_a_campaign_folder_and_job_selection(tmp_path, capsys):
    campaign, a, b = _two_runs(tmp_path)
    out = tmp_path / "both.jsonl"
    assert _export(str(campaign), "--to", str(out)) == 0
    rows = read_rows(out)
    assert sorted((row["run"], row["job_id"]) for row in rows) == sorted(
        [("run-a", a["job_id"])] * 30 + [("run-b", b["job_id"])] * 30
    )
    only_b = tmp_path / "b.csv"
    assert _export(str(campaign), "--job", "b2b2", "--to", str(only_b)) == 0
    assert [row["trace_id"] for row in read_rows(only_b)] == b["rollouts"]
    assert _export(str(campaign), "--job", "c3", "--to", str(tmp_path / "none.csv")) == 2
    err = capsys.readouterr().err
    assert f"gym-autoinstr export: --job c3: no such job in the runs given; the jobs here: {a['job_id']}, " in err
    assert not (tmp_path / "none.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--to", "{tmp}/out.xlsx"],
            "--to {tmp}/out.xlsx: the file's name says no format; end it with one of .parquet",
        ),
        (["--to", "{tmp}/nowhere/out.csv"], "no directory {tmp}/nowhere to write it in; create it first (mkdir -p"),
        (["--to", "{tmp}"], "--to {tmp}: is a directory; give a file name in it"),
        (["--where", "reward<", "--to", "{tmp}/x.csv"], "--where 'reward<': no number after '<'"),
        (["--where", "speed>1", "--to", "{tmp}/x.csv"], "--where 'speed>1': unknown field 'speed'"),
        (["--spans", "--to", "phoenix"], "--to phoenix sends rollouts' rewards as scores; --spans writes a file"),
    ],
)
def test_bad_input_is_refused_with_the_fix(graded, tmp_path, capsys, args, message):
    args = [arg.format(tmp=tmp_path) for arg in args]
    assert _export(str(graded["dir"]), *args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gym-autoinstr export: ") and message.format(tmp=tmp_path) in captured.err


def test_a_missing_run_and_an_empty_choice(graded, tmp_path, capsys):
    assert _export(str(tmp_path / "absent"), "--to", str(tmp_path / "x.csv")) == 2
    assert f"gym-autoinstr export: {tmp_path / 'absent'}: no such file or directory" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("no run here\n")
    assert _export(str(tmp_path), "--to", str(tmp_path / "x.csv")) == 1
    said = f"gym-autoinstr export: no traces found: no span files (*.jsonl, *.jsonl.gz) in {tmp_path}. Is it a run"
    assert capsys.readouterr().err.startswith(said)
    assert _export(str(graded["dir"]), "--where", "reward>1", "--to", str(tmp_path / "x.csv")) == 1
    assert "no rollouts matching the filters among the 1002 traces read; nothing written" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_an_existing_file_is_replaced_only_when_asked(graded, tmp_path, capsys):
    out = tmp_path / "kept.csv"
    out.write_text("someone's table\n")
    assert _export(str(graded["dir"]), "--to", str(out)) == 2
    assert "--to " + str(out) + ": exists; give --force to replace it" in capsys.readouterr().err
    assert out.read_text() == "someone's table\n"
    assert _export(str(graded["dir"]), "--where", "task==0", "--force", "--to", str(out)) == 0
    assert [row["task_index"] for row in read_rows(out)] == [0, 0, 0]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    out = tmp_path / "old.jsonl"
    out.write_text("old\n")

    def records():
        yield (None,) * len(columns.SPAN_COLUMNS)
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        formats.write(out, columns.SPAN_COLUMNS, records())
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["old.jsonl"]


def test_parquet_without_pyarrow_says_how_to_get_it(graded, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    assert _export(str(graded["dir"]), "--to", str(tmp_path / "r.parquet")) == 2
    err = capsys.readouterr().err
    assert "writing Parquet needs pyarrow" in err and "pip install pyarrow" in err and ".csv or .jsonl" in err


def test_phoenix_and_mlflow_go_to_scores(graded, tmp_path, capsys, monkeypatch):
    import sys
    import types

    from gym_autoinstr.commands import export

    sent = []
    fake = types.ModuleType("gym_autoinstr.commands.export.scores")
    fake.send = lambda target, address, rollouts: sent.append((target, address, rollouts)) or 0
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(export, "scores", fake, raising=False)
    assert _export(str(graded["dir"]), "--where", "task==1", "--to", "phoenix") == 0
    assert _export(str(graded["dir"]), "--to", "mlflow=http://127.0.0.1:5000", "--job", JOB[:6]) == 0
    assert [(target, address, len(rollouts)) for target, address, rollouts in sent] == [
        ("phoenix", None, 3),
        ("mlflow", "http://127.0.0.1:5000", N),
    ]
    assert [r.trace_id for r in sent[0][2]] == graded["rollouts"][3:6]


def test_the_command_as_a_user_runs_it(graded, tmp_path):
    help_text = _cli("export", "--help", columns=200).stdout
    assert "--to FILE|UI" in help_text and "--spans" in help_text and "slow at scale" in help_text
    out = tmp_path / "cli.jsonl"
    result = _cli(
        "export", str(graded["dir"]), "--where", "reward>=1", "--to", str(out), env={"XDG_CACHE_HOME": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    rows = read_rows(out)
    assert len(rows) == sum((i // 3) % 5 == 4 for i in range(N)) == 198
    assert {row["reward"] for row in rows} == {1.0}


def test_the_docs_list_every_column_with_its_kind():
    """docs/export.md's two tables: the columns written, in order, with their kinds."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    tables, rows = [], None
    for line in text.splitlines():
        if line.startswith("| column | kind | what |"):
            rows = []
            tables.append(rows)
        elif line.startswith("|") and rows is not None and not line.startswith("|---"):
            name, kind = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:2])
            rows.append((name, kind))
        elif not line.startswith("|"):
            rows = None
    assert tables == [
        [(c.name, c.kind) for c in columns.ROLLOUT_COLUMNS],
        [(c.name, c.kind) for c in columns.SPAN_COLUMNS],
    ]


def test_a_directory_that_cannot_be_written_is_said(graded, tmp_path, capsys, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(formats, "_csv", no_space)
    out = tmp_path / "full.csv"
    assert _export(str(graded["dir"]), "--to", str(out)) == 1
    said = f"gym-autoinstr export: --to {out}: No space left on device; nothing written: give a file you can write"
    assert said in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir() if p.name != "cache"] == []
