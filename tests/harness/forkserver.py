"""A fresh-looking Python process for the price of a fork: ``ForkServer(python, preload)``.

Some tests run a short ``python -c`` program many times (``gym-autoinstr doctor``, each time
in an environment bent another way).  Most of such a run is importing Gym's third-party
dependencies (pandas, wandb, Ray, openai, FastAPI: about 4 s of a 5 s run on these
machines), identical every time.  A fork server imports those once, in a process of the
same interpreter, then forks a child per run; the child takes the run's environment,
working directory, ``PYTHONPATH`` entries and argv, executes the program as ``-c`` would,
runs the ``atexit`` handlers and exits with its status.  Its stdout and stderr go to files
the caller reads.

What is preloaded must be neutral to what the runs test: never OpenTelemetry's SDK, exporters,
instrumentation or distro, Gym or this project (checked at start: those are what the runs
bend, block or inspect; the OpenTelemetry API is allowed, FastAPI and wandb import it), and
nothing that reads the environment the runs vary (``GYM_AUTOINSTR_*``, ``OTEL_*``,
``PYTHONPATH``).
A module that fails to import is simply not preloaded (the child imports it as a fresh
process would).

The protocol is a JSON line per run on the server's stdin and one back on its stdout; runs
are served one at a time (under pytest-xdist each worker has its own server).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEVER_PRELOADED = (
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "opentelemetry.instrumentation",
    "opentelemetry.distro",
    "gym_autoinstr",
    "nemo_gym",
)

_SERVER = r"""
import importlib, json, os, sys

for name in PRELOAD:
    try:
        importlib.import_module(name)
    except Exception:
        pass
loaded = sorted({n for n in NEVER for m in sys.modules if m == n or m.startswith(n + ".")})
if loaded:
    said = "preloading imported " + ", ".join(loaded) + ": a run would not see them fresh"
    print(json.dumps({"error": said}), flush=True)
    sys.exit(1)
import threading
if threading.active_count() != 1:
    names = [t.name for t in threading.enumerate()]
    print(json.dumps({"error": f"preloading started threads {names}: forking would be unsafe"}), flush=True)
    sys.exit(1)
print(json.dumps({"ready": sorted(m for m in PRELOAD if m in sys.modules)}), flush=True)
base_path = list(sys.path)

def child(request):
    import atexit, builtins, importlib, signal, traceback
    signal.alarm(request["timeout"])  # a run that hangs is killed, as subprocess.run(timeout=) would
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # as PYTHONPATH would: after the script's directory ('' for -c), before site-packages
    sys.path[:] = base_path[:1] + request["pythonpath"] + base_path[1:]
    importlib.invalidate_caches()
    sys.argv = ["-c", *request["argv"]]
    status = 0
    try:
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as stop:
        if stop.code is None:
            status = 0
        elif isinstance(stop.code, int):
            status = stop.code
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status & 0xFF)

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(request)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(json.dumps({"returncode": code}), flush=True)
"""


@dataclass
class Run:
    """What one run left: its exit status (negative: killed by that signal), stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str


class ForkServer:
    """``python`` with ``preload`` imported once; ``.run(code, env=, cwd=, pythonpath=, argv=)``
    per program.  The server's own environment is ``env`` (what preloading may read)."""

    def __init__(self, python: str | os.PathLike, preload: Sequence[str], env: Mapping[str, str]):
        self.python = str(python)
        self.preload = list(preload)
        self.env = dict(env)
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._scratch = tempfile.TemporaryDirectory(prefix="forkserver-")
        self.preloaded: list[str] = []

    def start(self) -> ForkServer:
        program = f"PRELOAD = {self.preload!r}\nNEVER = {list(NEVER_PRELOADED)!r}\n" + _SERVER
        self._process = subprocess.Popen(
            [self.python, "-c", program],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self._scratch.name,
            env=self.env,
            text=True,
        )
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"the fork server did not start: {answer['error']}")
        self.preloaded = answer["ready"]
        return self

    def _answer(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ({self.python}) exited with {self._process.wait()}")
        return json.loads(line)

    def run(
        self,
        code: str,
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike,
        pythonpath: Sequence[str] = (),
        argv: Sequence[str] = (),
        timeout: int = 120,
    ) -> Run:
        with self._lock:
            scratch = pathlib.Path(self._scratch.name)
            stdout, stderr = scratch / "stdout", scratch / "stderr"
            request = {
                "code": code,
                "env": dict(env),
                "cwd": str(cwd),
                "pythonpath": [str(p) for p in pythonpath],
                "argv": list(argv),
                "timeout": int(timeout),
                "stdout": str(stdout),
                "stderr": str(stderr),
            }
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = self._answer()
            return Run(answer["returncode"], stdout.read_text(errors="replace"), stderr.read_text(errors="replace"))

    def stop(self) -> None:
        if self._process is not None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        self._scratch.cleanup()

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
