"""``view`` in the terminal: the list (a line per trace, job lines above their rollouts,
start-up traces apart), one trace as a waterfall, and the records ``--json`` prints.

The list's ``reward`` column is the trace's reward (``Trace.reward``), blank without one,
``*`` after a masked sample's (a footnote under the list says so); its ``tokens`` column
is tokens in/out, each model call counted once (``outcome.tokens``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from gym_autoinstr import attributes as attr
from gym_autoinstr.commands.view.model import (
    Job,
    Trace,
    callee,
    display_name,
    duration_ms,
    service,
    short_service,
)

KEY_ATTRIBUTES = (
    (attr.ROLLOUT_ID, "rollout"),
    (attr.HTTP_ROUTE, "route"),
    (attr.HTTP_RESPONSE_STATUS_CODE, "status"),
    (attr.REQUEST_MODEL, "model"),
    (attr.INPUT_TOKENS, "in_tokens"),
    (attr.OUTPUT_TOKENS, "out_tokens"),
    (attr.ROLLOUT_INPUT_TOKENS, "rollout_in_tokens"),
    (attr.ROLLOUT_OUTPUT_TOKENS, "rollout_out_tokens"),
    (attr.ERROR_TYPE, "error"),
    (attr.FAILURE_STAGE, "stage"),
    (attr.REWARD, "reward"),
    (attr.MASK_SAMPLE, "masked"),
    (attr.TASK_INDEX, "task"),
    (attr.ROLLOUT_INDEX, "repeat"),
    (attr.RAY_TASK_WAIT, "wait"),
    (attr.RAY_NODE_ID, "node"),
)

ELLIPSIS = "…"
UNLIMITED = 1_000_000  # columns: no terminal to fit


def _shown(key: str, value: object) -> str:
    if key == attr.RAY_TASK_WAIT and isinstance(value, (int, float)):
        return f"{value * 1000:.1f}ms"  # how long the Ray task waited to start
    if key == attr.RAY_NODE_ID:
        return str(value)[:8]
    return str(value)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, an ellipsis marking what was cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else ""


def count(number: int, noun: str) -> str:
    """``1 trace``, ``2 traces``: a number and its noun, plural unless the number is 1."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _linked_text(job: Job) -> str:
    linked, shown = job.linked, len(job.rollouts)
    if not linked:
        return "no linked rollout traces"
    if shown == linked:
        return count(linked, "linked rollout trace") + " below"
    return count(linked, "linked rollout trace") + (f", {shown} of them below" if shown else ", none of them below")


def job_line(job: Job) -> str:
    attributes = job.span.get("attributes") or {}
    counts = " ".join(
        f"{label}={attributes[key]}"
        for key, label in (
            (attr.JOB_ROLLOUTS_SENT, "sent"),
            (attr.JOB_ROLLOUTS_FAILED, "failed"),
            (attr.JOB_NUM_REPEATS, "repeats"),
        )
        if key in attributes
    )
    return (
        f"job {job.job_id}  {service(job.span)}  {duration_ms(job.span):.1f} ms  {counts}".rstrip()
        + f"  | {_linked_text(job)} (job trace {job.span['trace_id']})"
    )


def summary_text(trace: Trace) -> str:
    parts = trace.seams_ms()
    return (
        f"total {parts['total']:.1f} ms | model {parts['model']:.1f} ms | tools {parts['tools']:.1f} ms"
        f" | verify {parts['verify']:.1f} ms"
    )


def _key_attributes(span: dict) -> str:
    attributes = span.get("attributes") or {}
    return " ".join(f"{label}={_shown(key, attributes[key])}" for key, label in KEY_ATTRIBUTES if key in attributes)


# ----------------------------------------------------------------------------- the list


def clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def duration_text(ms: float) -> str:
    if ms >= 100_000:
        return f"{ms / 1000:.0f} s"
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.1f} ms"


