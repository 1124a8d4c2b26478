"""A real Ray cluster of one or more nodes on this machine, stopped by the test alone.

Every node is a ``ray start ... --block`` process of its own session, started under
``opentelemetry-instrument`` (as Gym's ``initialize_ray()`` would be, so Ray's daemons
inherit the sitecustomize and must stay silent), on loopback, with its own temp dir and
ports outside Ray's default worker range, and ``RAY_AUTH_MODE=disabled``.  ``stop()``
ends the ``ray start`` processes it started and every process of their sessions;
never ``ray stop`` (that would stop other people's Ray on this machine).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

import psutil

from tests.harness.ports import reserve_ports, share

# Ray workers' ports: 24000-29999 (a client server's own per-client servers take 23000-23999),
# split between the processes sharing the machine's ports (pytest-xdist workers: ports.share).
WORKER_PORTS = (24000, 29999)


def _worker_port_options() -> list[str]:
    index, count = share()
    width = (WORKER_PORTS[1] - WORKER_PORTS[0] + 1) // count
    low = WORKER_PORTS[0] + index * width
    return [f"--min-worker-port={low}", f"--max-worker-port={low + width - 1}"]


class RayCluster:
    def __init__(
        self,
        venv: pathlib.Path,
        workdir: pathlib.Path,
        env: Mapping[str, str],
        *,
        raylet_env: Mapping[str, str] = (),
        num_cpus: int = 2,
        client_server: bool = False,
        instrument: bool = True,
    ) -> None:
        self.venv = pathlib.Path(venv)
        self.workdir = pathlib.Path(workdir)
        self.env = dict(env)
        self.raylet_env = dict(raylet_env)
        self.num_cpus = num_cpus
        self.nodes: list[subprocess.Popen] = []
        self.gcs_port = 0
        self.client_server = client_server  # the head also runs Ray's client server (ray://)
        self.client_port = 0
        self.instrument = instrument  # under opentelemetry-instrument, as Gym's own Ray start is
        # A short temp dir: Ray's socket paths must fit in 107 bytes.
        self.temp_root = pathlib.Path("/tmp") / f"gar-ray-{os.getpid()}-{id(self) & 0xFFFF:x}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        """``ray://`` address of the head's client server (``client_server=True``)."""
        return f"ray://127.0.0.1:{self.client_port}"

    def _environment(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_", "RAY_", "NEMO_GYM_"))
        }
        env.update(self.env)
        env.update(self.raylet_env)
        env["RAY_AUTH_MODE"] = "disabled"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        if self.client_server:
            # a per-client server starting on a busy machine may take longer than Ray's 30 s
            env.setdefault("RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S", "120")
            # Ray's client server forks each per-client server (Popen with a preexec_fn)
            # while its own gRPC threads poll; gRPC's fork handlers then abort the child
            # at random ("Check failed: next_worker->state == KICKED", ray-project/ray#63202),
            # with or without OpenTelemetry loaded, three starts in a row in one CI run.
            # The child execs at once, so it needs none of them: they are off, as gRPC
            # advises for fork-then-exec.
            env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _start_node(self, head: bool, resources: str) -> None:
        index = len(self.nodes)
        ports = [p for p in reserve_ports(12) if p < 10002 or p > 19999]
        while len(ports) < 8:
            ports += [p for p in reserve_ports(12) if (p < 10002 or p > 19999) and p not in ports]
        temp = self.temp_root / f"n{index}"
        temp.mkdir(parents=True, exist_ok=True)
        command = [
            *([str(self.venv / "bin" / "opentelemetry-instrument")] if self.instrument else []),
            str(self.venv / "bin" / "ray"),
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            f"--resources={resources}",
            f"--node-manager-port={ports[1]}",
            f"--object-manager-port={ports[2]}",
            f"--runtime-env-agent-port={ports[3]}",
            f"--dashboard-agent-grpc-port={ports[4]}",
            f"--dashboard-agent-listen-port={ports[5]}",
            f"--metrics-export-port={ports[6]}",
            *_worker_port_options(),
            "--disable-usage-stats",
        ]
        if head:
            self.gcs_port = ports[0]
            command += ["--head", f"--port={ports[0]}", "--include-dashboard=false", f"--temp-dir={temp}"]
            if self.client_server:
                self.client_port = ports[7]
                command += [f"--ray-client-server-port={ports[7]}"]
        else:
            command += [f"--address={self.address}"]
        log = open(self.workdir / f"ray-node-{index}.log", "wb")
        process = subprocess.Popen(
            command,
            env=self._environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
        )
        self.nodes.append(process)

    def start(self, nodes: int = 1, timeout: float = 180) -> RayCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            self._start_node(True, '{"node0": 1}')
            self.wait_for_nodes(1, timeout)
            for index in range(1, nodes):
                self._start_node(False, f'{{"node{index}": 1}}')
            self.wait_for_nodes(nodes, timeout)
            # a harness timing, as trio.log_timing writes them (tools/test-times reads them)
            print(f"[ray_cluster] {nodes}-node ready in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        script = (
            "import ray,sys;ray.init(address=sys.argv[1],log_to_driver=False);"
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        last = ""
        while time.monotonic() < deadline:
            for process in self.nodes:
                if process.poll() is not None:
                    raise RuntimeError(f"ray node exited ({process.returncode}):\n{self.log_tail()}")
            env = {k: v for k, v in self._environment().items() if k != "PYTHONPATH"}
            try:
                result = subprocess.run(
                    [str(self.venv / "bin" / "python"), "-c", script, self.address],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                last = result.stdout.strip() + result.stderr[-500:]
                if result.returncode == 0 and int(result.stdout.strip().splitlines()[-1]) >= count:
                    return
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                pass
            time.sleep(2)
        raise RuntimeError(f"ray cluster not up with {count} nodes: {last}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return _tails(sorted(self.workdir.glob("ray-node-*.log")), lines)

    def client_server_log(self, lines: int = 40) -> str:
        """The end of the head's client-server log (where a per-client server's start is
        reported; the per-client server's own files are empty when gRPC aborted it)."""
        return _tails(sorted(self.temp_root.glob("n0/session_*/logs/ray_client_server.err")), lines)

    def processes(self) -> list[psutil.Process]:
        found: list[psutil.Process] = []
        sessions = {p.pid for p in self.nodes}
        for process in psutil.process_iter(["pid"]):
            try:
                if os.getsid(process.pid) in sessions:
                    found.append(process)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return found

    def stop(self) -> None:
        members = self.processes()
        for process in reversed(self.nodes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.nodes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for member in members + self.processes():
            try:
                member.kill()
            except psutil.Error:
                pass
        import shutil

        shutil.rmtree(self.temp_root, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        if not self.nodes:
            try:
                self.start()
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tails(paths: list[pathlib.Path], lines: int) -> str:
    """The last ``lines`` lines of each file, each under its name."""
    return "\n".join(
        f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) for path in paths
    )
