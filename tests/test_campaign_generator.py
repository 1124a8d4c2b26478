"""``./run-benchmarks --campaign``'s generator (benchmarks/campaign.py) on a small seed run
directory written here: copies with new ids, read back by the project's reader, their facts
files covering their segments and saying what their spans say; and a command the CLI does
not have reported "not available".  No Gym is started."""

from __future__ import annotations

import gzip
import json
import os
import pathlib

from benchmarks import campaign as c
from gym_autoinstr.commands.runs import store
from gym_autoinstr.fastpath import span_facts
from gym_autoinstr.setup.files import read_path, span_segments
from gym_autoinstr.setup.segments import segment_key

RUN_ID, JOB_ID = "6755ac59f48a4709", "45d86a7cad934afd8d690ec161e2d2f3"


def _facts(service: str, spans: list[dict]) -> str:
    """The facts of ``spans`` (one batch), as the embedded writer writes them."""
    resource = {"service.name": service, "nemo.gym.run.id": RUN_ID}
    listed = []
    for s in spans:
        root = not s["parentSpanId"]
        kept = [kv for kv in s["attributes"] if kv["key"] in (span_facts.ROOT_KEYS if root else span_facts.KEYS)]
        links = [[link["traceId"], link["spanId"]] for link in s["links"]]
        start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
        flags = (2 if root else 0) | (s["kind"] << 2)
        # every span here is its process's first of its trace (a child's parent is in the other
        # process): the writer names it (and gives its span id) for a reader whose root is elsewhere
        name, span_id = s["name"], s["spanId"]
        listed.append([s["traceId"], start, end, flags, 0, name, span_id, kept or 0, links or 0])
    return json.dumps({"resource": resource, "spans": listed}, separators=(",", ":"))


def _line(service: str, instance: str, spans: list[dict]) -> str:
    resource = [
        {"key": "service.name", "value": {"stringValue": service}},
        {"key": "service.instance.id", "value": {"stringValue": instance}},
        {"key": "nemo.gym.run.id", "value": {"stringValue": RUN_ID}},
    ]
    return json.dumps(
        {
            "resourceSpans": [
                {"resource": {"attributes": resource}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}
            ]
        },
        separators=(",", ":"),
    )


def _span(trace: str, span: str, name: str, parent: str = "", links=(), **attributes) -> dict:
    return {
        "traceId": trace,
        "spanId": span,
        "parentSpanId": parent,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [{"key": k.replace("_", "."), "value": {"intValue": str(v)}} for k, v in attributes.items()],
        "links": [{"traceId": t, "spanId": s} for t, s in links],
    }


def _seed_run(directory: pathlib.Path, rollouts: int, gap: int | None = None) -> None:
    """A collection process (the job span, a root per rollout linked to it) and an agent (a
    child span per rollout), as the embedded writer lays them out, facts files and all (but
    for the agent's line ``gap``: its facts not written)."""
    directory.mkdir(parents=True)
    job_trace = f"{1:032x}"
    job = _span(job_trace, "a" * 16, "gym.job")
    job["attributes"].append({"key": "nemo.gym.job.id", "value": {"stringValue": JOB_ID}})
    roots = [
        _span(f"{i + 2:032x}", f"{i + 1:016x}", "POST /run", links=[(job_trace, "a" * 16)], nemo_gym_task_index=i)
        for i in range(rollouts)
    ]
    children = [
        _span(f"{i + 2:032x}", f"{i + 100:016x}", "gym.rollout", parent=f"{i + 1:016x}") for i in range(rollouts)
    ]
    for stem, pid, instance, spans in (("collect", 11, "c" * 32, [job, *roots]), ("agent", 22, "d" * 32, children)):
        text, facts = "", ""
        for number, span in enumerate(spans):
            line = _line(f"nemo-gym/{stem}", instance, [span]) + "\n"
            if not (stem == "agent" and number == gap):  # (as SegmentWriter._write_facts)
                groups = _facts(f"nemo-gym/{stem}", [span])
                facts += f'{{"from":{len(text)},"at":{len(text) + len(line)},"groups":[{groups}]}}\n'
            text += line
        (directory / f"nemo-gym_{stem}-{pid}.0001.jsonl.gz").write_bytes(gzip.compress(text.encode()))
        (directory / f"nemo-gym_{stem}-{pid}.0001.facts").write_text(facts)
    for stem, pid in (("nemo-gym_collect", 11), ("nemo-gym_agent", 22)):
        note = {
            "service": stem,
            "pid": pid,
            "final": True,
            "spans": {"ended": 3, "written": 3, "queued": 0},
            "lost": [],
        }
        (directory / f"{stem}-{pid}.process.json").write_text(json.dumps(note))
    (directory / "run.json").write_text(json.dumps({"run_id": RUN_ID, "pid": 22}))
    (directory / f"job-{JOB_ID}.json").write_text(json.dumps({"job_id": JOB_ID, "expected": rollouts, "pid": 11}))


