"""Rewards as a trace UI's own scores: ``gym-autoinstr export RUN --to phoenix[=URL]`` /
``--to mlflow[=URI]``.

Gym's rollouts reach Phoenix and MLflow as traces, the reward an attribute of the root
span (``nemo.gym.reward``) that neither UI's score views read. This sends each reward as
what they do read: Phoenix annotations ``reward`` on the rollout's root span and on its
trace (the lists' annotation columns, the project's score chart, the filters), an MLflow
assessment ``reward`` (feedback, source CODE ``gym-autoinstr``) on its trace (the trace
list's assessment column). The traces must be there already (sent over OTLP by Gym's
processes; ``OTEL_TRACES_EXPORTER=otlp,files`` keeps the local copy read here); a rollout
whose trace the UI lacks is counted and named.

From ``export``, not at run time: Gym's processes need no second network path (a score
API beside OTLP, with its own failures, retries and credentials in every server), and the
scores can be sent again, later or to another UI, from the run's files.

Re-sending never duplicates: Phoenix upserts on (name, span or trace, ``identifier``);
MLflow has no such key, so each trace's assessments are read first, ours left when
unchanged, else replaced (its update would keep stale metadata). A masked sample (Gym
leaves it out of its scores): Phoenix labels it ``masked``, no score (out of its means);
MLflow, whose feedback is a value, gets none. No reward (failed before verify): nothing;
failed after it: the reward, the failure in the explanation. urllib only: timeouts,
bounded retries.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PROG = "gym-autoinstr export"
NAME = "reward"  # the score's name in both UIs
SOURCE_ID = "gym-autoinstr"  # MLflow's assessment source id; Phoenix's annotation identifier
PHOENIX_DEFAULT = "http://localhost:6006"
BATCH = 1000  # Phoenix annotations per POST
WORKERS = 8  # MLflow requests in flight (one trace each: no batch endpoint)
TIMEOUT = 30.0  # seconds per request
ATTEMPTS = 3  # per request: a refused connection, a timeout, 429 or 5xx are tried again
BACKOFF = 1.0  # seconds before the second attempt, doubled after
SHOWN = 5  # trace ids named in a summary line


class Unreachable(Exception):
    """The server did not answer (refused, timed out, no such host) after every attempt."""


class Refused(Exception):
    """The server answered ``url`` with an error that is not "no such trace"."""

    def __init__(self, url: str, status: int, body: Any) -> None:
        self.url, self.status = url, status
        self.body = body if isinstance(body, str) else json.dumps(body)
        super().__init__(f"{status}: {self.body[:300]}")


def request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """``(status, parsed JSON or text)`` of one HTTP exchange; 4xx answers are returned, not
    raised. Raises ``Unreachable`` or ``Refused`` (5xx, 429) once ``ATTEMPTS`` are spent."""
    data = json.dumps(body).encode() if body is not None else None
    delay = BACKOFF
    for attempt in range(1, ATTEMPTS + 1):
        call = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        for name, value in (headers or {}).items():
            call.add_header(name, value)
        try:
            with urllib.request.urlopen(call, timeout=TIMEOUT) as response:
                return response.status, _parsed(response.read())
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            if error.code != 429 and error.code < 500:
                return error.code, _parsed(text.encode())
            failure: Exception = Refused(url.split("?")[0], error.code, text)
        except (urllib.error.URLError, OSError) as error:  # refused, reset, timed out, unknown host
            failure = Unreachable(str(getattr(error, "reason", error)))
        if attempt == ATTEMPTS:
            raise failure
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _parsed(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return raw.decode(errors="replace")


def _metadata(r: Any) -> dict[str, str]:
    """Where the score came from, as strings (MLflow's metadata is a string map)."""
    fields = {
        "source": SOURCE_ID,
        "run": r.run,
        "trace_id": r.trace_id,
        "job_id": r.job_id,
        "task_index": r.task_index,
        "rollout_index": r.rollout_index,
        "error_type": r.failure.get("error_type") if r.has_error else None,
    }
    return {key: str(value) for key, value in fields.items() if value is not None}


def _unscored(r: Any, masked_scored: bool) -> str | None:
    """Why ``r`` gets no score (None: it gets one)."""
    if not r.is_rollout:
        return "not a rollout (a start-up or job trace)"
    if r.mask_sample:
        return None if masked_scored else "masked sample (Gym leaves it out of its scores)"
    return "no reward (failed before verify)" if r.reward is None else None


def _explanation(r: Any) -> str | None:
    if r.mask_sample:
        return "masked sample: Gym leaves it out of its scores"
    if r.has_error:
        failure = r.failure
        where = f" at {failure['stage']}" if failure.get("stage") else ""
        return f"the rollout failed ({failure.get('error_type') or 'an ERROR span'}{where}) after its reward was set"
    return None


def _short(trace_ids: Sequence[str]) -> str:
    shown = ", ".join(t[:8] for t in trace_ids[:SHOWN])
    return shown + (f" and {len(trace_ids) - SHOWN} more" if len(trace_ids) > SHOWN else "")


def _unreachable(ui: str, url: str, why: str, fix: str) -> int:
    print(f"{PROG}: cannot reach {ui} at {url} ({why}); {fix}", file=sys.stderr)
    return 1


def _progress(ui: str, done: int, total: int, started: float) -> None:
    """A line on a terminal's stderr, rewritten in place, for sends of more than a batch."""
    if total > BATCH and (done % 100 == 0 or done == total) and sys.stderr.isatty():
        print(f"\r{ui}: {done}/{total} scores ({time.monotonic() - started:.0f} s)", end="", file=sys.stderr)
        if done == total:
            print(file=sys.stderr)


# ---- Phoenix --------------------------------------------------------------------------


def _phoenix_base(address: str | None) -> str:
    """The server's base URL: ``--to phoenix=URL``, else PHOENIX_COLLECTOR_ENDPOINT (as the
    Phoenix client reads it, with or without ``/v1/traces``), else Phoenix's default."""
    base = (address or os.environ.get("PHOENIX_COLLECTOR_ENDPOINT") or PHOENIX_DEFAULT).rstrip("/")
    return base.removesuffix("/v1/traces")


def _phoenix_headers() -> dict[str, str]:
    key = os.environ.get("PHOENIX_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def phoenix_annotations(rollouts: Sequence[Any]) -> tuple[list[dict], Counter]:
    """Each rollout's annotation (``/v1/span_annotations``' ``data`` items), and why the
    others have none."""
    annotations, skipped = [], Counter()
    for r in rollouts:
        if reason := _unscored(r, masked_scored=True):
            skipped[reason] += 1
            continue
        result: dict[str, Any] = {"label": "masked"} if r.mask_sample else {"score": r.reward}
        if explanation := _explanation(r):
            result["explanation"] = explanation
        annotations.append(
            {
                "span_id": r.root["span_id"],
                "name": NAME,
                "annotator_kind": "CODE",
                "result": result,
                "identifier": SOURCE_ID,  # (name, span, identifier) is unique: a re-send updates
                "metadata": _metadata(r),
            }
        )
    return annotations, skipped


def _missing(body: Any, noun: str) -> set[str] | None:
    """The ids of Phoenix's 404 "Spans with IDs a, b do not exist." (``noun`` Spans or
    Traces); None for another 404 (not Phoenix's annotation route)."""
    detail = body.get("detail") if isinstance(body, dict) else body
    prefix, suffix = f"{noun} with IDs ", " do not exist."
    if not isinstance(detail, str) or not detail.startswith(prefix):
        return None
    return {s.strip() for s in detail.removeprefix(prefix).removesuffix(suffix).split(",") if s.strip()}


def _post_batch(base: str, kind: str, batch: list[dict]) -> tuple[list[dict], set[str]]:
    """One batch to ``/v1/{kind}_annotations`` (``span`` or ``trace``), synchronously (then
    Phoenix says which ids it lacks: they are left out and the rest sent again): what was
    stored, and the ids Phoenix lacks. Raises ``Refused`` for any other answer."""
    key, noun = f"{kind}_id", f"{kind.title()}s"
    url = f"{base}/v1/{kind}_annotations?sync=true"
    absent: set[str] = set()
    while batch:
        status, body = request("POST", url, {"data": batch}, _phoenix_headers())
        lacking = _missing(body, noun) if status == 404 else None
        if lacking:
            absent |= lacking
            batch = [a for a in batch if a[key] not in lacking]
            continue
        if status != 200:
            raise Refused(url.split("?")[0], status, body)
        return batch, absent
    return [], absent


def send_phoenix(address: str | None, rollouts: Sequence[Any]) -> int:
    """Each reward twice, as Phoenix's two score views read it: a span annotation on the
    rollout's root span (the span and trace lists' "span annotations" column) and a trace
    annotation on its trace (the "trace annotations" column, the project's "trace
    annotation scores" chart)."""
    base = _phoenix_base(address)
    annotations, skipped = phoenix_annotations(rollouts)
    sent, missing = [], []
    started = time.monotonic()
    try:
        for offset in range(0, len(annotations), BATCH):
            stored, absent = _post_batch(base, "span", annotations[offset : offset + BATCH])
            missing.extend(
                a["metadata"]["trace_id"] for a in annotations[offset : offset + BATCH] if a["span_id"] in absent
            )
            on_traces = [
                {**{k: v for k, v in a.items() if k != "span_id"}, "trace_id": a["metadata"]["trace_id"]}
                for a in stored
            ]
            _post_batch(base, "trace", on_traces)  # a trace Phoenix lacks has no span there either
            sent.extend(stored)
            _progress("Phoenix", min(offset + BATCH, len(annotations)), len(annotations), started)
    except Unreachable as error:
        return _unreachable(
            "Phoenix",
            base,
            str(error),
            "start it (phoenix serve), or give its URL: --to phoenix=http://HOST:6006 (or PHOENIX_COLLECTOR_ENDPOINT)"
            + _partial(len(sent), len(annotations)),
        )
    except Refused as error:
        return _failed("Phoenix", base, error, len(sent), len(annotations))
    masked = sum(1 for a in sent if "score" not in a["result"])
    print(
        f"Phoenix at {base}: {len(sent)} rollouts scored {NAME!r} (a span annotation on each root span, a trace "
        "annotation on each trace" + (f"; {masked} masked: labelled, no score" if masked else "") + "); "
        "a re-send replaces them, never adds"
    )
    return _finish("Phoenix", base, len(sent), missing, skipped)


def _partial(sent: int, total: int) -> str:
    return f" ({sent} of {total} were sent before)" if sent else ""


def _failed(ui: str, base: str, error: Refused, sent: int, total: int) -> int:
    fixes = {
        401: "it wants credentials: set " + ("PHOENIX_API_KEY" if ui == "Phoenix" else "MLFLOW_TRACKING_TOKEN"),
        403: "the credentials given may not write scores there",
        404: f"is {base} {ui}'s own address "
        + ("(Phoenix >= 4.10 takes annotations)?" if ui == "Phoenix" else "(MLflow >= 3 takes assessments)?"),
    }
    fix = fixes.get(error.status, "the server's log says more")
    print(
        f"{PROG}: {ui} answered {error.status} to {error.url}: {error.body[:300]}; {fix}{_partial(sent, total)}",
        file=sys.stderr,
    )
    return 1


def _finish(ui: str, where: str, done: int, missing: list[str], skipped: Counter) -> int:
    if missing:
        print(
            f"  not in {ui}: {len(missing)} {'rollout' if len(missing) == 1 else 'rollouts'} whose trace it does not "
            f"have ({_short(missing)}): were they sent to {where}? (OTEL_TRACES_EXPORTER=otlp,files sends them "
            "and keeps the files this reads)"
        )
    for reason, count in sorted(skipped.items()):
        print(f"  skipped {count} {'rollout' if count == 1 else 'rollouts'}: {reason}")
    return 0 if done or not missing else 1


# ---- MLflow ---------------------------------------------------------------------------


def _mlflow_headers() -> dict[str, str]:
    """MLflow's own client variables: a token, else a user and password."""
    if token := os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def mlflow_assessment(r: Any) -> dict:
    """The rollout's assessment, as ``POST /api/3.0/mlflow/traces/{id}/assessments`` takes it."""
    trace_id = "tr-" + r.trace_id  # MLflow's id of a trace it took over OTLP
    assessment = {
        "assessment_name": NAME,
        "trace_id": trace_id,
        "source": {"source_type": "CODE", "source_id": SOURCE_ID},
        "feedback": {"value": r.reward},
        "metadata": _metadata(r),
    }
    if explanation := _explanation(r):
        assessment["rationale"] = explanation
    return assessment


def _ours(assessment: dict) -> bool:
    source = assessment.get("source") or {}
    return assessment.get("assessment_name") == NAME and source.get("source_id") == SOURCE_ID


def _same(old: dict, new: dict) -> bool:
    return all((old.get(key) or None) == (new.get(key) or None) for key in ("feedback", "metadata", "rationale"))


def _mlflow_one(base: str, assessment: dict) -> str:
    """``created``, ``updated``, ``unchanged`` or ``missing`` (MLflow has no such trace)."""
    trace_url = f"{base}/api/3.0/mlflow/traces/{urllib.parse.quote(assessment['trace_id'])}"
    headers = _mlflow_headers()
    status, body = request("GET", trace_url, headers=headers)
    if status == 404 and isinstance(body, dict) and body.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
        return "missing"
    if status != 200:
        raise Refused(trace_url, status, body)
    ours = [a for a in body.get("trace", {}).get("trace_info", {}).get("assessments", []) if _ours(a)]
    kept = next((a for a in ours if _same(a, assessment)), None)
    for old in ours:  # replaced, not patched: MLflow's update merges metadata, keeping stale keys
        if old is not kept:
            url = f"{trace_url}/assessments/{old['assessment_id']}"
            status, body = request("DELETE", url, headers=headers)
            if status not in (200, 404):
                raise Refused(url, status, body)
    if kept is not None:
        return "unchanged" if len(ours) == 1 else "updated"
    url = f"{trace_url}/assessments"
    status, body = request("POST", url, {"assessment": assessment}, headers)
    if status != 200:
        raise Refused(url, status, body)
    return "updated" if ours else "created"


def send_mlflow(address: str | None, rollouts: Sequence[Any]) -> int:
    base = (address or os.environ.get("MLFLOW_TRACKING_URI") or "").rstrip("/")
    if not base:
        print(
            f"{PROG}: --to mlflow needs the tracking server's URL: --to mlflow=http://HOST:5000, or set "
            "MLFLOW_TRACKING_URI",
            file=sys.stderr,
        )
        return 2
    if not base.startswith(("http://", "https://")):
        print(
            f"{PROG}: --to mlflow={base}: scores go to a tracking server over HTTP; serve that store "
            f"(mlflow server --backend-store-uri {base}) and give its URL: --to mlflow=http://HOST:5000",
            file=sys.stderr,
        )
        return 2
    assessments, skipped = [], Counter()
    for r in rollouts:
        if reason := _unscored(r, masked_scored=False):
            skipped[reason] += 1
        else:
            assessments.append(mlflow_assessment(r))
    outcomes: Counter = Counter()
    missing: list[str] = []
    started = time.monotonic()

    def count(assessment: dict, outcome: str) -> None:  # in this thread only
        outcomes[outcome] += 1
        if outcome == "missing":
            missing.append(assessment["trace_id"].removeprefix("tr-"))
        _progress("MLflow", sum(outcomes.values()), len(assessments), started)

    try:
        if assessments:  # the first alone: an unreachable server is said once
            count(assessments[0], _mlflow_one(base, assessments[0]))
        _each(lambda a: _mlflow_one(base, a), assessments[1:], count)
    except Unreachable as error:
        done = sum(outcomes.values()) - outcomes["missing"]
        return _unreachable(
            "MLflow",
            base,
            str(error),
            "start it (mlflow server ...), or give its URL: --to mlflow=http://HOST:5000 (or MLFLOW_TRACKING_URI)"
            + _partial(done, len(assessments)),
        )
    except Refused as error:
        return _failed("MLflow", base, error, sum(outcomes.values()) - outcomes["missing"], len(assessments))
    done = outcomes["created"] + outcomes["updated"] + outcomes["unchanged"]
    print(
        f"MLflow at {base}: assessment {NAME!r} on {done} rollout traces: {outcomes['created']} created, "
        f"{outcomes['updated']} updated, {outcomes['unchanged']} unchanged (a re-send updates ours, never adds)"
    )
    return _finish("MLflow", base, done, missing, skipped)


def _each(work: Callable[[Any], str], items: Sequence[Any], then: Callable[[Any, str], None]) -> None:
    """``work`` on every item, ``WORKERS`` at a time, ``then(item, result)`` in this thread,
    in order; the first exception raised cancels the rest and is raised here."""
    pool = ThreadPoolExecutor(WORKERS)
    try:
        for item, result in zip(items, pool.map(work, items)):
            then(item, result)
    finally:
        pool.shutdown(cancel_futures=True)


def send(target: str, address: str | None, rollouts: list) -> int:
    """The rewards of ``rollouts`` to ``target`` (``phoenix`` or ``mlflow``) at ``address``
    (None: the UI's own variable, else its default); prints what it did; an exit code."""
    if target == "phoenix":
        return send_phoenix(address, rollouts)
    if target == "mlflow":
        return send_mlflow(address, rollouts)
    print(f"{PROG}: --to {target}: scores go to phoenix or mlflow", file=sys.stderr)
    return 2
