"""What a row of ``export`` says: a rollout's (``ROLLOUT_COLUMNS``, from its row in the
``runs`` table: no span is read) or a span's (``SPAN_COLUMNS``, from the span files).

A record is a plain tuple in its columns' order, the values as Python has them (``None``
where the trace does not say); a format writes it as its kind says (``formats``): a
``timestamp`` column holds nanoseconds since the epoch (Parquet: a UTC timestamp; text: an
ISO time), a ``list`` column a tuple of strings (CSV: joined with ``;``)."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from gym_autoinstr import attributes as attr
from gym_autoinstr.commands.runs import facts as f


class Column(NamedTuple):
    name: str
    kind: str  # string, int, float, bool, timestamp, list
    about: str


# Attributes the table keeps (``facts.TAG_KEYS``) that a user filters on, as columns; a
# trace with several values of one (two models) has them joined with ``;``.
TAG_COLUMNS = {
    attr.REQUEST_MODEL: Column("request_model", "string", "the model asked for (gen_ai.request.model)"),
    attr.AGENT_NAME: Column("agent_name", "string", "the agent (gen_ai.agent.name)"),
    attr.RUN_ID: Column("gym_run_id", "string", "Gym's run id of the processes (nemo.gym.run.id)"),
}

ROLLOUT_COLUMNS = (
    Column("trace_id", "string", "the trace's id (32 hex digits): gym-autoinstr view RUN --trace ID draws it"),
    Column("run", "string", "the run directory it was read from (in a campaign folder: its name below the folder)"),
    Column("job_id", "string", "the collection job (nemo.gym.job.id); empty for a rollout sent outside a job"),
    Column("task_index", "int", "the task: Gym's output row's _ng_task_index"),
    Column("rollout_index", "int", "the task's repeat: Gym's output row's _ng_rollout_index"),
    Column("reward", "float", "the verifier's reward (a masked sample's too)"),
    Column("mask_sample", "bool", "the reward is not a valid measurement (Gym 0.7+); empty when not said"),
    Column("failed", "bool", "a span of the trace has an error status"),
    Column("error_type", "string", "the earliest error.type in the trace"),
    Column("failure_stage", "string", "where it failed (nemo.gym.failure.stage: model, tool, verify, ...)"),
    Column("input_tokens", "int", "model tokens in, each model call counted once"),
    Column("output_tokens", "int", "model tokens out"),
    Column("duration_ms", "float", "the trace's first span start to its last span end"),
    Column("model_ms", "float", "time in the model server (its SERVER spans, added up)"),
    Column("tools_ms", "float", "time in the resources server's tool routes"),
    Column("verify_ms", "float", "time in the resources server's /verify"),
    Column("start", "timestamp", "the trace's start, UTC (text formats: ISO 8601, microseconds)"),
    Column("start_ns", "int", "the same, in nanoseconds since the epoch"),
    Column("span_count", "int", "spans in the trace"),
    Column("services", "list", "the services its spans came from (CSV: joined with ;)"),
    Column("rollout_id", "string", "Gym's rollout id (nemo.gym.rollout.id, Gym 0.7+)"),
    Column("root_span_id", "string", "the trace's root span: what a UI annotates"),
    Column("root_name", "string", "the root span's name"),
    Column("trace_kind", "string", "rollout; with --all-traces also startup (a process starting) and job (gym.job)"),
    *TAG_COLUMNS.values(),
)

SPAN_COLUMNS = (
    Column("trace_id", "string", "the span's trace"),
    Column("span_id", "string", "the span's id (16 hex digits)"),
    Column("parent_span_id", "string", "its parent's id; empty for a root"),
    Column("name", "string", "the span's name"),
    Column("kind", "string", "SERVER, CLIENT, INTERNAL, PRODUCER, CONSUMER"),
    Column("service", "string", "the process's service.name"),
    Column("start", "timestamp", "the span's start, UTC"),
    Column("start_ns", "int", "its start, nanoseconds since the epoch"),
    Column("end_ns", "int", "its end"),
    Column("duration_ms", "float", "end minus start"),
    Column("status", "string", "UNSET, OK or ERROR"),
    Column("attributes", "string", "the span's attributes, a JSON object"),
    Column("run", "string", "its trace's run directory"),
    Column("job_id", "string", "its trace's collection job"),
    Column("task_index", "int", "its trace's task (_ng_task_index)"),
    Column("rollout_index", "int", "its trace's repeat (_ng_rollout_index)"),
)


def _joined(values: list[str] | None) -> str | None:
    return None if not values else ";".join(values)


_TAG_PREFIXES = tuple(f"{key}=" for key in TAG_COLUMNS)


def _tag_values(tags: tuple[str, ...]) -> list[str | None]:
    """The ``TAG_COLUMNS`` values of a row's tags (``key=value`` strings, sorted: a key's
    are found by bisection, not by reading the twenty-odd tags of a rollout)."""
    values = []
    for prefix in _TAG_PREFIXES:
        at = bisect_left(tags, prefix)
        found = []
        while at < len(tags) and tags[at].startswith(prefix):
            found.append(tags[at][len(prefix) :])
            at += 1
        values.append(_joined(found))
    return values


def trace_kind(rollout) -> str:
    return "startup" if rollout.is_startup else "job" if rollout.is_job else "rollout"


def rollout_record(rollout) -> tuple:
    """A ``Rollout``'s row as a ``ROLLOUT_COLUMNS`` record."""
    row = rollout.row
    failure = dict(row[f.R_FAILURE])
    tokens = row[f.R_TOKENS] or (None, None)
    model, tools, verify = row[f.R_SEAMS]
    start = row[f.R_START]
    ids = row[f.R_ROLLOUT_IDS]
    root = rollout.root
    return (
        row[f.R_TRACE],
        rollout.run,
        rollout.job_id,
        row[f.R_TASK],
        row[f.R_REPEAT],
        row[f.R_REWARD],
        row[f.R_MASK],
        row[f.R_ERROR],
        failure.get("error_type"),
        failure.get("stage"),
        tokens[0],
        tokens[1],
        (row[f.R_END] - start) / 1e6,
        model,
        tools,
        verify,
        start,
        start,
        row[f.R_COUNT],
        row[f.R_SERVICES],
        _joined(list(ids)),
        root["span_id"],
        root["name"],
        trace_kind(rollout),
        *_tag_values(row[f.R_TAGS]),
    )