def test_a_campaign_is_the_seed_copied_with_new_ids_links_kept_within_each_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(c, "CACHE", tmp_path)
    monkeypatch.setattr(c, "SEED", tmp_path / "campaign-seed")
    monkeypatch.setattr(c, "TASKS", 2)
    monkeypatch.setattr(c, "REPEATS", 2)
    _seed_run(c.SEED / "run", rollouts=4)
    seed = c.describe_seed(c.SEED / "run")
    assert (seed["traces"], seed["rollouts"], seed["spans"]) == (5, 4, 9)

    info = c.campaign(size=35, runs=2, seed=seed, level=1, workers=2)  # 7 copies: 4 and 3
    folder = tmp_path / "campaign-35"
    assert info["copies"] == 7 and info["traces"] == 35 and info["verified"]["traces"] == 35
    spans = read_path(folder)
    traces = {s["trace_id"] for s in spans}
    assert len(traces) == 35 and not traces & {s["trace_id"] for s in read_path(c.SEED / "run")}
    jobs = {s["attributes"]["nemo.gym.job.id"]: s["trace_id"] for s in spans if s["name"] == "gym.job"}
    assert len(jobs) == 7 and JOB_ID not in jobs
    for root in (s for s in spans if s["name"] == "POST /run"):  # each rollout linked to its own copy's job
        (link,) = root["links"]
        assert link["trace_id"] in jobs.values()
    assert len({link["trace_id"] for s in spans for link in s["links"]}) == 7
    for run, copies in (("run-00", 3), ("run-01", 4)):
        directory = folder / run
        pid = 200000 + 1000 * int(run[-1])  # (a pid per seed process and run directory)
        names = [p.name for p in span_segments(directory)]  # named as the writer names them
        assert names == [f"nemo-gym_agent-{pid}.0001.jsonl.gz", f"nemo-gym_collect-{pid + 1}.0001.jsonl.gz"]
        assert [segment_key(directory / n) for n in names] == [
            (f"nemo-gym_agent-{pid}.jsonl", 1),
            (f"nemo-gym_collect-{pid + 1}.jsonl", 1),
        ]
        run_spans = read_path(directory)
        assert len({s["resource"]["service.instance.id"] for s in run_spans}) == 2  # one per process, as one fleet's
        assert len({s["resource"]["nemo.gym.run.id"] for s in run_spans}) == 1
        assert len(list(directory.glob("job-*.json"))) == copies
        note = json.loads(next(directory.glob("nemo-gym_collect-*.process.json")).read_text())
        assert note["spans"]["ended"] == 3 * copies
    run_ids = {json.loads((folder / r / "run.json").read_text())["run_id"] for r in ("run-00", "run-01")}
    assert len(run_ids) == 2 and RUN_ID not in run_ids
    assert c.campaign(size=35, runs=2, seed=seed, level=1, workers=2)["generated_s"] == info["generated_s"]  # cached
    # each segment's facts cover it (the reader takes them, not the spans) and say what its spans say
    assert (info["segments"], info["segments_without_facts"]) == (4, 0)
    assert info["verified"]["facts_cover"] == info["verified"]["facts_checked"] == 4
    segments = span_segments(folder)
    assert len(segments) == 4 and all(c.facts_cover(p) for p in segments)
    for path in segments:
        from_facts, from_spans = c.facts_agree([path])
        assert from_facts == from_spans and len(from_spans) in (4 * 3, 5 * 3, 4 * 4, 5 * 4)


def _same_facts(segment: pathlib.Path) -> bool:
    from_facts, from_spans = c.facts_agree([segment])
    return from_facts == from_spans and bool(from_spans)


def test_facts_follow_their_lines_into_new_segments_and_a_seed_gap_is_left_a_gap(tmp_path, monkeypatch):
    monkeypatch.setattr(c, "CACHE", tmp_path)
    monkeypatch.setattr(c, "SEED", tmp_path / "campaign-seed")
    monkeypatch.setattr(c, "TASKS", 2)
    monkeypatch.setattr(c, "REPEATS", 2)
    _seed_run(c.SEED / "run", rollouts=4, gap=2)  # the agent's third line has no facts
    assert c._has_facts(c.SEED / "run")
    seed = c.describe_seed(c.SEED / "run")
    line = max(len(x) for p in span_segments(c.SEED / "run") for x in c._plain(p).splitlines(keepends=True))
    monkeypatch.setattr(c, "SEGMENT_BYTES", 3 * line)  # 2 or 3 lines a segment: offsets other than the seed's

    info = c.campaign(size=15, runs=1, seed=seed, level=1, workers=2)  # 3 copies, one run directory
    segments = span_segments(tmp_path / "campaign-15" / "run-00")
    agent = [p for p in segments if "agent" in p.name]
    collect = [p for p in segments if "collect" in p.name]
    assert len(agent) >= 4 and len(collect) >= 5 and info["segments"] == len(segments)
    assert all(c.facts_cover(p) for p in collect)  # re-packed: new offsets, still from 0 to the end
    froms = [r["from"] for p in collect for r in store._facts_records(store._facts_file(p))]
    assert froms.count(0) == len(collect) and len(froms) == 3 * 5
    lacking = [p for p in agent if not c.facts_cover(p)]  # those holding a copy of the line without
    assert len(lacking) == 3 == info["segments_without_facts"] == len(segments) - info["verified"]["facts_cover"]
    assert sum(len(store._facts_records(store._facts_file(p))) for p in agent) == 9
    assert all(_same_facts(p) for p in segments)  # (a gap: the reader reads the spans)
    assert len(read_path(tmp_path / "campaign-15")) == 3 * 9

    (c.SEED / "run" / "nemo-gym_agent-22.0001.facts").unlink()  # a seed made before facts: made again
    assert not c._has_facts(c.SEED / "run")


def test_a_command_the_cli_does_not_have_is_reported_not_available(tmp_path):
    env = dict(os.environ)
    got = c.timed(["no-such-command", "x"], env, timeout=60, cap_bytes=2**34, out_dir=tmp_path)
    assert got["outcome"] == "not available" and got["peak_mb"] > 0
    ok = c.timed(["--version"], env, timeout=60, cap_bytes=2**34, out_dir=tmp_path)
    assert ok["outcome"] == "ok" and ok["stdout_lines"] == 1 and ok["seconds"] > 0
    failed = c.timed(["view", str(tmp_path / "none"), "--trace", "f" * 32], env, 60, 2**34, tmp_path)
    assert failed["outcome"].startswith("failed (exit ")
