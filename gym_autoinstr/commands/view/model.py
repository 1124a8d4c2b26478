"""The trace model of ``view``: spans joined by trace into ``Trace`` objects (rows
depth-first, parents before children, siblings by start), the ``gym.job`` spans and the
rollout traces linked to them, and where a trace's time went (``summary``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter

from gym_autoinstr import attributes as attr
from gym_autoinstr.commands.runs import outcome

# Roots of the processes' start-up traces (advice/startup.py): listed apart from rollouts.
STARTUP_SPANS = ("gym.startup", "gym.server.startup")
# Root of a collection job's own trace (advice/job.py); its rollouts' roots link to it.
JOB_SPAN = "gym.job"


@dataclass(slots=True)
class Row:
    span: dict
    depth: int


@dataclass
class Trace:
    trace_id: str
    spans: list[dict]
    rows: list[Row]  # depth-first, roots first

    @cached_property
    def start_ns(self) -> int:
        return min(s["start_ns"] for s in self.spans)

    @cached_property
    def end_ns(self) -> int:
        return max(s["end_ns"] for s in self.spans)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @cached_property
    def has_error(self) -> bool:
        return any(s.get("status") == "ERROR" for s in self.spans)

    @cached_property
    def rollout_ids(self) -> set[str]:
        return {str(s["attributes"][attr.ROLLOUT_ID]) for s in self.spans if attr.ROLLOUT_ID in s["attributes"]}

    @cached_property
    def services(self) -> set[str]:
        return {service(s) for s in self.spans}

    @property
    def root(self) -> dict:
        return self.rows[0].span

    @property
    def span_count(self) -> int:
        return len(self.spans)

    @property
    def top_spans(self) -> list[dict]:
        """The trace's spans without a parent among its spans (its root first)."""
        return [r.span for r in self.rows if r.depth == 0]

    def seams_ms(self) -> dict[str, float]:
        return summary(self)

    def has_attribute(self, key: str, value: str) -> bool:
        """Whether a span (or its resource) has attribute ``key`` equal to ``value`` as text."""
        for span in self.spans:
            for attributes in (span.get("attributes") or {}, span.get("resource") or {}):
                if key in attributes and _text(attributes[key]) == value:
                    return True
        return False

    @cached_property
    def is_startup(self) -> bool:
        """A process's start-up (``gym env start``, a server coming up), not a rollout."""
        return any(r.depth == 0 and r.span["name"].startswith(STARTUP_SPANS) for r in self.rows)

    @cached_property
    def is_job(self) -> bool:
        """A collection job's own trace (its ``gym.job`` span), not one of its rollouts."""
        return any(r.depth == 0 and r.span["name"] == JOB_SPAN for r in self.rows)

    @property
    def is_rollout(self) -> bool:
        """Neither a start-up nor a job's own trace: what ``--slowest`` ranks and the page's
        duration chart counts."""
        return not self.is_startup and not self.is_job

    @cached_property
    def tokens(self) -> tuple[int, int] | None:
        """Model tokens in and out, each call counted once (``outcome.tokens``); None when
        no span has them."""
        return outcome.tokens(self.rows)

    @property
    def total_tokens(self) -> int | None:
        return sum(self.tokens) if self.tokens else None

    @cached_property
    def reward(self) -> float | None:
        """The verifier's reward: on the root, else ``gym.rollout``, else ``gym.verify``."""
        return outcome.reward(self.rows)

    @cached_property
    def mask_sample(self) -> bool | None:
        """True when the reward is not a valid measurement (Gym 0.7's ``mask_sample``)."""
        return outcome.mask_sample(self.rows)

    @cached_property
    def task_index(self) -> int | None:
        """The task's index in the collection run's input (``_ng_task_index``)."""
        return outcome.index(self.rows, attr.TASK_INDEX)

    @cached_property
    def rollout_index(self) -> int | None:
        """Which repeat of its task the rollout is (``_ng_rollout_index``)."""
        return outcome.index(self.rows, attr.ROLLOUT_INDEX)

    @property
    def failure(self) -> dict[str, str]:
        """``error_type`` and ``stage`` of the rollout's failure, those its spans say."""
        return outcome.failure(self.rows)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def service(span: dict) -> str:
    return str((span.get("resource") or {}).get(attr.SERVICE_NAME, "?"))


def short_service(name: str) -> str:
    return name.removeprefix("nemo-gym/")


def duration_ms(span: dict) -> float:
    return max(0, span["end_ns"] - span["start_ns"]) / 1e6


def callee(span: dict) -> str:
    """``→ server /route`` for a CLIENT span: the Gym server it called and the route, else
    the host and path it called ("" for other spans, or when nothing says)."""
    if span.get("kind") != "CLIENT":
        return ""
    attributes = span.get("attributes") or {}
    server = attributes.get(attr.DESTINATION)
    route = attributes.get(attr.DESTINATION_ROUTE)
    if server is None or route is None:  # older files, or a call outside the fleet
        url = str(attributes.get(attr.URL_FULL) or "")
        rest = url.partition("://")[2] if "://" in url else url
        host, slash, path = rest.partition("/")
        server = server or attributes.get(attr.SERVER_ADDRESS) or host or None
        if route is None and slash:
            path = "/" + path
            if path.startswith("/ng-rollout/"):
                path = "/" + path[len("/ng-rollout/") :].partition("/")[2]
            route = path
    if not server and not route:
        return ""
    return "→ " + " ".join(str(part) for part in (server, route) if part)


