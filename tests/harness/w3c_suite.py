"""The W3C trace-context test suite, unmodified, against a real Gym server.

The suite (https://github.com/w3c/trace-context, folder ``test/``) is not ours and is never
committed here: point ``GYM_AUTOINSTR_W3C_SUITE`` (or ``tools/w3c-suite``'s argument) at a
copy of that folder.  Its ``test.py`` starts a harness server, POSTs instructions to a "test
service" with the ``traceparent``/``tracestate`` headers of each case, and reads the headers
of the calls the service makes back to the harness.  The service here is a real Gym
resources server (``tests/fixtures/w3c_service``) started as ``gym env start`` starts one,
under ``opentelemetry-instrument``: its calls go out through Gym's ``server_utils.request``,
so what the suite sees is our ingress reading the headers and our egress writing them.

``run_suite(suite_dir, venv, workdir, fast_path=True)`` runs it once (the fast path on or
off: ``GYM_AUTOINSTR_FAST_PATH``) and returns each test's outcome.  Standard library only:
``tools/w3c-suite`` runs it from any Python.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from tests.harness.ports import reserve_ports

SUITE_ENV = "GYM_AUTOINSTR_W3C_SUITE"  # a copy of w3c/trace-context's test/ folder
GYM_VERSION = "0.4.0"  # the server's Gym (any supported one would do: the seams are the same)
SERVICE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "w3c_service"
SERVER_NAME = "w3c_service"
# What the suite is told: every test included (STRICT_LEVEL=2: its tracestate rules among
# them; SPEC_LEVEL=2: 37 tests of Level 1, 3 "advanced" ones and Level 2's, the random flag).
STRICT_LEVEL = 2
SPEC_LEVEL = 2

# unittest's verbose lines: "test_x (__main__.Class.test_x)" (the docstring's first line may
# follow on a line of its own), then " ... ok" / "FAIL" / "ERROR" / "skipped 'why'".
_TEST_LINE = re.compile(r"^(test_\w+) \(__main__\.(\w+)[\w.]*\)")
_OUTCOME = re.compile(r"\.\.\. (ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_RAN = re.compile(r"^Ran (\d+) tests? in ")


def suite_dir_problem(path: pathlib.Path) -> str | None:
    """Why ``path`` is not the suite's ``test/`` folder, or None when it is."""
    missing = [name for name in ("test.py", "client.py", "server.py", "tracecontext") if not (path / name).exists()]
    if missing:
        return f"{path} is not w3c/trace-context's test/ folder (no {', '.join(missing)})"
    return None


@dataclass
class SuiteRun:
    """One run of the suite: each test's outcome (``Class.test_name`` -> ``ok``, ``FAIL``,
    ``ERROR``, ``skipped ...``), how many it says it ran, and its whole output."""

    fast_path: bool
    outcomes: dict[str, str] = field(default_factory=dict)
    ran: int = 0
    output: str = ""

    @property
    def mode(self) -> str:
        return "fast path on" if self.fast_path else "fast path off"

    @property
    def passed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome == "ok"]

    @property
    def failed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome in ("FAIL", "ERROR")]

    @property
    def skipped(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome.startswith("skipped")]

    @property
    def counted(self) -> int:
        """The tests that ran and were not skipped."""
        return len(self.outcomes) - len(self.skipped)

    def summary(self) -> str:
        line = f"{self.mode}: {len(self.passed)} of {self.counted} passed"
        if self.skipped:
            line += f" ({len(self.skipped)} skipped)"
        return line + "".join(f"\n  {self.outcomes[name]:5} {name}" for name in self.failed)


def parse_outcomes(output: str) -> tuple[dict[str, str], int]:
    """(each test's outcome, the count of ``Ran N tests``) from the suite's verbose output."""
    outcomes: dict[str, str] = {}
    current = None
    ran = 0
    for line in output.splitlines():
        named = _TEST_LINE.match(line)
        if named:
            current = f"{named.group(2)}.{named.group(1)}"
        outcome = _OUTCOME.search(line)
        if outcome and current is not None:
            outcomes[current] = outcome.group(1)
            current = None
        counted = _RAN.match(line)
        if counted:
            ran = int(counted.group(1))
    return outcomes, ran


def _config(host: str, port: int, head_port: int) -> dict:
    """The global config ``gym env start`` hands a server (the parts this one reads)."""
    return {
        "head_server": {"host": host, "port": head_port},  # never contacted
        "dry_run": False,
        SERVER_NAME: {
            "resources_servers": {
                SERVER_NAME: {"entrypoint": "app.py", "host": host, "port": port, "domain": "other"},
            }
        },
    }


def _environment(
    venv: pathlib.Path, workdir: pathlib.Path, fast_path: bool, config: dict, extra: Mapping[str, str]
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_GYM_", "GYM_AUTOINSTR_", "OTEL_"))}
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["NEMO_GYM_CONFIG_DICT"] = json.dumps(config)
    env["NEMO_GYM_CONFIG_PATH"] = SERVER_NAME
    env["GYM_AUTOINSTR_FAST_PATH"] = "true" if fast_path else "false"
    env["GYM_AUTOINSTR_OUTPUT_DIR"] = str(workdir / "traces")  # the local-file default, kept out of the way
    env.update(extra)
    return env


def _wait_ready(url: str, process: subprocess.Popen, log: pathlib.Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the test service exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the test service did not answer {url} in {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # as Gym stops its servers
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_suite(
    suite_dir: pathlib.Path,
    venv: pathlib.Path,
    workdir: pathlib.Path,
    *,
    fast_path: bool,
    spec_level: int = SPEC_LEVEL,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> SuiteRun:
    """Start the test service (a real Gym server, traced; ``env``: more of its environment,
    e.g. other ``GYM_AUTOINSTR_*`` switches) and run the suite against it once."""
    suite_dir = pathlib.Path(suite_dir).resolve()
    problem = suite_dir_problem(suite_dir)
    if problem:
        raise ValueError(problem)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    port, head_port, harness_port = reserve_ports(3, host)
    service_env = _environment(venv, workdir, fast_path, _config(host, port, head_port), env or {})
    log = workdir / f"service-{'fast' if fast_path else 'stock'}.log"
    with open(log, "wb") as out:
        service = subprocess.Popen(
            [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"), "app.py"],
            cwd=SERVICE,
            env=service_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(f"http://{host}:{port}/", service, log, timeout=120)
        suite_env = {k: v for k, v in service_env.items() if not k.startswith(("NEMO_GYM_", "GYM_AUTOINSTR_"))}
        suite_env.update(STRICT_LEVEL=str(STRICT_LEVEL), SPEC_LEVEL=str(spec_level))
        suite_env.update(HARNESS_HOST=host, HARNESS_PORT=str(harness_port))
        result = subprocess.run(
            [str(venv / "bin" / "python"), "test.py", f"http://{host}:{port}/test"],
            cwd=suite_dir,
            env=suite_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        _stop(service)
    output = result.stdout + result.stderr
    outcomes, ran = parse_outcomes(output)
    skipped = sum(outcome.startswith("skipped") for outcome in outcomes.values())
    if not outcomes or not len(outcomes) - skipped <= ran <= len(outcomes):  # (a skipped class is not "ran")
        raise RuntimeError(
            f"could not read the suite's results (ran {ran}, read {len(outcomes)}):\n{output[-4000:]}\n"
            f"the service's log:\n{log.read_text()[-4000:]}"
        )
    return SuiteRun(fast_path=fast_path, outcomes=outcomes, ran=ran, output=output)
