"""Fleets that Gym's collection driver runs jobs against, shared by the tests that read
what one job produced.

``JobFleet(version, workdir, policy_url)``: a traced trio (default span groups) whose
resources server is the graded one (tests/fixtures/graded: each row's own reward; a row
without one scores 1.0, as Gym's example does), behind a real collector, metrics exported
every 500 ms, spans also written to a run directory (``.files``: ``OTEL_TRACES_EXPORTER=
otlp,files``) for ``gym-autoinstr view``.  ``.collect(...)`` runs one instrumented collection job (Gym's own driver:
``gym eval run --no-serve`` on 0.7+, ``run_from_config`` before) and returns when it
ended: its start time (its spans start after it) and Gym's output file;
``.wait_for_rollouts(start_ns, count)`` waits for that job's spans.  The session fixture
``job_fleets(version)`` (tests/conftest.py) starts one per version on first use; the
files that use it run on one xdist worker (``SHARED_WORKER``).
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Mapping

from tests.harness.collector import Collector
from tests.harness.traces import job_spans, spans_since
from tests.harness.trio import GymTrio

RESOURCES = "graded"


class JobFleet:
    def __init__(self, version: str, workdir: pathlib.Path, policy_url: str) -> None:
        self.version, self.workdir = version, workdir
        self.collector = Collector(log_dir=workdir / "collector")
        self.trio: GymTrio | None = None
        self.policy_url = policy_url
        self.runs = 0
        self.files = workdir / "files"  # every process's spans as OTLP-JSON files too

    def start(self) -> JobFleet:
        self.collector.__enter__()
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.collector.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            # and a local copy, the run directory `gym-autoinstr view` reads
            "OTEL_TRACES_EXPORTER": "otlp,files",
            "GYM_AUTOINSTR_OUTPUT_DIR": str(self.files),
        }
        self.trio = GymTrio.for_version(
            self.version,
            self.workdir / "gym",
            policy_url=self.policy_url,
            instrument=True,
            env=env,
            resources=RESOURCES,
        )
        try:
            self.trio.start(timeout=300)
        except BaseException:
            self.collector.__exit__(None, None, None)
            raise
        return self

    def stop(self) -> None:
        try:
            if self.trio is not None:
                self.trio.stop()
        finally:
            self.collector.__exit__(None, None, None)

    def collect(
        self,
        *,
        rows: int | list[Mapping] = 1,
        repeats: int = 1,
        parallel: int | None = None,
        env: Mapping[str, str] | None = None,
        driver: str | None = None,
        drop_env: tuple[str, ...] = (),
    ) -> tuple[int, str]:
        """One instrumented collection job: ``rows`` task rows (a count of the trio's default
        row, or the rows themselves), ``repeats`` each; returns its start time and Gym's
        output file.  Gym must finish it (exit 0)."""
        self.runs += 1
        row_list = [self.trio.default_row() for _ in range(rows)] if isinstance(rows, int) else list(rows)
        start_ns = time.time_ns()
        output, done = self.trio.collect(
            row_list,
            self.workdir / f"run{self.runs}",
            num_repeats=repeats,
            parallel=parallel,
            env=env,
            driver=driver,
            drop_env=drop_env,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Error in sitecustomize" not in done.stderr
        return start_ns, str(output)

    def wait_for_rollouts(self, start_ns: int, count: int, timeout: float = 60) -> list[dict]:
        """This job's spans, once ``count`` rollouts (their verify call) have arrived."""
        self.collector.sink.wait_for(
            lambda spans: (
                sum(s["name"] == "POST /verify" for s in spans_since(spans, start_ns)) >= count
                and job_spans(spans_since(spans, start_ns))
            ),
            timeout=timeout,
        )
        time.sleep(1.5)  # the last batch of each server (batch delay 200 ms)
        return spans_since(self.collector.sink.spans(), start_ns)


def output_rows(path: str) -> list[dict]:
    """Gym's output file, a row per rollout."""
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
