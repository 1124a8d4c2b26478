"""``gym-autoinstr view`` on a 16k-rollout run directory: the list, one trace, the page, a
closed pipe.

The run is synthetic but in the embedded file exporter's own format (``setup/files.py``:
one ``<stem>-<pid>.jsonl`` per process, one OTLP-JSON ``ExportTraceServiceRequest`` per
line, hex ids, kinds as integers, times as strings), checked against what the real
exporter writes by ``test_synthetic_lines_read_back_like_the_exporters``.  Each rollout is
its own trace linked to the job's ``gym.job`` span, as Gym's collection driver makes them:
the orchestrator's CLIENT span, the agent's ``POST /run`` and ``gym.rollout``, two model
calls, a tool call and ``/verify`` (11 spans); every 1000th rollout's tool call fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gym_autoinstr.commands.view.page import DEFAULT_MAX_DETAIL
from gym_autoinstr.setup.files import OtlpJsonFileExporter, read_path
from tests.commands.view_helpers import _cli, _command, _dom, _text_blocks

N_ROLLOUTS = 16_000
BASE_NS = 1_760_000_000_000_000_000
MS = 1_000_000
PORTS = {"agent": 9001, "model": 9002, "resources": 9003}
SERVER_TYPES = {
    "orchestrator": "orchestrator",
    "agent": "responses_api_agents",
    "model": "responses_api_models",
    "resources": "resources_servers",
}


def _value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _kv(attributes: dict) -> list[dict]:
    return [{"key": k, "value": _value(v)} for k, v in attributes.items()]


class _Process:
    """One process's file: spans buffered, one line per batch of ``batch`` spans."""

    def __init__(self, directory: Path, role: str, pid: int, batch: int = 512, name: str | None = None) -> None:
        name = name or role
        self.path = directory / f"{name}-{pid}.jsonl"
        self.resource = _kv(
            {
                "telemetry.sdk.language": "python",
                "service.name": f"nemo-gym/{name}",
                "nemo.gym.server.name": name,
                "nemo.gym.server.type": SERVER_TYPES[role],
                "nemo.gym.run.id": "synthetic-16k",
            }
        )
        self.batch, self.pending, self.handle = batch, [], open(self.path, "w", encoding="utf-8")

    def span(self, trace_id, span_id, parent, name, kind, start_ms, end_ms, attributes=None, error=False, links=()):
        span = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": name,
            "kind": kind,
            "startTimeUnixNano": str(BASE_NS + int(start_ms * MS)),
            "endTimeUnixNano": str(BASE_NS + int(end_ms * MS)),
            "status": {"code": 2} if error else {},
            "flags": 256,
        }
        if parent:
            span["parentSpanId"] = parent
        if attributes:
            span["attributes"] = _kv(attributes)
        if links:
            span["links"] = [{"traceId": t, "spanId": s, "flags": 256} for t, s in links]
        self.pending.append(span)
        if len(self.pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            request = {
                "resourceSpans": [
                    {
                        "resource": {"attributes": self.resource},
                        "scopeSpans": [{"scope": {"name": "gym_autoinstr"}, "spans": self.pending}],
                    }
                ]
            }
            self.handle.write(json.dumps(request, separators=(",", ":")) + "\n")
            self.pending = []

    def close(self) -> None:
        self.flush()
        self.handle.close()


def write_synthetic_run(directory: Path, rollouts: int, names: dict[str, str] | None = None) -> dict:
    """``names``: the servers' names by role (``agent``, ``model``, ``resources``; default
    the role's own name)."""
    directory.mkdir(parents=True)
    names = {role: (names or {}).get(role, role) for role in SERVER_TYPES}
    procs = {role: _Process(directory, role, 100 + i, name=names[role]) for i, role in enumerate(SERVER_TYPES)}
    counter = iter(range(1, 1 << 62))

    def sid() -> str:
        return format(next(counter), "016x")

    # the orchestrator's start-up (its own trace: each server's span from that server), then
    # the job (its own trace)
    startup_trace = "5" * 32
    startup = sid()
    procs["orchestrator"].span(startup_trace, startup, None, "gym.startup", 1, -16_000, 0)
    for server in ("agent", "model", "resources"):
        procs[server].span(startup_trace, sid(), startup, "gym.server.startup", 1, -15_000, -1_000)
    job_trace, job_span = "a" * 32, sid()
    rollout_traces = []
    for index in range(rollouts):
        trace_id = format((index + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128), "032x")  # spread
        rollout_traces.append(trace_id)
        rid = f"0-{index}"
        t0 = index * 10.0  # 16 concurrent rollouts of ~160 ms
        took = 100 + (index * 37) % 90
        client = sid()
        procs["orchestrator"].span(
            trace_id,
            client,
            None,
            "POST /run",
            3,
            t0,
            t0 + took,
            {
                "http.request.method": "POST",
                "url.full": f"http://127.0.0.1:{PORTS['agent']}/run",
                "nemo.gym.http.destination.server.name": names["agent"],
                "nemo.gym.http.destination.route": "/run",
                "nemo.gym.rollout.id": rid,
                "http.response.status_code": 200,
            },
            links=[(job_trace, job_span)],
        )
        run = sid()
        procs["agent"].span(
            trace_id,
            run,
            client,
            "POST /run",
            2,
            t0 + 1,
            t0 + took - 1,
            {"http.route": "/run", "nemo.gym.rollout.id": rid},
        )
        seam = sid()
        procs["agent"].span(trace_id, seam, run, "gym.rollout", 1, t0 + 2, t0 + took - 2, {"nemo.gym.rollout.id": rid})
        at = t0 + 3
        calls = [("model", "/v1/responses", 30), ("model", "/v1/responses", 25), ("resources", "/get_weather", 8)]
        calls.append(("resources", "/verify", 5))
        for number, (callee, route, duration) in enumerate(calls):
            fails = route == "/get_weather" and index % 1000 == 999
            call = sid()
            procs["agent"].span(
                trace_id,
                call,
                seam,
                f"POST /ng-rollout/{{rollout_id}}{route}",
                3,
                at,
                at + duration + 2,
                {
                    "http.request.method": "POST",
                    "url.full": f"http://127.0.0.1:{PORTS[callee]}/ng-rollout/{rid}{route}",
                    "nemo.gym.http.destination.server.name": names[callee],
                    "nemo.gym.http.destination.route": route,
                    "nemo.gym.rollout.id": rid,
                    "http.response.status_code": 500 if fails else 200,
                },
            )
            attributes = {"http.route": route, "nemo.gym.rollout.id": rid}
            if callee == "model":
                attributes.update({"gen_ai.usage.input_tokens": 100 + number, "gen_ai.usage.output_tokens": 20})
            if fails:
                attributes["error.type"] = "TimeoutError"
            procs[callee].span(trace_id, sid(), call, f"POST {route}", 2, at + 1, at + 1 + duration, attributes, fails)
            at += duration + 4
    procs["orchestrator"].span(
        job_trace,
        job_span,
        None,
        "gym.job",
        1,
        0,
        rollouts * 10.0 + 200,
        {"nemo.gym.job.id": "j" * 32, "nemo.gym.job.rollouts.sent": rollouts, "nemo.gym.job.rollouts.failed": 0},
    )
    for process in procs.values():
        process.close()
    return {"dir": directory, "rollouts": rollout_traces, "startup": startup_trace, "job": job_trace}


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> dict:
    return write_synthetic_run(tmp_path_factory.mktemp("scale") / "run", N_ROLLOUTS)


def _timed(*args: str, columns: int = 160) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    result = _cli(*args, columns=columns)
    return result, time.perf_counter() - started


def test_synthetic_lines_read_back_like_the_exporters(tmp_path):
    """The synthetic file reads back to the same span dict as the real exporter's file."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    attributes = {"http.route": "/run", "http.response.status_code": 200}
    provider = TracerProvider(resource=Resource.create({"service.name": "nemo-gym/agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(tmp_path / "real", "agent")))
    span = provider.get_tracer("gym_autoinstr").start_span(
        "POST /run", kind=SpanKind.SERVER, start_time=BASE_NS, attributes=attributes
    )
    span.end(end_time=BASE_NS + 5 * MS)
    (real,) = read_path(tmp_path / "real")
    fake = _Process(tmp_path, "agent", 1)
    fake.span(real["trace_id"], real["span_id"], None, "POST /run", 2, 0, 5, attributes)
    fake.close()
    (synthetic,) = read_path(fake.path)
    for key in ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status", "attributes"):
        assert synthetic[key] == real[key], key
    assert synthetic["scope"] == real["scope"] and synthetic["resource"]["service.name"] == "nemo-gym/agent"


def test_a_16k_rollout_run_lists_in_one_line_per_trace(big_run, capsys):
    result, took = _timed("view", str(big_run["dir"]))
    with capsys.disabled():
        print(f"\n[view list of {N_ROLLOUTS} rollouts: {took:.1f} s]")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert all(len(line) <= 160 for line in lines)
    assert lines[0].split()[:3] == ["start", "(UTC)", "trace"]
    assert lines[1].startswith("job " + "j" * 32)
    prefixes = {t[:12] for t in big_run["rollouts"]}
    rollout_lines = [line for line in lines if re.match(r"\d\d:\d\d:\d\d\.\d{3}  ", line) and line[14:26] in prefixes]
    assert len(rollout_lines) == N_ROLLOUTS
    # in start order, each with its id prefix, duration, span count, status, rollout id, tokens, callee
    for index in (0, 999, 15_999):
        fields = rollout_lines[index].split()
        assert fields[1] == big_run["rollouts"][index][:12]
        assert fields[4] == "11" and fields[5] == ("ERROR" if index % 1000 == 999 else "ok")
        assert fields[6] == f"0-{index}" and fields[7] == "201/40"
        assert "POST → agent /run" in rollout_lines[index]
    # the start-up trace: listed apart, after the rollouts
    at = lines.index("start-up traces (processes starting, not rollouts): 1")
    assert at > lines.index(rollout_lines[-1])
    assert lines[at + 2].split()[1] == big_run["startup"][:12] and "gym.startup" in lines[at + 2]


def test_a_16k_rollout_run_filters_and_one_trace(big_run):
    directory = str(big_run["dir"])
    errors, _ = _timed("view", directory, "--status", "error")
    assert errors.returncode == 0, errors.stderr
    failed = [line for line in errors.stdout.splitlines() if " ERROR " in line]
    assert [line.split()[6] for line in failed] == [f"0-{i}" for i in range(999, N_ROLLOUTS, 1000)]
    slowest, _ = _timed("view", directory, "--slowest", "3", "--json")
    records = json.loads(slowest.stdout)["traces"]
    assert [r["duration_ms"] for r in records] == sorted((r["duration_ms"] for r in records), reverse=True)
    assert len(records) == 3 and records[0]["duration_ms"] >= 188
    # a prefix of several ids: the candidates, nothing drawn
    prefix = big_run["rollouts"][0][:1]
    ambiguous, _ = _timed("view", directory, "--trace", prefix)
    many = sum(t.startswith(prefix) for t in big_run["rollouts"] + [big_run["job"], big_run["startup"]])
    assert ambiguous.returncode == 1 and ambiguous.stdout == ""
    assert f"--trace {prefix} matches {many} traces; give more of the id" in ambiguous.stderr
    assert big_run["rollouts"][0] in ambiguous.stderr and f"and {many - 10} more" in ambiguous.stderr
    # one trace by a prefix of its id: its waterfall, CLIENT rows naming their callee
    wanted = big_run["rollouts"][4321]
    shown, took = _timed("view", directory, "--trace", wanted[:14])
    print(f"[view --trace on {N_ROLLOUTS} rollouts: {took:.1f} s]")
    assert shown.returncode == 0, shown.stderr
    job, block = _text_blocks(shown.stdout)
    assert job[0].startswith("job ") and block[0].startswith(f"trace {wanted}  11 spans")
    clients = [line for line in block[2:] if "POST → " in line]
    assert [line.split("→ ")[1].split("  ")[0].strip() for line in clients] == [
        "agent /run",
        "model /v1/responses",
        "model /v1/responses",
        "resources /get_weather",
        "resources /verify",
    ]


def test_a_16k_rollout_run_page_is_bounded_and_lists_every_trace(big_run, tmp_path):
    page = tmp_path / "big.html"
    result, took = _timed("view", str(big_run["dir"]), "--html", str(page))
    size = page.stat().st_size
    print(f"[view --html of {N_ROLLOUTS} rollouts: {took:.1f} s, {size / 1e6:.1f} MB]")
    assert result.returncode == 0, result.stderr
    total = N_ROLLOUTS + 2  # the rollouts, the job's own trace, the start-up trace
    wrote = re.fullmatch(rf"wrote {total} traces to {page} \((\d+) drawn, every one listed\)", result.stdout.strip())
    assert wrote, result.stdout
    drawn_count = int(wrote[1])
    # the job's own trace (its gym.job span alone) is its heading, not a waterfall
    assert drawn_count in (DEFAULT_MAX_DETAIL - 1, DEFAULT_MAX_DETAIL)
    assert size < 20_000_000
    document = _dom(page.read_text(encoding="utf-8"))
    # a row per trace (the start-up trace's in a group of its own, under a heading row)
    listed = [row for row in document.find("table")[0].find("tr") if "data-trace-id" in row.attrs]
    assert len(listed) == total
    drawn = document.find("section", "trace")
    assert len(drawn) == drawn_count
    # every failed rollout is among those drawn, and the note says how to see the rest
    drawn_ids = {s.attrs["data-trace-id"] for s in drawn}
    assert {big_run["rollouts"][i] for i in range(999, N_ROLLOUTS, 1000)} <= drawn_ids
    (note,) = document.find("p", "note")
    assert f"{drawn_count} of the {total} traces" in note.all_text() and "--trace" in note.all_text()
    links = [row for row in listed if row.find("a")]
    assert {row.attrs["data-trace-id"] for row in links} == drawn_ids


def test_a_closed_pipe_ends_quietly(big_run):
    """``view | head -1``: the first line, then a quiet exit (no traceback)."""
    env = {**os.environ, "COLUMNS": "120"}
    with subprocess.Popen(
        [*_command(), "view", str(big_run["dir"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as process:
        first = process.stdout.readline()
        process.stdout.close()  # the reader goes away, as head does
        stderr = process.stderr.read().decode()
        code = process.wait(timeout=120)
    assert first.decode().startswith("start (UTC)")
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and stderr == ""
    assert code in (0, 141)
