"""A real SSH server on loopback, owned by the test process, and clients that reach it.

Gym 0.7's ``gym eval submit`` with ``compute.<name>.hostname`` set talks to the cluster's
login node over SSH: ``ssh -o ControlMaster=yes ... -N <host>`` (one master connection),
then ``ssh <host> mkdir -p``, ``rsync -az --delete -e "ssh ..." <staging>/ <host>:<run dir>``
and ``ssh <host> bash -s`` (the ``sbatch`` commands on stdin).  This module runs Debian's
``sshd`` (``/usr/sbin/sshd -D -e -f <config>``) as a subprocess of the test, its host key,
the client's key pair, ``authorized_keys``, pid file and log under one working directory;
nothing in ``/etc/ssh`` or ``~/.ssh`` is read or written.  The one system path: sshd
refuses to start without its privilege separation directory ``/run/sshd``, made if missing.

    with SshServer(tmp_path) as server:
        client = server.client({"SLURM_CONF": conf, "SBATCH_EXPORT": "NONE"})
        env["PATH"] = client.path_dir + os.pathsep + env["PATH"]   # `ssh` is the wrapper
        ...  # compute.local.hostname: client.host

``ssh`` reads the user's ``~/.ssh/config`` from the passwd home, not ``$HOME``, so a client
is a directory with an ``ssh`` wrapper (``exec /usr/bin/ssh -F <its config> "$@"``) to put
first on ``PATH`` (rsync's ``-e ssh`` finds it too) and that config: the host alias
(``gymtest``) with port, user, key, a known_hosts file under the working directory, and
``SetEnv`` of the variables given -- the login node's environment (``sshd_config`` has
``AcceptEnv SLURM_CONF SBATCH_EXPORT``), which a remote ``sbatch`` sees and the
submitting process's environment never reaches.

``missing()`` says what is not installed (``./run-tests`` installs it as root).  sshd logs
at ``VERBOSE``: each session is a ``Starting session: command for <user> from 127.0.0.1``
line in ``.log_text()``.  Runs as root only (``PermitRootLogin prohibit-password``).
"""

from __future__ import annotations

import getpass
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping

from tests.harness.ports import reserve_port

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
PROGRAMS = (SSHD, SSH, "ssh-keygen", "rsync")
APT_PACKAGES = "openssh-server openssh-client rsync"
PRIVSEP_DIR = pathlib.Path("/run/sshd")
ACCEPTED_ENV = ("SLURM_CONF", "SBATCH_EXPORT")
DEFAULT_ALIAS = "gymtest"


class SshError(RuntimeError):
    pass


def missing() -> list[str]:
    """What this harness needs and the machine lacks."""
    return [p for p in PROGRAMS if not (os.path.exists(p) if p.startswith("/") else shutil.which(p))]