def tokens_text(trace: Trace) -> str:
    return f"{trace.tokens[0]}/{trace.tokens[1]}" if trace.tokens else ""


MASKED_MARK = "*"
MASKED_NOTE = "* masked sample (nemo.gym.mask_sample): its reward is not a valid measurement"


def number_text(value: float) -> str:
    """A reward as read: up to three decimals, at least one (``0.0``, ``1.0``, ``0.333``)."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value and abs(value) < 0.001:
        return f"{value:.1e}"
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def reward_text(trace: Trace) -> str:
    """The trace's reward, marked ``*`` when the sample is masked; "" without one."""
    if trace.reward is None:
        return ""
    return number_text(trace.reward) + (MASKED_MARK if trace.mask_sample else "")


def status_text(trace: Trace) -> str:
    return "ERROR" if trace.has_error else "ok"


ID_SHOWN = 12  # characters of a trace id in the list: enough to be unique, and a --trace prefix


def list_lines(traces: Sequence[Trace], width: int) -> list[str]:
    """A header and one line per trace, each at most ``width`` columns."""
    rollout_width = min(max([len(", ".join(sorted(t.rollout_ids))) for t in traces] + [7]), 14)
    reward_width = min(max([len(reward_text(t)) for t in traces] + [6]), 12)
    token_width = min(max([len(tokens_text(t)) for t in traces] + [6]), 15)
    fixed = 12 + 2 + ID_SHOWN + 2 + 9 + 2 + 5 + 2 + 6 + 2 + rollout_width + 2 + reward_width + 2 + token_width + 2
    roots = [display_name(t.root) for t in traces]
    services = [",".join(sorted(short_service(s) for s in t.services)) for t in traces]
    root_width = max(4, min(max([len(r) for r in roots] + [4]), max(12, (width - fixed) * 3 // 5)))

    def line(start, trace_id, took, spans, status, rollout, reward, tokens, root, names) -> str:
        text = (
            f"{start:<12}  {trace_id:<{ID_SHOWN}}  {took:>9}  {spans:>5}  {status:<6}  "
            f"{cut(rollout, rollout_width):<{rollout_width}}  {cut(reward, reward_width):>{reward_width}}  "
            f"{tokens:>{token_width}}  "
            f"{cut(root, root_width):<{root_width}}  {names}"
        )
        return cut(text.rstrip(), width)

    heads = ("start (UTC)", "trace", "duration", "spans", "status", "rollout", "reward", "tokens", "root", "services")
    lines = [line(*heads)]
    for trace, root, names in zip(traces, roots, services):
        lines.append(
            line(
                clock(trace.start_ns),
                trace.trace_id[:ID_SHOWN],
                duration_text(trace.duration_ms),
                str(trace.span_count),
                status_text(trace),
                ", ".join(sorted(trace.rollout_ids)),
                reward_text(trace),
                tokens_text(trace),
                root,
                names,
            )
        )
    return lines


def render_list(items: Sequence[Job | Trace], startup: Sequence[Trace], width: int) -> list[str]:
    """The run as a list: its traces (job lines above their rollouts), then the start-up
    traces apart."""
    traces: list[Trace] = []
    for item in items:
        traces.extend(item.traces if isinstance(item, Job) else [item])
    lines: list[str] = []
    if traces:
        table = iter(list_lines(traces, width))
        lines.append(next(table))
        for item in items:
            if isinstance(item, Job):
                lines.append(cut(job_line(item), width))
                lines.extend(next(table) for _ in item.traces)
            else:
                lines.append(next(table))
    if startup:
        if lines:
            lines.append("")
        lines.append(cut(f"start-up traces (processes starting, not rollouts): {len(startup)}", width))
        lines.extend(list_lines(startup, width))
    lines.append("")
    if any(t.mask_sample and t.reward is not None for t in traces + list(startup)):
        lines.append(cut(MASKED_NOTE, width))
    lines.append(cut("one trace as a waterfall: --trace ID (any unique prefix) or --rollout ID", width))
    if any(t.task_index is not None for t in traces):
        lines.append(cut("per task (rollouts, mean reward, p50/p95 duration, failures): --by-task", width))
    return lines


def trace_record(trace: Trace, *, with_spans: bool = False) -> dict:
    """The trace for ``--json``: its list line's fields (and its spans, depth-first)."""
    record = {
        "trace_id": trace.trace_id,
        "start_ns": trace.start_ns,
        "start": datetime.fromtimestamp(trace.start_ns / 1e9, tz=timezone.utc).isoformat(),
        "duration_ms": trace.duration_ms,
        "root": trace.root["name"],
        "services": sorted(trace.services),
        "span_count": trace.span_count,
        "status": "error" if trace.has_error else "ok",
        "tokens": {"input": trace.tokens[0], "output": trace.tokens[1], "total": trace.total_tokens}
        if trace.tokens
        else None,
        "reward": trace.reward,
        "mask_sample": trace.mask_sample,
        "task_index": trace.task_index,
        "rollout_index": trace.rollout_index,
        "failure": trace.failure or None,
        "rollout_ids": sorted(trace.rollout_ids),
        "startup": trace.is_startup,
        "summary_ms": trace.seams_ms(),
    }
    if with_spans:
        record["spans"] = [{**row.span, "depth": row.depth, "callee": callee(row.span) or None} for row in trace.rows]
    return record


# ----------------------------------------------------------------------------- a waterfall


def render_text(trace: Trace, *, bar_width: int = 24, width: int | None = None) -> str:
    """The trace as a waterfall; each line at most ``width`` columns when given."""
    start, total = trace.start_ns, max(trace.end_ns - trace.start_ns, 1)
    limit = width if width is not None else 10_000
    rollouts = ", ".join(sorted(trace.rollout_ids))
    lines = [
        cut(
            f"trace {trace.trace_id}  {count(len(trace.spans), 'span')}, {count(len(trace.services), 'service')}"
            + (f", rollout {rollouts}" if rollouts else "")
            + (f", task {trace.task_index}" if trace.task_index is not None else "")
            + (f" repeat {trace.rollout_index}" if trace.rollout_index is not None else "")
            + (f", reward {number_text(trace.reward)}" if trace.reward is not None else "")
            + (" (masked sample)" if trace.reward is not None and trace.mask_sample else "")
            + (", ERROR" if trace.has_error else ""),
            limit,
        ),
        cut(f"  {summary_text(trace)}", limit),
    ]
    names = ["  " * r.depth + display_name(r.span) for r in trace.rows]
    service_width = max(len(service(r.span)) for r in trace.rows)
    name_width = max(len(n) for n in names)
    if width is not None:
        service_width = min(service_width, max(10, width // 4))
        bar_width = min(bar_width, max(8, width // 8))
        fixed = 2 + service_width + 2 + 2 + 24 + 2 + bar_width + 7
        name_width = min(name_width, max(16, width - fixed - 8))  # names first, attributes in what is left
    for row, name in zip(trace.rows, names):
        span = row.span
        offset = (span["start_ns"] - start) / 1e6
        left = min(int(bar_width * (span["start_ns"] - start) / total), bar_width - 1)
        bar_len = max(1, int(round(bar_width * (span["end_ns"] - span["start_ns"]) / total)))
        bar = " " * left + "█" * min(bar_len, bar_width - left)
        status = "ERROR" if span.get("status") == "ERROR" else ""
        text = (
            f"  {cut(service(span), service_width):<{service_width}}  {cut(name, name_width):<{name_width}}"
            f"  +{offset:8.1f} ms {duration_ms(span):8.1f} ms |{bar:<{bar_width}}| {status:<5} {_key_attributes(span)}"
        )
        lines.append(cut(text.rstrip(), limit))
    return "\n".join(lines)
