"""No span lost unsaid: each way a span can be lost, made to happen in a real traced Gym
fleet, and its count found where a user looks (the process's exit line, its note in the
run directory, ``gym-autoinstr view``'s header, ``doctor`` and the ``otel.sdk.*`` metrics).

Three fleets (Gym 0.4.0): the run directory's own limits (a two-span queue, a disk budget
of a few hundred KB), a collector that is not there (exports fail, spans are still queued
at exit, and a server is killed with spans queued), and a run directory that cannot be
written.
"""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import psutil
import pytest

from gym_autoinstr.commands.slow import read_run
from gym_autoinstr.setup.files import read_path
from gym_autoinstr.setup.notes import process_notes
from tests.commands.view_helpers import _cli
from tests.harness.collector import SilentCollector
from tests.harness.metrics import latest, metric_points
from tests.harness.trio import AGENT, MODEL, RESOURCES, GymTrio

pytestmark = pytest.mark.realgym

VERSION = "0.4.0"
EXIT_LINE = re.compile(r"gym-autoinstr: WARNING: ([\d,]+) spans? of [^ ]+(?: [kM])? lost: (.*)")


def _trio(tmp_path: Path, policy_model, env: dict) -> GymTrio:
    return GymTrio.for_version(VERSION, tmp_path / "gym", policy_url=policy_model.url, instrument=True, env=env)


def _lost(notes: list[dict], reason: str, service: str | None = None) -> int:
    return sum(
        int(e["count"])
        for n in notes
        for e in n.get("lost") or ()
        if e["reason"] == reason and (service is None or n["service"].endswith(service))
    )


def _exit_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if EXIT_LINE.search(line)]


def _doctor(run: Path) -> dict:
    result = _cli("doctor", "--offline", "--json", env={"GYM_AUTOINSTR_OUTPUT_DIR": str(run)})
    return json.loads(result.stdout)


