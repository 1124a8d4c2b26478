"""One run directory per run (gym_autoinstr/setup/runs.py): the orchestrator's note, and a
collection process joining the running fleet it finds beside it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from gym_autoinstr import settings
from gym_autoinstr.setup import runs


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_collection_process_joins_the_running_fleet_and_its_children_inherit_it(tmp_path, caplog):
    parent = tmp_path / "gym-autoinstr-runs"
    runs.record_run(parent / "abc123", "abc123")  # this test's process plays the orchestrator
    note = json.loads((parent / "abc123" / runs.RUN_NOTE).read_text())
    assert note["run_id"] == "abc123" and note["pid"] > 0 and note["process_start"]
    environ: dict[str, str] = {}
    with caplog.at_level(logging.INFO, logger="gym_autoinstr"):
        assert runs.join_live_run(parent, environ) == parent / "abc123"
    assert environ == {settings.RUN_ID.name: "abc123", settings.OUTPUT_DIR.name: str(parent / "abc123")}
    (said,) = [r.getMessage() for r in caplog.records if "beside the servers of run abc123" in r.getMessage()]
    assert str(parent / "abc123") in said and settings.OUTPUT_DIR.name in said


def test_the_newest_running_fleet_wins_and_ended_or_reused_pids_do_not_count(tmp_path):
    parent = tmp_path / "gym-autoinstr-runs"
    runs.record_run(parent / "older", "older")
    runs.record_run(parent / "newer", "newer")
    ended = parent / "ended"
    ended.mkdir()
    (ended / runs.RUN_NOTE).write_text(json.dumps({"run_id": "ended", "pid": _dead_pid(), "started": 9e12}))
    reused = parent / "reused"  # a live pid (ours) that started at another time: not that run's
    reused.mkdir()
    (reused / runs.RUN_NOTE).write_text(
        json.dumps({"run_id": "reused", "pid": __import__("os").getpid(), "process_start": "1", "started": 9e12})
    )
    (parent / "broken").mkdir()
    (parent / "broken" / runs.RUN_NOTE).write_text("{not json")
    older = json.loads((parent / "older" / runs.RUN_NOTE).read_text())
    older["started"] -= 10
    (parent / "older" / runs.RUN_NOTE).write_text(json.dumps(older))
    directory, note = runs.live_run(parent)
    assert (directory.name, note["run_id"]) == ("newer", "newer")


def test_a_process_with_a_run_of_its_own_joins_nothing(tmp_path):
    parent = tmp_path / "gym-autoinstr-runs"
    runs.record_run(parent / "abc123", "abc123")
    for own in (
        {settings.OUTPUT_DIR.name: str(tmp_path / "mine")},
        {settings.RUN_ID.name: "mine"},
        {settings.SLURM_JOB_ID.name: "42"},
    ):
        environ = dict(own)
        assert runs.join_live_run(parent, environ) is None
        assert environ == own
    assert runs.join_live_run(tmp_path / "nothing-here", {}) is None


def test_which_of_gyms_commands_start_a_fleet_of_their_own():
    for argv in (
        ["/v/bin/gym", "env", "start", "+config_paths=[a.yaml]"],
        ["/v/bin/gym", "eval", "run", "+config_paths=[a.yaml]"],
        ["/v/bin/ng_run", "+config_paths=[a.yaml]"],
        ["/v/bin/nemo_gym_e2e_collect_rollouts"],
    ):
        assert runs.starts_fleet(argv), argv
    for argv in (
        ["/v/bin/ng_collect_rollouts", "+config_paths=[a.yaml]"],
        ["/v/bin/gym", "eval", "run", "--no-serve", "+config_paths=[a.yaml]"],
        ["/v/bin/gym", "env", "status"],
        ["/v/bin/gym"],
        ["collect.py", "+agent_name=x"],
        [],
    ):
        assert not runs.starts_fleet(argv), argv
