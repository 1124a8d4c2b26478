"""``./run-demo --backend <ui>`` as a user runs it, kept running for the tests that read its
UI: the demo prints the URL to open, then keeps the UI up until Enter.

    with running_demo("mlflow", workdir, rollouts=2, opened=r"^open (http://\\S+)$") as (found, output):
        ...   # found: the match of ``opened``; output: what the demo printed until then
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

DEMO = pathlib.Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def read_until(process: subprocess.Popen, pattern: str, lines: list[str], timeout: float) -> re.Match[str]:
    """The first line ``process`` prints that matches ``pattern`` (the lines before it kept in
    ``lines``); the test fails with the output's tail when it never comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    pytest.fail(f"the demo never printed {pattern!r}:\n" + "".join(lines[-60:]))


@contextlib.contextmanager
def running_demo(backend: str, workdir: pathlib.Path, rollouts: int, opened: str) -> Iterator[tuple[re.Match, str]]:
    process = subprocess.Popen(
        [sys.executable, str(DEMO), "--backend", backend, "--rollouts", str(rollouts), "--workdir", str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    try:
        found = read_until(process, opened, lines, timeout=900)
        read_until(process, r"press Enter", lines, timeout=60)
        yield found, "".join(lines)
    finally:
        if process.poll() is None:
            process.stdin.close()  # Enter: the demo stops the UI and exits
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