def _files_of(chosen: Iterable) -> dict[tuple[int, int], tuple[object, set[str]]]:
    """For each span file holding some of the ``chosen`` traces (by its source's place and
    its own): the source and those traces' ids."""
    wanted: dict[tuple[int, int], tuple[object, set[str]]] = {}
    for rollout in chosen:
        if rollout.source is None:
            continue
        for index in rollout.files:
            key = (id(rollout.source), index)
            if key not in wanted:
                wanted[key] = (rollout.source, set())
            wanted[key][1].add(rollout.trace_id)
    return wanted


# Below this many traces wanted from one file, a line is parsed only when it names one of
# them (``facts.trace_spans``); above it, every line is parsed (the substring tests would
# cost more than the parse).
FEW_TRACES = 64


def _spans_of_file(path: Path, ids: set[str]) -> Iterator[dict]:
    from gym_autoinstr.setup.files import json_lines, segment_lines, spans_from_request

    if len(ids) <= FEW_TRACES:
        yield from f.trace_spans(segment_lines(path), ids)
        return
    for request in json_lines(segment_lines(path), str(path)):
        for span in spans_from_request(request):
            if span["trace_id"] in ids:
                yield span


def span_records(campaign, chosen: list) -> Iterator[tuple]:
    """The ``SPAN_COLUMNS`` records of every span of the ``chosen`` traces, a file at a time
    (what ``Campaign.spans_of`` reads, without holding more than one file's spans): a
    trace's spans come file by file, not in start order."""
    context = {r.trace_id: (r.run, r.job_id, r.task_index, r.rollout_index) for r in chosen}
    spans = (s for s in campaign.stdin_spans if s["trace_id"] in context)
    for span in spans:
        yield _span_record(span, context[span["trace_id"]])
    for (_source, index), (source, ids) in _files_of(chosen).items():
        for span in _spans_of_file(source.files[index], ids):
            yield _span_record(span, context[span["trace_id"]])


def _span_record(span: dict, context: tuple) -> tuple:
    start, end = span["start_ns"], span["end_ns"]
    return (
        span["trace_id"],
        span["span_id"],
        span["parent_span_id"],
        span["name"],
        span["kind"],
        span["resource"].get(attr.SERVICE_NAME),
        start,
        start,
        end,
        (end - start) / 1e6,
        span["status"],
        json.dumps(span["attributes"], separators=(",", ":"), default=str),
        *context,
    )
