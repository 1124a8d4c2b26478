"""The in-process selection (``-m "not realgym and not slow"``) and what each of its tests did.

``Recorder`` is a pytest plugin (``register``-ed by ``tests/conftest.py`` in every session): it
notes the session's tests of the selection once collected, and each one's outcome
("passed", "skipped", "failure", "error") from its reports, the same way whether the
session is a subprocess of ``tests/test_sdk_matrix.py`` or the main run.  With
``--selection-outcomes FILE`` it writes both to ``FILE`` (JSON) when the session ends, so a
subprocess's outcomes and this session's are read alike.

Under pytest-xdist the work is split: every worker collects the whole session (so each knows
the selection), but runs only its share, while the controller sees every test's reports.  So
the controller's recorder takes the outcomes (a test is in the selection unless its report's
keywords carry a marker outside it), the workers hand it the selection, and the controller
keeps a live copy of what finished in a file whose path each worker gets
(``live_outcomes``: what ``tests/test_sdk_matrix.py`` waits on from inside a worker).

It also notes whether this session's outcomes stand for a run of the selection on this
interpreter: no setting a subprocess would drop (``gym_targets.clean_environment``) was set
when the session started, and the project's code is this checkout's.  Whether the session
ran the *whole* selection is for the caller to check against a collection of it.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

import pytest

from .gym_targets import INHERITED_PREFIXES

SELECTION = "not realgym and not slow"
OPTION = "--selection-outcomes"
PLUGIN = "selection-recorder"
MARKERS_OUTSIDE = ("realgym", "slow")
# Test-harness locations only (where venvs are cached): they change no test's outcome.
HARNESS_VARIABLES = ("GYM_AUTOINSTR_TEST_CACHE",)
_RANK = {"passed": 0, "skipped": 1, "failure": 2, "error": 2}
_LIVE = "selection_live_outcomes"  # workerinput: the controller's live file
_COLLECTED = "selection_collected"  # workeroutput: a worker's collected selection


def in_selection(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in MARKERS_OUTSIDE)


def _kind(report: pytest.TestReport) -> str:
    if report.failed:
        return "failure" if report.when == "call" else "error"
    if report.skipped:  # a skip or an xfail (as junitxml counts it)
        return "skipped"
    return "passed"


class Recorder:
    def __init__(self, config: pytest.Config, path: str | None, repo: pathlib.Path):
        self.config = config
        self.path = path
        self.collected: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.finished: set[str] = set()
        self._wanted: set[str] = set()
        self._live: pathlib.Path | None = None
        dropped = sorted(k for k in os.environ if k.startswith(INHERITED_PREFIXES) and k not in HARNESS_VARIABLES)
        # Why this session's outcomes cannot stand for a subprocess run of the selection, if they cannot.
        self.unlike_subprocess = f"settings a subprocess would drop are set: {dropped}" if dropped else ""
        self._repo = repo

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    @property
    def is_controller(self) -> bool:
        return self.config.pluginmanager.has_plugin("dsession")

    def code_is_this_checkout(self) -> bool:
        import gym_autoinstr

        return pathlib.Path(gym_autoinstr.__file__).resolve().is_relative_to(self._repo)

    def complete(self) -> bool:
        """Every test of the selection in this session has run to its teardown."""
        return bool(self.collected) and self.finished >= set(self.collected)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.is_controller:  # (under xdist the controller collects nothing: the workers say)
            return
        self.collected = [item.nodeid for item in session.items if in_selection(item)]
        self._wanted = set(self.collected)
        if self.is_worker:
            self.config.workeroutput[_COLLECTED] = self.collected

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if self.is_controller:
            if any(name in report.keywords for name in MARKERS_OUTSIDE):
                return
        elif nodeid not in self._wanted:
            return
        kind, before = _kind(report), self.outcomes.get(nodeid)
        if before is None or _RANK[kind] > _RANK[before]:
            self.outcomes[nodeid] = kind
        if report.when == "teardown":
            self.finished.add(nodeid)
            if self._live is not None:
                self._write_live()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """(xdist, controller) Each worker learns where the live outcomes are."""
        if self._live is None:
            handle, name = tempfile.mkstemp(prefix="selection-live-", suffix=".json")
            os.close(handle)
            self._live = pathlib.Path(name)
            self._write_live()
        node.workerinput[_LIVE] = str(self._live)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """(xdist, controller) A worker's collected selection (each worker collects it all)."""
        collected = getattr(node, "workeroutput", {}).get(_COLLECTED)
        if collected and not self.collected:
            self.collected = list(collected)

    def _write_live(self) -> None:
        data = {"outcomes": self.outcomes, "finished": sorted(self.finished)}
        partial = self._live.with_suffix(".partial")
        partial.write_text(json.dumps(data))
        partial.replace(self._live)

    def live_outcomes(self, timeout: float, poll: float = 2.0) -> bool:
        """In an xdist worker: wait (up to ``timeout`` s) until the controller has seen every
        test of the selection finish, and take its outcomes; False if they did not all finish.
        Outside xdist: whether this session's own outcomes are complete (no wait)."""
        live = getattr(self.config, "workerinput", {}).get(_LIVE)
        if not live:
            return self.complete()
        wanted = set(self.collected)
        deadline = time.monotonic() + timeout
        while True:
            try:
                data = json.loads(pathlib.Path(live).read_text())
            except (OSError, ValueError):
                data = {}
            finished = set(data.get("finished", ()))
            if wanted and finished >= wanted:
                self.outcomes = {n: k for n, k in data.get("outcomes", {}).items() if n in wanted}
                self.finished = finished & wanted
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.path and not self.is_worker:
            data = {"collected": self.collected, "outcomes": self.outcomes, "complete": self.complete()}
            pathlib.Path(self.path).write_text(json.dumps(data, indent=1) + "\n")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._live is not None:
            self._live.unlink(missing_ok=True)


def addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION, metavar="FILE", help="write the in-process selection's tests and their outcomes to FILE (JSON)"
    )


def register(config: pytest.Config, repo: pathlib.Path) -> Recorder:
    recorder = Recorder(config, config.getoption(OPTION), repo)
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