def display_name(span: dict) -> str:
    """A CLIENT span as its method and callee (``POST → agent /run``: its name,
    ``POST /run``, would say the route twice), any other span by its name."""
    target = callee(span)
    if not target:
        return span["name"]
    method = (span.get("attributes") or {}).get(attr.HTTP_REQUEST_METHOD)
    return f"{method or span['name']} {target}"


_START = itemgetter("start_ns")


def build_traces(spans: Iterable[dict]) -> list[Trace]:
    by_trace: dict[str, dict[str, dict]] = defaultdict(dict)
    for span in spans:
        # keyed by span id: the same file read twice (a directory and a file in it) shows each span once
        by_trace[span["trace_id"]][span["span_id"]] = span
    traces = []
    for trace_id, by_id in by_trace.items():
        children: dict[str, list[dict]] = defaultdict(list)
        roots = []
        for span in by_id.values():
            parent = span.get("parent_span_id")
            if parent in by_id:
                children[parent].append(span)
            else:
                roots.append(span)
        rows: list[Row] = []
        # depth-first without recursion: a deep trace must not hit the recursion limit
        roots.sort(key=_START)
        stack = [(root, 0) for root in reversed(roots)]
        while stack:
            span, depth = stack.pop()
            rows.append(Row(span, depth))
            kids = children.get(span["span_id"])
            if kids:
                kids.sort(key=_START)
                stack.extend([(child, depth + 1) for child in reversed(kids)])
        traces.append(Trace(trace_id, list(by_id.values()), rows))
    traces.sort(key=lambda t: t.start_ns)
    return traces


@dataclass
class Job:
    """A root ``gym.job`` span, its own trace, and the rollout traces linked to it."""

    span: dict
    trace: Trace | None = None  # the job's own trace, when selected
    rollouts: list[Trace] = field(default_factory=list)  # its linked rollout traces that are selected
    linked: int = 0  # its linked rollout traces in the run, selected or not

    @property
    def job_id(self) -> str:
        return str(self.span["attributes"].get(attr.JOB_ID, self.span["span_id"]))

    @property
    def traces(self) -> list[Trace]:
        """What is drawn under the job line: its own trace unless it is the job span alone
        (the line says it all), then its rollouts."""
        own = [self.trace] if self.trace is not None and self.trace.span_count > 1 else []
        return own + self.rollouts


def _linked_job(trace: Trace, jobs: dict[tuple[str, str], Job]) -> Job | None:
    for span in trace.top_spans:
        for link in span.get("links") or ():
            job = jobs.get((link.get("trace_id"), link.get("span_id")))
            if job is not None:
                return job
    return None


def group_by_job(traces: Sequence[Trace], everything: Sequence[Trace]) -> list[Job | Trace]:
    """``traces`` in order, with each job's own trace and every trace whose root links to
    the job's ``gym.job`` span (found in ``everything``) gathered under one job line.

    A job counts its linked rollout traces in ``everything`` (``Job.linked``), so its line
    says how many it has whichever of them ``traces`` holds."""
    jobs: dict[tuple[str, str], Job] = {}
    for trace in everything:
        for span in trace.top_spans:
            if span["name"] == JOB_SPAN:
                jobs[(span["trace_id"], span["span_id"])] = Job(span)
    if not jobs:
        return list(traces)
    own = {job.span["trace_id"]: job for job in jobs.values()}
    linked: dict[str, Job] = {}
    for trace in everything:
        if trace.trace_id not in own:
            job = _linked_job(trace, jobs)
            if job is not None:
                linked[trace.trace_id] = job
                job.linked += 1
    items: list[Job | Trace] = []
    shown: set[int] = set()
    for trace in traces:
        job = own.get(trace.trace_id)
        if job is not None:
            job.trace = trace
        else:
            job = linked.get(trace.trace_id)
            if job is None:
                items.append(trace)
                continue
            job.rollouts.append(trace)
        if id(job) not in shown:
            shown.add(id(job))
            items.append(job)
    return items


def _server_type(span: dict) -> str:
    return str((span.get("resource") or {}).get(attr.SERVER_TYPE, ""))


def summary(trace: Trace) -> dict[str, float]:
    """Milliseconds of the trace spent in model calls, tools and verify.

    Counted from the SERVER spans of the callee (what the model server, or the
    resources server, spent on the request), so nested spans are not counted twice.
    """
    totals = {"total": trace.duration_ms, "model": 0.0, "tools": 0.0, "verify": 0.0}
    for span in trace.spans:
        if span.get("kind") != "SERVER":
            continue
        route = str(span["attributes"].get(attr.HTTP_ROUTE) or span["name"].partition(" ")[2])
        kind = _server_type(span)
        if kind == "responses_api_models":
            totals["model"] += duration_ms(span)
        elif kind == "resources_servers":
            if route.endswith("/verify"):
                totals["verify"] += duration_ms(span)
            elif not route.endswith(("/seed_session", "/aggregate_metrics")):
                totals["tools"] += duration_ms(span)
    return totals
