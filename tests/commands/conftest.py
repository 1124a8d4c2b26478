"""Fixtures shared by the ``gym-autoinstr view`` test modules of this folder: the hand-built run
(``test_view.py``, ``test_view_html.py``), the outcome run and the view run in-process on it
(``test_view_outcome.py``, ``test_view_outcome_page.py``)."""

from __future__ import annotations

import pytest

from gym_autoinstr.commands import cli
from tests.commands.outcome_run import write_outcome_run
from tests.commands.view_helpers import BASE_NS, HANDBUILT, MS, _tracer


@pytest.fixture
def handbuilt_run(tmp_path) -> dict:
    """Three rollouts, three processes' files, one ERROR span (rollout ``7-1``'s tool call)."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode

    directory = tmp_path / "handbuilt-run"
    agent = _tracer(directory, "nemo-gym/agent", "responses_api_agents")
    model = _tracer(directory, "nemo-gym/model", "responses_api_models")
    resources = _tracer(directory, "nemo-gym/resources", "resources_servers")
    ids: dict = {}

    def span(tracer, name, kind, start_ms, end_ms, parent, **attributes):
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        started = tracer.start_span(
            name, context=context, kind=kind, start_time=BASE_NS + int(start_ms * MS), attributes=attributes
        )
        ids.setdefault(name, []).append(format(started.get_span_context().span_id, "016x"))
        return started

    def end(opened, end_ms):
        opened.end(end_time=BASE_NS + int(end_ms * MS))

    # Written newest rollout first: the order on disk must not be the order shown.
    for index in sorted(HANDBUILT, reverse=True):
        total, model_ms, tool_ms, verify_ms, fails = HANDBUILT[index]
        t0 = index * 1000
        rollout_id = f"7-{index}"
        run = span(
            agent,
            "POST /run",
            SpanKind.SERVER,
            t0,
            t0 + total,
            None,
            **{"http.route": "/run", "nemo.gym.rollout.id": rollout_id},
        )
        seam = span(
            agent, "gym.rollout", SpanKind.INTERNAL, t0 + 1, t0 + total - 1, run, **{"nemo.gym.rollout.id": rollout_id}
        )
        calls = [
            (model, "POST /v1/responses", "/v1/responses", model_ms, False),
            (resources, "POST /get_weather", "/get_weather", tool_ms, fails),
            (resources, "POST /verify", "/verify", verify_ms, False),
        ]
        at = t0 + 2
        for tracer, name, route, duration, error in calls:
            callee = "model" if tracer is model else "resources"
            client = span(
                agent,
                f"POST /ng-rollout/{{rollout_id}}{route}",
                SpanKind.CLIENT,
                at,
                at + duration + 2,
                seam,
                **{
                    "http.request.method": "POST",
                    "url.full": f"http://127.0.0.1:1/ng-rollout/{rollout_id}{route}",
                    # what egress adds for a Gym server of the fleet
                    "nemo.gym.http.destination.server.name": callee,
                    "nemo.gym.http.destination.route": route,
                },
            )
            server = span(
                tracer,
                name,
                SpanKind.SERVER,
                at + 1,
                at + 1 + duration,
                client,
                **{"http.route": route, "note": "<b>not markup</b>"},
            )
            if error:
                server.set_attribute("error.type", "TimeoutError")
                server.set_status(Status(StatusCode.ERROR))
                ids["error"] = format(server.get_span_context().span_id, "016x")
            end(server, at + 1 + duration)
            end(client, at + duration + 2)
            at += duration + 4
        end(seam, t0 + total - 1)
        end(run, t0 + total)
    assert len(list(directory.glob("*.jsonl"))) == 3
    return {"dir": directory, "ids": ids}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return write_outcome_run(tmp_path_factory.mktemp("outcome") / "run")


@pytest.fixture
def view(run, capsys, monkeypatch):
    """``gym-autoinstr view RUN ARGS...`` in-process, as a script reads it (no terminal):
    its exit code, standard output and standard error."""
    monkeypatch.delenv("COLUMNS", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = cli.main(["view", str(run["dir"]), *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call
