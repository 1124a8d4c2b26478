"""A real NeMo Gym agent + model + resources trio, launched through ``gym env start``.

    with GymTrio.for_version("0.7.0", tmp_path, policy_url="http://127.0.0.1:P/v1") as trio:
        result = trio.rollout()          # one task row through the agent's /run
        assert result["reward"] == 1.0

What runs is Gym's own orchestrator (head server, Ray, process spawning, readiness
polling, SIGINT shutdown).  Ray: the example trio joins the session's cluster through
Gym's ``ray_head_node_address`` (tests/harness/shared_ray.py); ``own_ray=True`` (and a
resources server that runs Ray tasks) has Gym start its own, as users run it.  Only the
per-server venv installs are skipped (``+skip_venv_if_present=true`` with ``<type>/<name>/.venv`` symlinks in
the working directory pointing at the shared venv; ``server_venvs`` points one
server's symlink elsewhere).  With ``build_venvs=True`` nothing is skipped: Gym
builds a uv venv per server in the working directory, as users run it (the venv
needs ``uv``; the uv cache is shared between runs under the test cache root).

The servers, their config and the command Gym is started with: ``trio_config.py``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any

import psutil

from tests.harness.ports import reserve_ports
from tests.harness.trio_config import (  # noqa: F401 (CODE_ANSWER, RAY_SCORER_ROW: imported from here)
    _MARKER_ENV,
    AGENT,
    CODE_ANSWER,
    ENVIRONMENT,
    MODEL,
    RAY_RESOURCES,
    RAY_SCORER_ROW,
    RESOURCES,
    GymTrioError,
    TrioConfig,
)

# Gym's `collect_rollouts()` body (the `ng_collect_rollouts` entry point), without the CLI
# dispatch around it, whose 0.4+ module imports optional packages the test venvs lack.
COLLECT_DRIVER = """\
import asyncio
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
config = RolloutCollectionConfig.model_validate(get_global_config_dict())
asyncio.run(RolloutCollectionHelper().run_from_config(config))
"""
_READY_RE = re.compile(r"All (\d+) / (\d+) servers ready!")


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def log_timing(line: str) -> None:
    """A harness timing on stderr (a test's captured output: tools/test-times reads it)."""
    print(line, file=sys.stderr, flush=True)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports that Ray (or anything binding port 0) will not take meanwhile."""
    return reserve_ports(n, host)


class GymTrio(TrioConfig):
    """Start/stop one real Gym trio; see the module docstring."""

    host = "127.0.0.1"

    def __init__(
        self,
        venv: pathlib.Path | str,
        gym_version: str,
        workdir: pathlib.Path | str,
        policy_url: str,
        env: Mapping[str, str] | None = None,
        instrument: bool = False,
        extra_config: Mapping[str, Any] | None = None,
        build_venvs: bool = False,
        server_venvs: Mapping[str, pathlib.Path | str] | None = None,
        uv_cache_dir: pathlib.Path | str | None = None,
        resources: str = RESOURCES,
        own_ray: bool = False,
    ) -> None:
        self.venv = pathlib.Path(venv).absolute()
        self.gym_version = gym_version
        self.workdir = pathlib.Path(workdir).absolute()
        self.policy_url = policy_url
        self.extra_env = dict(env or {})
        self.instrument = instrument
        self.extra_config = dict(extra_config or {})
        self.build_venvs = build_venvs
        self.server_venvs = {k: pathlib.Path(v).absolute() for k, v in (server_venvs or {}).items()}
        if build_venvs and uv_cache_dir is None:
            from tests.harness.gym_install import cache_root

            uv_cache_dir = cache_root() / "uv-cache"
        self.uv_cache_dir = pathlib.Path(uv_cache_dir).absolute() if uv_cache_dir else None
        self.has_relay = _vtuple(gym_version) >= (0, 7)
        self.has_rollout_ids = _vtuple(gym_version) >= (0, 5)

        # The resources server: the example one, or one of RESOURCES_CONFIGS (e.g.
        # "code_gen", whose verify runs the model's code in Ray tasks); its config key is
        # its implementation's name.
        self.resources = resources
        # The example trio only connects to Ray (every server is a driver; nothing runs on
        # it): it joins the session's cluster for its Python and Ray (shared_ray.py).  Gym
        # starts a Ray head of its own with own_ray, for a resources server that runs Ray
        # tasks (code_gen, ray_scorer: their workers are the fleet's), for servers in venvs
        # of their own, and a ray_head_node_address of the test's is the test's.
        self.own_ray = (
            own_ray
            or resources in RAY_RESOURCES
            or build_venvs
            or bool(self.server_venvs)
            or "ray_head_node_address" in self.extra_config
        )
        self.ray_address: str | None = None
        names = [resources, AGENT, MODEL] + ([ENVIRONMENT] if self.has_relay else [])
        ports = free_ports(len(names) + 1, self.host)
        self.head_port = ports[0]
        self.ports: dict[str, int] = dict(zip(names, ports[1:]))
        self.server_names = names
        self.trio_id = uuid.uuid4().hex
        self.config_path = self.workdir / "gym_trio_config.yaml"
        self.log_path = self.workdir / "gym_env_start.log"
        self.proc: subprocess.Popen | None = None
        self.ray_tmpdir: str | None = None
        self.startup_seconds: float | None = None
        self._log_fh = None
        self._known: dict[int, psutil.Process] = {}
        self._rollout_counter = 0

    @classmethod
    def for_version(cls, version: str, workdir, policy_url: str, *, with_project=True, venv_extra=(), **kw) -> GymTrio:
        """The trio of that Gym release in its cached venv (``gym_venv(version, with_project=, extra=)``)."""
        from tests.harness.gym_install import gym_venv

        return cls(gym_venv(version, with_project=with_project, extra=venv_extra), version, workdir, policy_url, **kw)

    # ------------------------------------------------------------------ start

    def start(self, timeout: float = 180) -> GymTrio:
        if self.proc is not None:
            raise GymTrioError("already started")
        if not self.own_ray:
            from tests.harness.shared_ray import address_for

            self.ray_address = address_for(self.venv)
        self.prepare()
        # Ray's unix sockets live under RAY_TMPDIR; keep that path short (socket
        # paths are limited to ~107 bytes), private to this trio, and removed in stop().
        self.ray_tmpdir = tempfile.mkdtemp(prefix="gtray-")
        self._log_fh = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # An inherited SIG_IGN for SIGINT (background job of a non-interactive
            # shell) would make Gym deaf to the SIGINT stop() sends.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = t0 + timeout
        try:
            while True:
                text = self.log_text()
                m = _READY_RE.search(text)
                if m and m.group(1) == m.group(2):
                    break
                if self.proc.poll() is not None:
                    raise GymTrioError(f"gym env start exited early (rc={self.proc.returncode}):\n" + self.log_tail())
                if time.monotonic() > deadline:
                    raise GymTrioError(f"Gym servers not ready after {timeout:.0f}s:\n" + self.log_tail())
                self._track()
                time.sleep(0.25)
            self._await_instance_listing(m.end())
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        log_timing(f"[trio] gym-{self.gym_version} ready in {self.startup_seconds:.1f}s")
        self._track()
        return self

    def _await_instance_listing(self, after: int, timeout: float = 60) -> None:
        """Wait until Gym has printed its server-instance listing after "servers ready".

        Gym prints "All N / N servers ready!" and then lists the instances
        (``display_server_instance_info``, whose first ``pprint`` imports pygments: a
        second or more) before ``run_forever``.  Only ``run_forever`` turns SIGINT into
        a shutdown of the servers; a SIGINT that lands in the listing leaves them to be
        killed unflushed, so a stop() right after readiness is not the user's Ctrl-C on a
        running Gym.  The listing ends with a third row of 100 '#'.  A Gym that prints no
        listing (none within 3 s) is not waited for.
        """
        rule = "#" * 100
        start = time.monotonic()
        while True:
            tail = self.log_text()[after:]
            if "No server instances to display." in tail or tail.count(rule) >= 3:
                time.sleep(0.2)  # from the last print into run_forever's try
                return
            waited = time.monotonic() - start
            if (waited > 3 and "Server Instances" not in tail) or waited > timeout or self.proc.poll() is not None:
                return
            time.sleep(0.1)

    # ------------------------------------------------------------------ logs

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # ------------------------------------------------------------------ processes

    def _marked(self) -> list[psutil.Process]:
        """Every live process carrying this trio's marker in its environment."""
        out = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.environ().get(_MARKER_ENV) == self.trio_id:
                    out.append(p)
            except (psutil.Error, OSError):
                continue
        return out

    def _track(self) -> None:
        procs = []
        if self.proc is not None:
            try:
                root = psutil.Process(self.proc.pid)
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                pass
        for p in procs:
            self._known.setdefault(p.pid, p)

    def processes(self) -> list[psutil.Process]:
        """The gym process and every live descendant (Ray daemons included)."""
        self._track()
        live = {p.pid: p for p in self._known.values() if _alive(p)}
        for p in self._marked():
            live.setdefault(p.pid, p)
        return list(live.values())

    def all_server_processes(self) -> dict[str, list[psutil.Process]]:
        """Server name -> its Python processes (several with ``num_workers > 1``), oldest first."""
        out: dict[str, list[psutil.Process]] = collections.defaultdict(list)
        for p in self.processes():
            try:
                name = p.environ().get("NEMO_GYM_CONFIG_PATH")
                if name not in self.ports:
                    continue
                if not os.path.basename(p.exe()).startswith("python"):
                    continue
                out[name].append(p)
            except (psutil.Error, OSError):
                continue
        for v in out.values():
            v.sort(key=lambda p: (p.create_time(), p.pid))
        return dict(out)

    def server_processes(self) -> dict[str, psutil.Process]:
        """Server name -> the server's main Python process (the one running ``app.py``)."""
        out = {}
        for name, procs in self.all_server_processes().items():
            pids = {p.pid for p in procs}
            roots = [p for p in procs if _safe_ppid(p) not in pids]
            out[name] = (roots or procs)[0]
        return out

    # ------------------------------------------------------------------ rollouts

    def rollout(
        self,
        row: Mapping | None = None,
        *,
        timeout: float = 60,
        task_index: int | None = None,
        rollout_index: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict:
        """POST one task row to ``/run`` and return the JSON result.

        On 0.5+ the row gets ``_ng_task_index``/``_ng_rollout_index`` (as Gym's
        rollout collection adds them) unless it has them, so a rollout id exists.
        """
        body = dict(row if row is not None else self.default_row())
        if self.has_rollout_ids and "_ng_rollout_id" not in body:
            if rollout_index is None:
                rollout_index = self._rollout_counter
                self._rollout_counter += 1
            body.setdefault("_ng_task_index", 0 if task_index is None else task_index)
            body.setdefault("_ng_rollout_index", rollout_index)
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.run_url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise GymTrioError(f"/run returned {e.code}: {e.read()[:2000]!r}\n" + self.log_tail(30)) from e

    def rollouts(self, n: int, concurrency: int = 4, row: Mapping | None = None, timeout: float = 120) -> list[dict]:
        row = row if row is not None else self.default_row()
        start = self._rollout_counter
        self._rollout_counter += n
        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as ex:
            futs = [ex.submit(self.rollout, row, timeout=timeout, rollout_index=start + i) for i in range(n)]
            return [f.result() for f in futs]

    def collect(
        self,
        rows: list[Mapping],
        directory: pathlib.Path,
        *,
        num_repeats: int = 1,
        parallel: int | None = None,
        env: Mapping[str, str] | None = None,
        driver: str | None = None,
        drop_env: tuple[str, ...] = (),
        timeout: float = 600,
    ) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
        """Gym's own collection driver on ``rows`` against this fleet, under
        ``opentelemetry-instrument`` with this fleet's environment (less ``drop_env``, plus
        ``env``), run from ``directory``: ``gym eval run --no-serve`` on 0.7+, else what
        ``ng_collect_rollouts`` runs (``RolloutCollectionHelper.run_from_config``, without
        the CLI around it), or ``driver`` (a Python script given the same overrides).
        Returns Gym's output file (its rows: reward, ``_ng_task_index``, ...) and the run."""
        directory.mkdir(parents=True, exist_ok=True)
        input_rows = directory / "rows.jsonl"
        input_rows.write_text("".join(json.dumps(row) + "\n" for row in rows))
        output = directory / "rollouts.jsonl"
        overrides = [
            f"+config_paths=[{self.config_path}]",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={input_rows}",
            f"+output_jsonl_fpath={output}",
            f"+num_repeats={num_repeats}",
            "+upload_rollouts_to_wandb=false",
        ]
        if parallel is not None:
            overrides.append(f"+num_samples_in_parallel={parallel}")
        if driver is None and _vtuple(self.gym_version) >= (0, 7):
            command = [str(self.venv / "bin" / "gym"), "eval", "run", "--no-serve", *overrides]
        else:
            script = directory / "collect.py"
            script.write_text(driver or COLLECT_DRIVER)
            command = [str(self.venv / "bin" / "python"), str(script), *overrides]
        environment = {k: v for k, v in self.environment().items() if k not in drop_env}
        environment.update(env or {})
        done = subprocess.run(
            [str(self.venv / "bin" / "opentelemetry-instrument"), *command],
            cwd=directory,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return output, done

    # ------------------------------------------------------------------ stop

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int | None:
        """Stop Gym the way a user does (SIGINT), then make sure nothing survives.

        Returns gym's exit code (None if it had to be killed).
        """
        if self.proc is None:
            self._cleanup_tmp()
            return None
        self._track()
        t0 = time.monotonic()
        rc = self.proc.poll()
        if rc is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
        # Fallback: everything in gym's process group / session, everything we saw
        # descend from it, everything carrying our marker.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if rc is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        leftovers = [p for p in self._known.values() if _alive(p)] + self._marked()
        self._kill(leftovers)
        self.leftover_pids = [p.pid for p in leftovers]
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        self._cleanup_tmp()
        self.returncode = rc
        self.proc_pid = self.proc.pid
        self.proc = None
        log_timing(f"[trio] gym-{self.gym_version} stopped in {time.monotonic() - t0:.1f}s")
        return rc

    def _kill(self, procs: list[psutil.Process]) -> None:
        uniq = {p.pid: p for p in procs if p.pid != os.getpid()}
        for p in uniq.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(list(uniq.values()), timeout=10)

    def _cleanup_tmp(self) -> None:
        if self.ray_tmpdir:
            shutil.rmtree(self.ray_tmpdir, ignore_errors=True)
            self.ray_tmpdir = None

    def __enter__(self) -> GymTrio:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PolicyModel:
    """``examples/policy_model.py`` as a subprocess (context manager); ``.url`` is its ``/v1`` base."""

    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "policy_model.py"

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, args: tuple[str, ...] = (), python: str | None = None
    ) -> None:
        self.cmd = [python or sys.executable, str(self.script), "--host", host, "--port", str(port), *args]
        self.proc: subprocess.Popen | None = None
        self.base: str | None = None

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    def start(self, timeout: float = 30) -> PolicyModel:
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"policy model listening on (http://\S+)", line)
            if m:
                self.base = m.group(1).rstrip("/")
                return self
        self.stop()
        raise GymTrioError("policy model did not start:\n" + "".join(seen))

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self) -> PolicyModel:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _safe_ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None
