"""``export --to phoenix`` / ``--to mlflow`` (``commands/export/scores.py``) against a small
local HTTP server that plays each UI's score API as the real one answers it (Phoenix
20.26.1's ``/v1/span_annotations?sync=true``, MLflow 3.17.2's ``/api/3.0/mlflow/traces``,
shapes read from their sources and a running server) and records every request: the
payloads, the batching, the identifiers that make a re-send an update, the traces a UI
does not have, an unreachable or failing server. The real UIs, in Chromium, are
tests/test_realgym_phoenix.py's and tests/test_realgym_backends.py's."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gym_autoinstr.commands.export import scores
from gym_autoinstr.commands.runs import store
from tests.commands.test_view_scale import _Process
from tests.harness.collector import free_port

N = 2_100  # rollouts scored: three Phoenix batches (1000, 1000, 100)


def _trace(i: int) -> str:
    return format((i + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128), "032x")


def _span(i: int) -> str:
    return format(0x1000 + i, "016x")


def _reward(i: int) -> float:
    return (i % 5) / 4


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """A run of N scored rollouts (a root ``POST /run`` each: reward, task, repeat), plus a
    masked sample, one that failed before verify (no reward), one that failed after it,
    and a start-up trace; read through the query layer as ``export`` reads it."""
    directory = tmp_path_factory.mktemp("scores") / "run"
    directory.mkdir()
    agent = _Process(directory, "agent", 100)
    for i in range(N):
        attributes = {"nemo.gym.reward": _reward(i), "nemo.gym.task.index": i // 3, "nemo.gym.rollout.index": i % 3}
        agent.span(_trace(i), _span(i), None, "POST /run", 2, i, i + 50, attributes)
    agent.span(_trace(N), _span(N), None, "POST /run", 2, 0, 9, {"nemo.gym.reward": 0.0, "nemo.gym.mask_sample": True})
    agent.span(_trace(N + 1), _span(N + 1), None, "POST /run", 2, 0, 9, {"error.type": "TimeoutError"}, error=True)
    agent.span(
        _trace(N + 2),
        _span(N + 2),
        None,
        "POST /run",
        2,
        0,
        9,
        {"nemo.gym.reward": 0.25, "error.type": "ValueError", "nemo.gym.failure.stage": "after_verify"},
        error=True,
    )
    agent.span("5" * 32, "5" * 16, None, "gym.startup", 1, -10, 0)
    agent.close()
    rollouts = store.load([str(directory)]).rollouts
    assert len(rollouts) == N + 4
    scored = [r for r in rollouts if r.trace_id in {_trace(i) for i in range(N)}]
    return {"dir": directory, "rollouts": rollouts, "scored": scored}


class FakeUi(ThreadingHTTPServer):
    """Phoenix's and MLflow's score endpoints in memory; ``requests``: ``(method, path, body,
    headers)`` of each; ``fail_next``: answer that many requests 503 first."""

    daemon_threads = True

    def __init__(self, known_spans: set[str], known_traces: set[str]) -> None:
        super().__init__(("127.0.0.1", free_port()), Handler)
        self.known_spans, self.known_traces = known_spans, known_traces
        self.requests: list[tuple[str, str, dict | None, dict]] = []
        self.annotations: dict[tuple, dict] = {}  # Phoenix: (span|trace, name, id, identifier) -> annotation
        self.assessments: dict[str, list[dict]] = {}  # MLflow: trace id -> assessments
        self.fail_next = 0
        self.created = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server: FakeUi

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        ui = self.server
        with ui.lock:
            ui.requests.append((method, self.path, body, dict(self.headers)))
            if ui.fail_next:
                ui.fail_next -= 1
                return self._answer(503, {"detail": "busy"})
            found = re.fullmatch(r"/v1/(span|trace)_annotations\?sync=true", self.path)
            if found and method == "POST":
                return self._phoenix(found.group(1), body["data"])
            found = re.fullmatch(r"/api/3\.0/mlflow/traces/(tr-[0-9a-f]{32})(/assessments(?:/(a-\d+))?)?", self.path)
            if found:
                return self._mlflow(method, found.group(1), found.group(2), found.group(3), body)
            return self._answer(404, {"detail": "Not Found"})

    def _phoenix(self, kind: str, data: list[dict]) -> None:
        known = self.server.known_spans if kind == "span" else self.server.known_traces
        missing = {a[f"{kind}_id"] for a in data} - known
        if missing:  # Phoenix's own answer, the whole request refused
            noun = kind.title() + "s"
            return self._answer(404, {"detail": f"{noun} with IDs {', '.join(missing)} do not exist."})
        for a in data:
            self.server.annotations[(kind, a["name"], a[f"{kind}_id"], a["identifier"])] = a
        self._answer(200, {"data": [{"id": f"SpanAnnotation:{i}"} for i in range(len(data))]})

    def _mlflow(self, method: str, trace_id: str, assessments: str | None, assessment_id: str | None, body) -> None:
        ui = self.server
        if trace_id.removeprefix("tr-") not in ui.known_traces:
            message = f"Trace with ID '{trace_id}' not found."
            return self._answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": message})
        held = ui.assessments.setdefault(trace_id, [])
        if method == "GET" and not assessments:
            return self._answer(200, {"trace": {"trace_info": {"trace_id": trace_id, "assessments": held}}})
        if method == "POST" and assessments and not assessment_id:
            ui.created += 1
            created = {**body["assessment"], "assessment_id": f"a-{ui.created}", "valid": True}
            held.append(created)
            return self._answer(200, {"assessment": created})
        if method == "DELETE" and assessment_id:
            held[:] = [a for a in held if a["assessment_id"] != assessment_id]
            return self._answer(200, {})
        self._answer(400, {"error_code": "BAD_REQUEST"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(scores, "BACKOFF", 0.01)
    for name in ("PHOENIX_COLLECTOR_ENDPOINT", "PHOENIX_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _everything(run) -> tuple[set[str], set[str]]:
    return {r.root["span_id"] for r in run["rollouts"]}, {r.trace_id for r in run["rollouts"]}


def _posted(ui: FakeUi, kind: str) -> list[list[dict]]:
    return [body["data"] for method, path, body, _ in ui.requests if path.startswith(f"/v1/{kind}_annotations")]


def test_phoenix_gets_each_reward_on_the_root_span_and_the_trace_in_batches(run, capsys):
    with FakeUi(*_everything(run)) as ui:
        assert scores.send("phoenix", ui.url, run["rollouts"]) == 0
    # N, the masked sample and the late failure, a thousand a request: spans, then traces
    assert [(path.split("?")[0], len(body["data"])) for _, path, body, _ in ui.requests] == [
        ("/v1/span_annotations", 1000),
        ("/v1/trace_annotations", 1000),
        ("/v1/span_annotations", 1000),
        ("/v1/trace_annotations", 1000),
        ("/v1/span_annotations", 102),
        ("/v1/trace_annotations", 102),
    ]
    on_spans = {a["span_id"]: a for batch in _posted(ui, "span") for a in batch}
    on_traces = {a["trace_id"]: a for batch in _posted(ui, "trace") for a in batch}
    assert len(on_spans) == len(on_traces) == N + 2
    for i in range(N):
        a = on_spans[_span(i)]
        assert (a["name"], a["annotator_kind"], a["identifier"]) == ("reward", "CODE", "gym-autoinstr")
        assert a["result"] == {"score": _reward(i)}
        expected = {"task_index": str(i // 3), "rollout_index": str(i % 3), "trace_id": _trace(i)}
        assert expected.items() <= a["metadata"].items()
        assert {k: v for k, v in on_traces[_trace(i)].items() if k != "trace_id"} == {
            k: v for k, v in a.items() if k != "span_id"
        }
    masked = {"label": "masked", "explanation": "masked sample: Gym leaves it out of its scores"}
    assert on_spans[_span(N)]["result"] == on_traces[_trace(N)]["result"] == masked
    late = on_spans[_span(N + 2)]
    assert late["result"]["score"] == 0.25 and "ValueError at after_verify" in late["result"]["explanation"]
    assert _span(N + 1) not in on_spans and "5" * 16 not in on_spans  # no reward; the start-up trace
    out = capsys.readouterr().out
    assert f"{N + 2} rollouts scored 'reward' (a span annotation on each root span, a trace annotation" in out
    assert "1 masked: labelled, no score" in out
    assert "skipped 1 rollout: no reward (failed before verify)" in out
    assert "skipped 1 rollout: not a rollout" in out


def test_phoenix_resending_updates_the_same_annotations(run):
    with FakeUi(*_everything(run)) as ui:
        assert scores.send("phoenix", ui.url, run["rollouts"]) == 0
        assert scores.send("phoenix", ui.url, run["rollouts"]) == 0
    first, second = ([a for _, _, body, _ in half for a in body["data"]] for half in (ui.requests[:6], ui.requests[6:]))
    assert first == second  # the same identifiers: Phoenix upserts on (name, span or trace, identifier)
    assert len(ui.annotations) == 2 * (N + 2)


def test_phoenix_names_the_rollouts_it_does_not_have_and_sends_the_rest(run, capsys):
    spans, traces = _everything(run)
    absent = (5, 1500, 2050)
    with FakeUi(spans - {_span(i) for i in absent}, traces - {_trace(i) for i in absent}) as ui:
        assert scores.send("phoenix", ui.url, run["scored"]) == 0
    assert len(ui.annotations) == 2 * (N - 3)
    # each batch holding one is refused (404), then sent again without it; its trace is not sent
    assert [len(b) for b in _posted(ui, "span")] == [1000, 999, 1000, 999, 100, 99]
    assert [len(b) for b in _posted(ui, "trace")] == [999, 999, 99]
    out = capsys.readouterr().out
    assert f"{N - 3} rollouts scored" in out
    assert "not in Phoenix: 3 rollouts whose trace it does not have" in out
    for i in absent:
        assert _trace(i)[:8] in out
    with FakeUi(set(), set()) as ui:  # none there: nothing sent is a failure
        assert scores.send("phoenix", ui.url, run["scored"][:10]) == 1


def test_phoenix_address_from_its_variable_and_its_api_key(run, monkeypatch):
    with FakeUi(*_everything(run)) as ui:
        monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", ui.url + "/v1/traces")
        monkeypatch.setenv("PHOENIX_API_KEY", "k3y")
        assert scores.send("phoenix", None, run["scored"][:3]) == 0
    assert [(m, p, h["Authorization"]) for m, p, _, h in ui.requests] == [
        ("POST", "/v1/span_annotations?sync=true", "Bearer k3y"),
        ("POST", "/v1/trace_annotations?sync=true", "Bearer k3y"),
    ]


def test_a_busy_server_is_tried_again_an_unreachable_one_named_with_the_fix(run, capsys):
    with FakeUi(*_everything(run)) as ui:
        ui.fail_next = 2  # two 503s, then the third attempt lands
        assert scores.send("phoenix", ui.url, run["scored"][:4]) == 0
        assert len(ui.requests) == 2 + 2 and len(ui.annotations) == 2 * 4
        ui.fail_next = 3  # every attempt spent
        assert scores.send("phoenix", ui.url, run["scored"][:4]) == 1
    assert "Phoenix answered 503" in capsys.readouterr().err
    closed = f"http://127.0.0.1:{free_port()}"
    assert scores.send("phoenix", closed, run["scored"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach Phoenix at {closed}" in err and "--to phoenix=http://HOST:6006" in err
    assert scores.send("mlflow", closed, run["scored"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach MLflow at {closed}" in err and "--to mlflow=http://HOST:5000" in err


def test_a_server_that_is_not_the_ui_is_named(run, capsys):
    with FakeUi(*_everything(run)) as ui:
        assert scores.send("phoenix", ui.url + "/elsewhere", run["scored"][:2]) == 1
    err = capsys.readouterr().err
    assert "Phoenix answered 404" in err and "Phoenix >= 4.10" in err


def test_mlflow_gets_one_assessment_per_trace_updated_not_duplicated(run, capsys):
    spans, traces = _everything(run)
    scored = run["scored"][:300] + [r for r in run["rollouts"] if r not in run["scored"]]
    with FakeUi(spans, traces - {_trace(7)}) as ui:
        assert scores.send("mlflow", ui.url, scored) == 0
        out = capsys.readouterr().out
        assert "assessment 'reward' on 300 rollout traces: 300 created, 0 updated, 0 unchanged" in out
        assert "not in MLflow: 1 rollout" in out and _trace(7)[:8] in out
        assert "skipped 1 rollout: masked sample" in out and "skipped 1 rollout: no reward" in out
        (held,) = ui.assessments["tr-" + _trace(3)]
        assert held["feedback"] == {"value": _reward(3)}
        assert held["source"] == {"source_type": "CODE", "source_id": "gym-autoinstr"}
        assert held["trace_id"] == "tr-" + _trace(3) and held["metadata"]["task_index"] == "1"
        (late,) = ui.assessments["tr-" + _trace(N + 2)]
        assert late["feedback"] == {"value": 0.25} and "ValueError" in late["rationale"]
        assert "tr-" + _trace(N) not in ui.assessments  # masked: MLflow's feedback is a value
        # again: read first, nothing written; a reward changed since is put back, an
        # assessment with a stale metadata key (MLflow's update merges metadata) replaced,
        # a duplicate (two exports at once) removed
        ui.assessments["tr-" + _trace(3)][0]["feedback"] = {"value": 9.0}
        ui.assessments["tr-" + _trace(4)][0]["metadata"]["error_type"] = "ValueError"
        ui.assessments["tr-" + _trace(5)].append({**ui.assessments["tr-" + _trace(5)][0], "assessment_id": "a-0"})
        ui.requests.clear()
        assert scores.send("mlflow", ui.url, scored) == 0
        assert "0 created, 3 updated, 297 unchanged" in capsys.readouterr().out
        assert sorted(m for m, *_ in ui.requests if m != "GET") == ["DELETE", "DELETE", "DELETE", "POST", "POST"]
        assert all(len(held) == 1 for tid, held in ui.assessments.items() if tid != "tr-" + _trace(N))
        assert ui.assessments["tr-" + _trace(3)][0]["feedback"] == {"value": _reward(3)}
        assert "error_type" not in ui.assessments["tr-" + _trace(4)][0]["metadata"]


def test_mlflow_wants_a_tracking_servers_url(run, capsys, monkeypatch):
    assert scores.send("mlflow", None, run["scored"]) == 2
    assert "--to mlflow=http://HOST:5000, or set MLFLOW_TRACKING_URI" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    assert scores.send("mlflow", None, run["scored"]) == 2
    assert "mlflow server --backend-store-uri sqlite:///mlflow.db" in capsys.readouterr().err
    with FakeUi(*_everything(run)) as ui:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", ui.url)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0k")
        assert scores.send("mlflow", None, run["scored"][:2]) == 0
    assert {headers["Authorization"] for *_, headers in ui.requests} == {"Bearer t0k"}


def test_the_export_command_sends_scores(run, capsys):
    """``gym-autoinstr export RUN --to phoenix=URL``: the command dispatches here."""
    from gym_autoinstr.commands.cli import main

    directory = run["dir"]
    with FakeUi(*_everything(run)) as ui:
        assert main(["export", str(directory), "--to", f"phoenix={ui.url}"]) == 0
    assert len(ui.annotations) == 2 * (N + 2)
    assert f"{N + 2} rollouts scored" in capsys.readouterr().out
