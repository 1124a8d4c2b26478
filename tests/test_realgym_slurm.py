"""``opentelemetry-instrument gym eval submit`` on a real Slurm cluster (issue #48).

A real single-node cluster (``tests/harness/slurm.py``: munged, slurmctld, slurmd; pyxis
flags accepted by our no-op SPANK plugin), a real ``gym eval submit`` (Gym 0.7.0) of one
benchmark against our policy model (``tests/harness/gym_submit.py``), a real collector.
The job's driver step runs ``gym eval run``: Ray, the head server and the trio, on the
"compute node".  Each case submits one job and waits for it:

* the default (``--export=ALL``): the submission's ``gym.submit``, the job's ``gym.job``
  linked to it, every rollout a whole trace linked to the job, Slurm's identity on every
  process of the job;
* over SSH (``compute.local.hostname``: a real sshd, ``tests/harness/ssh.py``) to a "login
  node" whose environment has ``SBATCH_EXPORT=NONE`` (the site's policy) and the cluster's
  ``SLURM_CONF``, with the driver in an "image" (a venv standing in for one, its ``bin`` the
  step's PATH): nothing of the submitting process reaches ``sbatch``, and nothing of the
  login shell reaches the job, not even Gym's ``driver.env``; our settings ride in the
  driver's command and the job is traced the same;
* an image without gym-autoinstr: the job runs untraced, its rollouts written, and the
  driver's log says why in one line;
* no exporter configured (the embedded file default): the submit names the job's trace
  directory, and ``gym-autoinstr view`` of the directory submitted from shows
  ``gym.submit`` with the job's ``gym.job`` and rollouts.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

import pytest

from tests.harness.collector import Collector
from tests.harness.gym_submit import SubmitJob, serving_venv, write_submit
from tests.harness.ssh import SshClient
from tests.harness.traces import assert_whole_rollout, by_trace, linked_rollout_roots, otel_env, service_of

pytestmark = pytest.mark.realgym

REPEATS = 2
JOB_TIMEOUT = 600


@pytest.fixture(scope="module")
def module_collector(tmp_path_factory):
    with Collector(log_dir=tmp_path_factory.mktemp("slurm-collector")) as running:
        yield running


def _submit(
    job: SubmitJob,
    cluster,
    collector: Collector | None,
    *,
    env: dict[str, str] | None = None,
    ssh: SshClient | None = None,
    cwd: pathlib.Path | None = None,
) -> tuple[dict, str, int, str]:
    """Submit under opentelemetry-instrument; wait for the job; its record, Slurm id, start
    time and what the submit wrote on stderr.

    ``collector``: None for the embedded file default (the submit's files under ``cwd``).
    ``ssh``: the config names its host; Gym's ``ssh``/``rsync`` find the client's wrapper first
    on PATH, and the submitting process has no ``SLURM_CONF`` (the login node's sessions do)."""
    environment = {
        **job.environment(),  # without the test process's own Gym and telemetry settings
        "SLURM_CONF": cluster.env["SLURM_CONF"],
        **(otel_env(collector, "http/protobuf", OTEL_BSP_SCHEDULE_DELAY="200") if collector else {}),
        **(env or {}),
    }
    if ssh is not None:
        assert job.hostname == ssh.host
        del environment["SLURM_CONF"]
        environment = ssh.environment(environment)
    start_ns = time.time_ns()
    done = subprocess.run(
        # `--`: opentelemetry-instrument would take `--config` for an abbreviation of its own options
        [str(job.venv / "bin" / "opentelemetry-instrument"), "--", *job.argv()],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(done.stdout[done.stdout.index("{") :])
    (benchmark,) = record["benchmarks"]
    slurm_id = benchmark["job_id"]
    assert slurm_id and not benchmark["error"], record
    result = cluster.wait(slurm_id, timeout=JOB_TIMEOUT)
    run_dir = job.run_dirs()[-1]
    log = job.driver_log(run_dir, slurm_id)
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), (
        result.fields,
        log.read_text()[-4000:] if log.exists() else "no driver log",
    )
    rollouts = [json.loads(line) for line in job.rollouts_path(run_dir).read_text().splitlines()]
    assert [r["reward"] for r in rollouts] == [1.0] * REPEATS  # the policy model answers right
    return record, slurm_id, start_ns, done.stderr


def _traced_job(collector: Collector, record: dict, slurm_id: str, start_ns: int, job: SubmitJob) -> None:
    """The submission, its job and the job's rollouts, as exported."""
    collector.sink.wait_for(
        lambda spans: (
            sum(s["name"] == "POST /verify" and s["start_ns"] >= start_ns for s in spans) >= REPEATS
            and any(s["name"] == "gym.job" and s["start_ns"] >= start_ns for s in spans)
        ),
        timeout=60,
    )
    time.sleep(1.5)  # the last batch of each process (batch delay 200 ms)
    spans = [s for s in collector.sink.spans() if s["start_ns"] >= start_ns]
    (submit,) = [s for s in spans if s["name"] == "gym.submit"]
    assert submit["kind"] == "PRODUCER"
    assert submit["attributes"]["nemo.gym.submit.executor"] == "slurm"
    assert submit["attributes"]["nemo.gym.submit.id"] == record["gym_job_id"]
    assert list(submit["attributes"]["nemo.gym.submit.slurm.job_ids"]) == [slurm_id]
    assert "slurm.job.id" not in submit["resource"]  # the submitting process is not in the job

    (gym_job,) = [s for s in spans if s["name"] == "gym.job"]
    assert {"trace_id": submit["trace_id"], "span_id": submit["span_id"]} in gym_job["links"]
    assert gym_job["trace_id"] != submit["trace_id"]  # linked, not nested: the job is a trace of its own
    assert gym_job["parent_span_id"] is None
    counts = {
        k: gym_job["attributes"][f"nemo.gym.job.{k}"] for k in ("rollouts.sent", "rollouts.failed", "num_repeats")
    }
    assert counts == {"rollouts.sent": REPEATS, "rollouts.failed": 0, "num_repeats": REPEATS}
    roots = linked_rollout_roots(spans, gym_job)
    assert len({root["trace_id"] for root in roots}) == len(roots) == REPEATS
    traces = by_trace(spans)
    for root in roots:
        # the rollout's root: the driver's call to /run (the driver also serves the head server)
        assert (root["kind"], root["name"], service_of(root)) == ("CLIENT", "POST /run", service_of(gym_job))
        assert_whole_rollout(traces[root["trace_id"]], root, job.trio)

    # every process of the job says where it ran: the job, its driver step, the node
    in_job = [s for s in spans if s is not submit]
    services = {service_of(s) for s in in_job}
    assert services >= {f"nemo-gym/{name}" for name in job.trio.server_names}
    for span in in_job:
        resource = span["resource"]
        assert resource["slurm.job.id"] == slurm_id, (span["name"], resource)
        assert resource["slurm.step.id"] == "0"
        assert resource["slurm.job.name"] == f"gym-{job.benchmark}"
        assert resource["slurm.partition"] == "main"
        assert resource["host.name"]
        assert resource["nemo.gym.run.id"] == slurm_id


def test_a_submitted_job_is_traced_whole_and_linked_to_its_submission(
    slurm_cluster, policy_model, module_collector, tmp_path
):
    venv = serving_venv()
    job = write_submit(
        tmp_path / "submit", venv, policy_model.url, tmp_path / "jobs", partition="main", repeats=REPEATS
    )
    try:
        record, slurm_id, start_ns, _ = _submit(job, slurm_cluster, module_collector)
        _traced_job(module_collector, record, slurm_id, start_ns, job)
        _staged_and_recorded(job, record, slurm_id, slurm_cluster)
    finally:
        job.cleanup()


def _staged_and_recorded(job: SubmitJob, record: dict, slurm_id: str, cluster) -> None:
    """What a local submit stages and records, around the job Slurm ran."""
    (run_dir,) = job.run_dirs()
    assert job.record(run_dir) == record  # the manifest is what --json printed
    assert record["run_dir"] == str(run_dir) and record["cluster"] == "local" and record["hostname"] is None
    assert record["executor"] == "slurm"
    assert record["benchmarks"] == [
        {"benchmark": job.benchmark, "job_dir": str(job.job_dir(run_dir)), "job_id": slurm_id, "error": None}
    ]
    # the local index, under the submit's XDG_CACHE_HOME
    assert json.loads((job.workdir / "cache" / "nemo-gym" / "jobs" / f"{run_dir.name}.json").read_text()) == record
    assert (run_dir / "resolved-config.yaml").is_file()
    script = job.script_path(run_dir)
    assert cluster.job(slurm_id)["Command"] == str(script)  # sbatch ran the staged job.sh
    assert oct(script.stat().st_mode & 0o777) == "0o600"
    text = script.read_text()
    assert f"#SBATCH --chdir={job.job_dir(run_dir)}" in text
    assert f"+output_jsonl_fpath={job.rollouts_path(run_dir)}" in text
    assert "GYM_AUTOINSTR_SUBMIT_TRACEPARENT=00-" in text


def test_over_ssh_with_sbatch_export_none_the_settings_ride_in_the_driver_command(
    slurm_cluster, ssh_server, policy_model, module_collector, tmp_path
):
    venv = serving_venv()
    # the login node's environment: the cluster's config and the site's policy (sshd AcceptEnv);
    # the submitting process's environment never reaches sbatch over SSH
    login = ssh_server.client({"SLURM_CONF": slurm_cluster.env["SLURM_CONF"], "SBATCH_EXPORT": "NONE"})
    # the driver's "image" is the venv: its bin leads the step's PATH (pyxis_noop)
    job = write_submit(
        tmp_path / "submit",
        venv,
        policy_model.url,
        tmp_path / "jobs",
        partition="main",
        repeats=REPEATS,
        container=str(venv),
        hostname=login.host,
    )
    sessions = len(ssh_server.sessions())
    logins = ssh_server.log_text().count("Accepted publickey for ")
    try:
        record, slurm_id, start_ns, _ = _submit(job, slurm_cluster, module_collector, ssh=login)
        # the transport was SSH: the record names the host, and sshd served Gym's commands
        # (mkdir, rsync, the sbatch commands on bash's stdin, the manifest) over its connection
        assert record["hostname"] == login.host
        assert job.record()["hostname"] == login.host  # the manifest Gym wrote over SSH
        assert ssh_server.log_text().count("Accepted publickey for ") > logins
        assert len(ssh_server.sessions()) >= sessions + 3, ssh_server.sessions()[sessions:]
        _traced_job(module_collector, record, slurm_id, start_ns, job)
    finally:
        job.cleanup()


def test_with_the_file_default_the_submit_says_where_and_view_shows_the_submission_with_its_job(
    slurm_cluster, policy_model, tmp_path
):
    """No exporter configured: the job writes into its job directory; the submit names it, and
    ``gym-autoinstr view`` of the directory submitted from reads it beside ``gym.submit``."""
    venv = serving_venv()
    job = write_submit(
        tmp_path / "submit", venv, policy_model.url, tmp_path / "jobs", partition="main", repeats=REPEATS
    )
    here = tmp_path / "here"  # where the user runs gym eval submit
    here.mkdir()
    try:
        record, slurm_id, _, said = _submit(job, slurm_cluster, None, cwd=here)
        (run_dir,) = job.run_dirs()
        traces = job.job_dir(run_dir) / "gym-autoinstr"
        assert (
            f"gym-autoinstr: INFO: the Slurm jobs write their traces into their job directories: "
            f"{job.benchmark} (Slurm job {slurm_id}): {traces}." in said
        ), said[-3000:]
        shown = subprocess.run(
            [str(venv / "bin" / "gym-autoinstr"), "view", "--json"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr[-3000:]
        roots = [t["root"] for t in json.loads(shown.stdout)["traces"] if not t["startup"]]
        assert roots.count("gym.submit") == roots.count("gym.job") == 1, roots
        assert roots.count("POST /run") == REPEATS, roots
        assert f"reading Slurm job {slurm_id} ({job.benchmark}, submission {record['gym_job_id']}) too" in (
            shown.stderr
        )
    finally:
        job.cleanup()
