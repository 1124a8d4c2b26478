"""The in-process selection (``-m "not realgym and not slow"``) and what each of its tests did.

``Recorder`` is a pytest plugin (``register``-ed by ``tests/conftest.py`` in every session): it
notes the session's tests of the selection once collected, and each one's outcome
("passed", "skipped", "failure", "error") from its reports, the same way whether the
session is a subprocess of ``tests/test_sdk_matrix.py`` or the main run.  With
``--selection-outcomes FILE`` it writes both to ``FILE`` (JSON) when the session ends, so a
subprocess's outcomes and this session's are read alike.

It also notes whether this session's outcomes stand for a run of the selection on this
interpreter: no setting a subprocess would drop (``gym_targets.clean_environment``) was set
when the session started, and the project's code is this checkout's.  Whether the session
ran the *whole* selection is for the caller to check against a collection of it.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from .gym_targets import INHERITED_PREFIXES

SELECTION = "not realgym and not slow"
OPTION = "--selection-outcomes"
PLUGIN = "selection-recorder"
MARKERS_OUTSIDE = ("realgym", "slow")
# Test-harness locations only (where venvs are cached): they change no test's outcome.
HARNESS_VARIABLES = ("GYM_AUTOINSTR_TEST_CACHE",)
_RANK = {"passed": 0, "skipped": 1, "failure": 2, "error": 2}


def in_selection(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in MARKERS_OUTSIDE)


def _kind(report: pytest.TestReport) -> str:
    if report.failed:
        return "failure" if report.when == "call" else "error"
    if report.skipped:  # a skip or an xfail (as junitxml counts it)
        return "skipped"
    return "passed"


class Recorder:
    def __init__(self, path: str | None, repo: pathlib.Path):
        self.path = path
        self.collected: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.finished: set[str] = set()
        self._wanted: set[str] = set()
        dropped = sorted(k for k in os.environ if k.startswith(INHERITED_PREFIXES) and k not in HARNESS_VARIABLES)
        # Why this session's outcomes cannot stand for a subprocess run of the selection, if they cannot.
        self.unlike_subprocess = f"settings a subprocess would drop are set: {dropped}" if dropped else ""
        self._repo = repo

    def code_is_this_checkout(self) -> bool:
        import gym_autoinstr

        return pathlib.Path(gym_autoinstr.__file__).resolve().is_relative_to(self._repo)

    def complete(self) -> bool:
        """Every test of the selection in this session has run to its teardown."""
        return bool(self.collected) and self.finished >= self._wanted

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items if in_selection(item)]
        self._wanted = set(self.collected)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self._wanted:
            return
        kind, before = _kind(report), self.outcomes.get(report.nodeid)
        if before is None or _RANK[kind] > _RANK[before]:
            self.outcomes[report.nodeid] = kind
        if report.when == "teardown":
            self.finished.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.path:
            data = {"collected": self.collected, "outcomes": self.outcomes, "complete": self.complete()}
            pathlib.Path(self.path).write_text(json.dumps(data, indent=1) + "\n")


def addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION, metavar="FILE", help="write the in-process selection's tests and their outcomes to FILE (JSON)"
    )


def register(config: pytest.Config, repo: pathlib.Path) -> Recorder:
    recorder = Recorder(config.getoption(OPTION), repo)
    config.pluginmanager.register(recorder, PLUGIN)
    return recorder


def recorder(config: pytest.Config) -> Recorder:
    return config.pluginmanager.get_plugin(PLUGIN)


def read(path: pathlib.Path) -> dict:
    """What a session run with ``--selection-outcomes path`` wrote ({} if it wrote nothing)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
