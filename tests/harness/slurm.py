"""A real single-node Slurm cluster, owned by the test process.

Gym 0.7's ``gym eval submit`` writes an sbatch script and submits it with
``sbatch --parsable``; its steps are ``srun`` with pyxis's container flags.  This
module runs Debian's Slurm (``slurmctld``, ``slurmd``) and ``munged`` as
subprocesses of the test, every file of theirs (config, key, sockets, state, spool,
pid files, logs) under one working directory: nothing in ``/etc`` is read or
written.  No container runtime is reachable, so ``tests/fixtures/pyxis_noop`` (a
SPANK plugin of ours, built here with gcc into the test cache) accepts pyxis's flags
and ignores them (the step runs on the host); it exports what it saw into the step
(``GYM_TEST_PYXIS_IMAGE`` ...).

    with SlurmCluster(tmp_path) as cluster:
        job = cluster.sbatch(script, env=cluster.env)
        assert cluster.wait(job).state == "COMPLETED"

``missing()`` says what is not installed (``./run-tests`` installs it as root).
Slurm runs jobs as root here (``SlurmUser=root``): the daemons need root anyway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping

from tests.harness.gym_install import _file_lock, cache_root
from tests.harness.ports import reserve_ports

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN_SOURCE = REPO_ROOT / "tests" / "fixtures" / "pyxis_noop" / "pyxis_noop.c"
SPANK_HEADER = pathlib.Path("/usr/include/slurm/spank.h")
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "gcc")
APT_PACKAGES = "slurmctld slurmd slurm-client munge libslurm-dev"


def missing() -> list[str]:
    """What this harness needs and the machine lacks (programs, the SPANK header)."""
    out = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if not SPANK_HEADER.exists():
        out.append(str(SPANK_HEADER))
    return out


def _which(program: str) -> str:
    return shutil.which(program) or f"/usr/sbin/{program}"


def build_plugin() -> pathlib.Path:
    """``pyxis_noop.so`` in the test cache, rebuilt when its source changes."""
    source = PLUGIN_SOURCE.read_bytes()
    digest = hashlib.sha256(source + SPANK_HEADER.read_bytes()).hexdigest()[:16]
    root = cache_root() / "slurm"
    target = root / f"pyxis_noop-{digest}.so"
    with _file_lock(root / "pyxis_noop.lock"):
        if not target.exists():
            partial = target.with_suffix(".so.partial")
            subprocess.run(
                ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(partial), str(PLUGIN_SOURCE)],
                check=True,
                capture_output=True,
                text=True,
            )
            partial.replace(target)
    return target


@dataclasses.dataclass
class JobResult:
    job_id: str
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ... (scontrol's JobState)
    exit_code: str  # "0:0": the batch script's exit status and the signal that ended it
    fields: dict[str, str]  # all of ``scontrol show job``


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    """munged, slurmctld and slurmd on this host, under ``workdir``; a context manager."""

    def __init__(self, workdir: os.PathLike | str, *, start_timeout: float = 60.0):
        self.workdir = pathlib.Path(workdir).resolve()
        self.start_timeout = start_timeout
        self.hostname = socket.gethostname().split(".")[0]
        self.conf = self.workdir / "etc" / "slurm.conf"
        # UNIX sockets (munged's; slurmstepd's in the spool, <spool>/<node>_<job>.<step>) have room
        # for 107 bytes of path: under a long workdir they go to a short directory of their own.
        self._short_dir: pathlib.Path | None = None
        if len(str(self.workdir)) > 60:
            self._short_dir = pathlib.Path(tempfile.mkdtemp(prefix="gym-slurm-"))
        sockets = self._short_dir or self.workdir
        self.munge_socket = sockets / "munge" / "munge.socket"
        self.spool = sockets / "spool"
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # -- what a client needs -------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment plus what Slurm's clients need (``SLURM_CONF``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        """A Slurm client command against this cluster; its stdout."""
        result = subprocess.run(
            list(args), env=dict(env if env is not None else self.env), capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise SlurmError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        lacking = missing()
        if lacking:
            raise SlurmError(f"Slurm is not installed: missing {', '.join(lacking)} (apt-get install {APT_PACKAGES})")
        plugin = build_plugin()
        for sub in ("etc", "munge", "state", "log", "run"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_config(plugin)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-N", self.hostname, "-f", str(self.conf)])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / "log" / f"{name}.out", "ab")
        self._logs.append(log)
        env = dict(self.env)
        self._procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )

    def _start_munge(self) -> None:
        key = self.workdir / "munge" / "munge.key"
        if not key.exists():
            subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self.munge_socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.workdir / "munge", 0o700)
        os.chmod(key, 0o600)
        self._spawn(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={self.workdir / 'log' / 'munged.log'}",
                f"--pid-file={self.workdir / 'run' / 'munged.pid'}",
                f"--seed-file={self.workdir / 'munge' / 'munged.seed'}",
            ],
        )
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError(f"munged made no socket at {self.munge_socket}: {self._tail('munged')}")
            time.sleep(0.05)

    def _write_config(self, plugin: pathlib.Path) -> None:
        ctld_port, slurmd_port = reserve_ports(2)
        cpus = len(os.sched_getaffinity(0)) or 1  # what nproc says
        available_mb = _available_memory_mb()
        real_memory = max(256, available_mb // 4)
        w = self.workdir
        (w / "etc" / "plugstack.conf").write_text(f"required {plugin}\n")
        self.conf.write_text(
            "\n".join(
                [
                    "# written by tests/harness/slurm.py",
                    "ClusterName=gymtest",
                    f"SlurmctldHost={self.hostname}",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"PlugStackConfig={w / 'etc' / 'plugstack.conf'}",
                    f"StateSaveLocation={w / 'state'}",
                    f"SlurmdSpoolDir={self.spool}",
                    f"SlurmctldPidFile={w / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={w / 'run' / 'slurmd.pid'}",
                    f"SlurmctldLogFile={w / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={w / 'log' / 'slurmd.log'}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "MailProg=/bin/true",
                    "ReturnToService=2",
                    "MinJobAge=600",  # a finished job stays in `scontrol show job` this long
                    "SchedulerParameters=sched_interval=2",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=60",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "Waittime=0",
                    f"NodeName={self.hostname} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={real_memory} State=UNKNOWN",
                    f"PartitionName=main Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = self.run("sinfo", "-h", "-N", "-o", "%T", timeout=10).strip()
            except (SlurmError, subprocess.TimeoutExpired) as e:
                last = str(e)
            if last == "idle":
                return
            time.sleep(0.2)
        raise SlurmError(
            f"the node is not idle after {self.start_timeout:.0f}s (sinfo: {last!r}); "
            f"slurmctld: {self._tail('slurmctld')} slurmd: {self._tail('slurmd')}"
        )

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise SlurmError(f"{name} exited ({proc.returncode}): {self._tail(name)}")

    def _tail(self, name: str, n: int = 2000) -> str:
        texts = []
        for path in (self.workdir / "log" / f"{name}.out", self.workdir / "log" / f"{name}.log"):
            if path.exists():
                texts.append(path.read_text(errors="replace")[-n:])
        return "\n".join(texts) or "(no log)"

    def processes(self) -> dict[str, int]:
        """The daemons' pids, by name (munged, slurmctld, slurmd)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def stop(self) -> None:
        """Ends only this cluster's daemons, jobs first (scancel: their slurmstepd processes end
        the steps), so nothing lingers; a slurmstepd of this cluster still there after 10s is killed."""
        stepds = _stepds_of(self.conf)  # read now: a slurmstepd ending its job is no longer recognisable
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--partition=main", timeout=10)
            except (SlurmError, subprocess.TimeoutExpired, OSError):
                pass
        deadline = time.monotonic() + 10  # KillWait=5
        while time.monotonic() < deadline and any(_is_stepd(pid) for pid in stepds):
            time.sleep(0.1)
        for pid in stepds:
            if _is_stepd(pid):
                os.kill(pid, signal.SIGKILL)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._procs.clear()
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
        for log in self._logs:
            log.close()
        self._logs.clear()

    # -- jobs ----------------------------------------------------------------------------

    def sbatch(self, script: os.PathLike | str, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Submits ``script`` (``sbatch --parsable [args] script``) as Gym does; the job id."""
        out = self.run("sbatch", "--parsable", *args, str(script), env=env).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out!r}")
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``{}`` once the job is forgotten)."""
        try:
            text = self.run("scontrol", "show", "job", "--oneliner", job_id)
        except SlurmError:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout: float = 60.0) -> JobResult:
        """Until squeue no longer lists the job as pending or running; its end state."""
        deadline = time.monotonic() + timeout
        while True:
            listed = self.run(
                "squeue", "-h", "-j", job_id, "-o", "%T", "--states=PENDING,RUNNING,COMPLETING,CONFIGURING"
            )
            if not listed.strip():
                break
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} still {listed.strip()} after {timeout:.0f}s: {self.job(job_id)}")
            time.sleep(0.2)
        fields = self.job(job_id)
        return JobResult(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?"), fields)


def _available_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 1024


def _is_stepd(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd"
    except OSError:
        return False


def _stepds_of(conf: pathlib.Path) -> list[int]:
    """slurmstepd processes started for this cluster (their environment names its config)."""
    mine = f"SLURM_CONF={conf}".encode()
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "slurmstepd":
                continue
            if mine in (entry / "environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
        except OSError:
            continue
    return out
