"""tests/harness/ssh.py: a real sshd, clients whose sessions carry the login node's variables,
rsync through the client's ``ssh`` wrapper (what Gym's SSH transport runs)."""

from __future__ import annotations

import subprocess

import pytest

from tests.harness.ssh import SshServer


def test_a_client_session_sees_the_variables_it_sets_and_no_others(ssh_server, tmp_path):
    conf = str(tmp_path / "etc with space" / "slurm.conf")
    client = ssh_server.client({"SLURM_CONF": conf, "SBATCH_EXPORT": "NONE"})
    before = len(ssh_server.sessions())
    done = client.run("printenv", "SLURM_CONF", "SBATCH_EXPORT")
    assert done.stdout.splitlines() == [conf, "NONE"]
    assert len(ssh_server.sessions()) == before + 1  # sshd logged the session
    # another client of the same server: its sessions carry only what it sets
    plain = ssh_server.client()
    assert plain.run("printenv", "SLURM_CONF", check=False).returncode == 1
    assert plain.run("echo", "$SSH_CONNECTION").stdout.startswith("127.0.0.1 ")


def test_rsync_through_the_wrapper_copies_a_directory(ssh_server, tmp_path):
    client = ssh_server.client()
    source = tmp_path / "staging"
    (source / "bench" / "logs").mkdir(parents=True)
    (source / "bench" / "job.sh").write_text("#!/bin/bash\necho job\n")
    (source / "bench" / "job.sh").chmod(0o600)
    target = tmp_path / "remote" / "run"
    (target / "stale").mkdir(parents=True)
    before = len(ssh_server.sessions())
    # as Gym's SSHConnection.copy does: `-e ssh` is looked up on PATH, where the wrapper comes first
    done = subprocess.run(
        ["rsync", "-az", "--delete", "-e", "ssh -o BatchMode=yes", f"{source}/", f"{client.host}:{target}"],
        env=client.environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (target / "bench" / "job.sh").read_text() == "#!/bin/bash\necho job\n"
    assert (target / "bench" / "job.sh").stat().st_mode & 0o777 == 0o600
    assert (target / "bench" / "logs").is_dir()
    assert not (target / "stale").exists()  # --delete
    assert len(ssh_server.sessions()) == before + 1  # it went through sshd


def test_a_client_may_only_set_what_sshd_accepts(ssh_server):
    with pytest.raises(ValueError, match="SLURM_CONF"):
        ssh_server.client({"PATH": "/nowhere"})


def test_stop_ends_the_server(tmp_path, ssh_server):
    # ssh_server: skips (or fails under CI) where sshd cannot run
    server = SshServer(tmp_path / "own").start()
    client = server.client()
    assert client.run("true").returncode == 0
    server.stop()
    assert client.run("true", check=False).returncode == 255  # ssh's own failure: nothing listens