def _running(process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_full_queue_and_the_disk_budget(tmp_path, policy_model, collector):
    run = tmp_path / "run"
    env = {
        "OTEL_TRACES_EXPORTER": "files",  # spans to the run directory; metrics to the collector
        "GYM_AUTOINSTR_OUTPUT_DIR": str(run),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_BSP_MAX_QUEUE_SIZE": "4",  # a rollout's spans end in bursts: most of a burst is dropped
        "GYM_AUTOINSTR_RUN_MAX_GB": str(400_000 / 1024**3),  # ~25 rollouts' spans
        "GYM_AUTOINSTR_FLUSH_TIMEOUT_MS": "100",  # (Gym waits a second for a server to exit)
    }
    trio = _trio(tmp_path, policy_model, env)
    with trio:
        results = trio.rollouts(60, concurrency=8)
        time.sleep(1.5)  # a metric export after the last rollout
    assert len(results) == 60 and all(r["reward"] == 1.0 for r in results)  # Gym never noticed
    notes = process_notes(run)
    # the servers and the orchestrator, exited: a server Gym SIGKILLs a second after SIGINT (a
    # loaded machine) keeps the note it wrote when it stopped serving, nothing queued
    assert len(notes) == 4 and all(n["final"] or n["alive"] is False for n in notes)
    queue_full, budget = _lost(notes, "queue_full"), _lost(notes, "disk_budget")
    assert queue_full > 0 and budget > 0
    assert _lost(notes, "queue_full", AGENT) > 0 and _lost(notes, "disk_budget", AGENT) > 0
    for note in notes:  # every span ended is written or lost, and nothing is left queued
        lost = sum(int(e["count"]) for e in note["lost"])
        assert note["spans"]["written"] + lost == note["spans"]["ended"] and note["spans"]["queued"] == 0
    assert sum(n["spans"]["written"] for n in notes) == len(read_path(run))
    # the exit lines: one per process that lost spans and reached its exit, with its counts
    lines = _exit_lines(trio.log_text())
    exited = [n for n in notes if n["final"] and n["lost"]]
    assert exited and len(lines) == len(exited)
    for note in exited:
        name = note["service"].rsplit("/", 1)[-1]
        [line] = [line for line in lines if f" {name} (files), " in line]
        for reason, said in (("queue_full", "queue full"), ("disk_budget", "run's disk budget reached")):
            if _lost([note], reason):
                assert f"{_lost([note], reason):,} {name} (files), {said}" in line
    # view's header
    header = json.loads(_cli("view", str(run), "--json").stdout)["lost"]
    assert header.startswith(f"{queue_full + budget:,} spans of ") and "queue full" in header
    assert "run's disk budget reached" in header
    shown = _cli("view", str(run), columns=100).stdout.splitlines()[0]  # the list's first line, cut to fit
    assert shown.endswith("…") and header.startswith(shown[:-1])
    page = tmp_path / "page.html"
    assert _cli("view", str(run), "--html", str(page)).returncode == 0
    assert f'<p class="lost"><b>{html.escape(header)}</b></p>' in page.read_text()
    # doctor
    doctor = _doctor(run)
    assert sum(e["count"] for e in doctor["last_run"]["lost"]) == queue_full + budget
    said = [p for p in doctor["problems"] if p["subject"] == "last run"]
    assert {p["fix"] for p in said} >= {
        "raise OTEL_BSP_MAX_QUEUE_SIZE, or check that the exporter keeps up (a slow collector?)",
        "raise GYM_AUTOINSTR_RUN_MAX_GB, free disk space, or send spans to a collector",
    }
    # the metrics, at the collector (the last export is before the exit's own count: at most the note's)
    points = metric_points(collector.sink)
    processed = latest(points, "otel.sdk.processor.span.processed")
    full = [p for (service, _), p in processed.items() if p["attributes"].get("error.type") == "queue_full"]
    assert 0 < sum(p["value"] for p in full) <= queue_full
    assert all(p["attributes"]["otel.component.name"] == "gym_autoinstr/files" for p in full)
    exported = latest(points, "otel.sdk.exporter.span.exported")
    over = [p for p in exported.values() if p["attributes"].get("error.type") == "disk_budget"]
    assert 0 < sum(p["value"] for p in over) <= budget


def test_a_silent_collector_a_killed_server_and_spans_queued_at_exit(tmp_path, policy_model):
    run = tmp_path / "run"
    peer = SilentCollector()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp,files",  # the collector never answers; the run directory is there
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{peer.port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        # seconds: each export gives up after 6 s, so the last rollouts' spans still wait at exit
        "OTEL_EXPORTER_OTLP_TIMEOUT": "6",
        "OTEL_METRICS_EXPORTER": "files",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "GYM_AUTOINSTR_FLUSH_TIMEOUT_MS": "100",  # (Gym waits a second for a server to exit)
        "GYM_AUTOINSTR_OUTPUT_DIR": str(run),
    }
    trio = _trio(tmp_path, policy_model, env)
    try:
        with trio:
            results = trio.rollouts(16, concurrency=4)
            servers = trio.server_processes()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # an export has failed (after its 6 s) and been noted
                note = next((n for n in process_notes(run) if n["pid"] == servers[RESOURCES].pid), None)
                if note and _lost([note], "export_failed") > 0:
                    break
                time.sleep(0.5)
            results += trio.rollouts(8, concurrency=4)  # spans now queued (or in a waiting export) everywhere
            time.sleep(2.5)  # the resources server's note has them (it is written every 2 s)
            servers[RESOURCES].kill()  # SIGKILL: no exit, no flush, no final note
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _running(servers[RESOURCES]):
                time.sleep(0.1)
            results += trio.rollouts(0)
    finally:
        peer.close()
    assert len(results) == 24 and all(r["reward"] == 1.0 for r in results)
    notes = process_notes(run)
    killed = next(n for n in notes if n["service"].endswith(RESOURCES))
    assert killed["final"] is False and killed["alive"] is False and killed["spans"]["queued"] > 0
    queued = killed["spans"]["queued"]
    # The other servers exit on Gym's SIGINT with spans still waiting on the silent collector:
    # counted at exit, or (a server Gym SIGKILLs after its one-second grace) from its last note
    servers_notes = [n for n in notes if n["service"].endswith((AGENT, MODEL))]
    exited = [n for n in servers_notes if n["final"]]
    assert exited and all(_lost([n], "exit_unflushed") > 0 for n in exited)
    assert all(n["spans"]["queued"] > 0 for n in servers_notes if not n["final"])
    assert all(_lost([n], "export_failed") > 0 for n in servers_notes)
    assert {e["exporter"] for n in servers_notes for e in n["lost"]} == {"otlp"}  # the files lost nothing
    # each exited server's exit line
    lines = _exit_lines(trio.log_text())
    for note in exited:
        name = note["service"].rsplit("/", 1)[-1]
        [line] = [line for line in lines if f"{name} (otlp)" in line]
        assert f"{_lost([note], 'export_failed'):,} {name} (otlp), exporter failed" in line
        assert f"{_lost([note], 'exit_unflushed'):,} {name} (otlp), still queued at exit" in line
    # view's header: the killed server's queued spans too
    header = json.loads(_cli("view", str(run), "--json").stdout)["lost"]
    assert f"{queued:,} {RESOURCES}, queued when the process was killed" in header
    assert "exporter failed" in header and "still queued at exit" in header
    assert header.startswith(_cli("view", str(run), columns=100).stdout.splitlines()[0].rstrip("…"))
    # doctor
    fixes = {p["problem"].rsplit(": ", 1)[-1]: p["fix"] for p in _doctor(run)["problems"] if p["subject"] == "last run"}
    assert set(fixes) >= {"queued when the process was killed", "exporter failed", "still queued at exit"}
    assert "SIGINT" in fixes["queued when the process was killed"]
    # the metrics, in the run directory's metrics files
    exported = [
        point
        for (_, service, name, _), point in read_run(run).items()
        if name == "otel.sdk.exporter.span.exported" and service.endswith(AGENT)
    ]
    failing = [p for p in exported if p["attributes"].get("error.type") == "export_failed"]
    failed = _lost([n for n in notes if n["service"].endswith(AGENT)], "export_failed")
    assert failing and 0 < sum(int(p["asInt"]) for p in failing) <= failed
    assert {p["attributes"]["otel.component.name"] for p in failing} == {"gym_autoinstr/otlp"}


def test_an_unwritable_run_directory(tmp_path, policy_model, collector):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {
        "OTEL_TRACES_EXPORTER": "files",
        "GYM_AUTOINSTR_OUTPUT_DIR": str(blocker / "run"),  # under a file: never a directory
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    trio = _trio(tmp_path, policy_model, env)
    with trio:
        results = trio.rollouts(6, concurrency=3)
        time.sleep(1.5)
    assert len(results) == 6 and all(r["reward"] == 1.0 for r in results)
    lines = [line for line in _exit_lines(trio.log_text()) if f"{AGENT} (files), directory not writable" in line]
    assert len(lines) == 1
    lost = int(EXIT_LINE.search(lines[0]).group(1).replace(",", ""))
    assert lost >= 6 * 4  # every span of the agent's rollouts (no note: the directory is the trouble)
    points = latest(metric_points(collector.sink), "otel.sdk.exporter.span.exported")
    unwritable = [
        p
        for (service, _), p in points.items()
        if service.endswith(AGENT) and p["attributes"].get("error.type") == "unwritable"
    ]
    assert unwritable and 0 < unwritable[0]["value"] <= lost
    # where a note would be: view says there is no such directory; doctor names the fix
    assert "no such file or directory" in _cli("view", str(blocker / "run")).stderr
    doctor = _doctor(blocker / "run")
    assert any("GYM_AUTOINSTR_OUTPUT_DIR" in p["fix"] for p in doctor["problems"] if p["severity"] == "error")