class SshClient:
    """One client directory: ``path_dir`` (the ``ssh`` wrapper, first on ``PATH``) and its config."""

    def __init__(self, path_dir: pathlib.Path, host: str, config: pathlib.Path) -> None:
        self.path_dir = str(path_dir)
        self.host = host
        self.config = config

    @property
    def ssh(self) -> str:
        return str(pathlib.Path(self.path_dir) / "ssh")

    def run(self, *command: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        """``ssh <alias> <command>`` through the wrapper (``BatchMode``: never a prompt)."""
        done = subprocess.run(
            [self.ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", self.host, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise SshError(f"ssh {self.host} {shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (this process's environment by default) with the wrapper first on ``PATH``."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join([self.path_dir, *filter(None, [env.get("PATH")])])
        return env


class SshServer:
    """A real ``sshd`` on ``127.0.0.1:<port>`` whose only key is the one its clients use."""

    def __init__(
        self,
        workdir: pathlib.Path | str,
        remote_env: Mapping[str, str] | None = None,
        *,
        alias: str = DEFAULT_ALIAS,
        start_timeout: float = 20.0,
    ) -> None:
        self.workdir = pathlib.Path(workdir).absolute()
        self.host = alias
        self.user = getpass.getuser()
        self.start_timeout = start_timeout
        self.remote_env = dict(remote_env or {})
        self.port = 0
        self.config = self.workdir / "sshd_config"
        self.log = self.workdir / "sshd.log"
        self.pid_file = self.workdir / "sshd.pid"
        self.host_key = self.workdir / "host_ed25519"
        self.client_key = self.workdir / "client_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.known_hosts = self.workdir / "known_hosts"
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._clients = 0
        self.default_client: SshClient | None = None

    # -- what a client needs -------------------------------------------------------------

    @property
    def client_path_dir(self) -> str:
        """The default client's directory (``remote_env`` given to the constructor)."""
        assert self.default_client is not None, "not started"
        return self.default_client.path_dir

    def client(self, remote_env: Mapping[str, str] | None = None) -> SshClient:
        """A client directory of its own whose sessions carry ``remote_env`` (``SetEnv``)."""
        unknown = sorted(set(remote_env or {}) - set(ACCEPTED_ENV))
        if unknown:
            raise ValueError(f"sshd accepts only {', '.join(ACCEPTED_ENV)}, not {', '.join(unknown)}")
        self._clients += 1
        directory = self.workdir / f"client-{self._clients}"
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "ssh_config"
        lines = [
            "# written by tests/harness/ssh.py",
            f"Host {self.host}",
            "    HostName 127.0.0.1",
            f"    Port {self.port}",
            f"    User {self.user}",
            f"    IdentityFile {self.client_key}",
            "    IdentitiesOnly yes",
            "    PasswordAuthentication no",
            "    KbdInteractiveAuthentication no",
            f"    HostKeyAlias {self.host}",
            f"    UserKnownHostsFile {self.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    LogLevel ERROR",
        ]
        if remote_env:
            # SetEnv values are split like a command line: quote each assignment
            assignments = " ".join(f'"{k}={v}"' for k, v in remote_env.items())
            lines.append(f"    SetEnv {assignments}")
        config.write_text("\n".join(lines) + "\n")
        wrapper = directory / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {shlex.quote(str(config))} "$@"\n')
        wrapper.chmod(0o755)
        return SshClient(directory, self.host, config)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def sessions(self) -> list[str]:
        """sshd's ``Starting session: ...`` lines so far (one per command run over SSH)."""
        return [line for line in self.log_text().splitlines() if "Starting session:" in line]

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> SshServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> SshServer:
        lacking = missing()
        if lacking:
            raise SshError(f"OpenSSH is not installed: missing {', '.join(lacking)} (apt-get install {APT_PACKAGES})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gym-autoinstr-test-{key.stem}", "-f", key],
                    check=True,
                    capture_output=True,
                )
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        host_public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"{self.host} {host_public[0]} {host_public[1]}\n")
        self.port = reserve_port()
        self._write_config()
        self._log_file = open(self.log, "ab")
        self._proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.default_client = self.client(self.remote_env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self) -> None:
        self.config.write_text(
            "\n".join(
                [
                    "# written by tests/harness/ssh.py",
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.pid_file}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    "StrictModes no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"AllowUsers {self.user}",
                    f"AcceptEnv {' '.join(ACCEPTED_ENV)}",
                    "PermitUserEnvironment no",
                    "X11Forwarding no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )

    def _wait_ready(self) -> None:
        assert self.default_client is not None
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise SshError(f"sshd exited ({self._proc.returncode}): {self.log_text()[-2000:]}")
            try:
                done = self.default_client.run("true", timeout=10, check=False)
            except subprocess.TimeoutExpired as e:
                last = str(e)
            else:
                if done.returncode == 0:
                    return
                last = done.stderr.strip()
            time.sleep(0.2)
        raise SshError(
            f"`ssh {self.host} true` did not succeed in {self.start_timeout:.0f}s ({last}); "
            f"sshd: {self.log_text()[-2000:]}"
        )

    def stop(self) -> None:
        """Ends this sshd and the per-connection processes it forked (nothing else)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            children = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            for pid in children:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry.name))
    return out
