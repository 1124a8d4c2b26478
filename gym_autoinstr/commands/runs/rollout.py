"""A trace as the table knows it (``Rollout``): its row of ``facts``, read the way ``view``
reads a ``model.Trace`` (the list, the filters, ``--by-task``, the page's index take
either), without its spans."""

from __future__ import annotations

from gym_autoinstr import attributes as attr
from gym_autoinstr.commands.runs import facts as f

# Where the fields of a top span's entry (``facts._top_entry``) are
_T_START, _T_SPAN, _T_NAME, _T_KIND, _T_END, _T_ATTRIBUTES, _T_LINKS, _T_SERVICE, _T_ERROR = range(9)


class NeedsSpans(LookupError):
    """A question the table cannot answer (an attribute it does not keep): read the spans."""


def _span(trace_id: str, entry: tuple) -> dict:
    return {
        "trace_id": trace_id,
        "span_id": entry[_T_SPAN],
        "parent_span_id": None,
        "name": entry[_T_NAME],
        "kind": entry[_T_KIND],
        "start_ns": entry[_T_START],
        "end_ns": entry[_T_END],
        "status": "ERROR" if entry[_T_ERROR] else "UNSET",
        "attributes": dict(entry[_T_ATTRIBUTES]),
        "resource": {attr.SERVICE_NAME: entry[_T_SERVICE]},
        "links": [{"trace_id": t, "span_id": s} for t, s in entry[_T_LINKS]],
    }


class Rollout:
    """One trace's row, from the run ``run`` (a run directory's name in a campaign), read
    from ``source`` (``store.Run``: where its files are; None for standard input)."""

    __slots__ = ("row", "run", "source", "linked_job")

    def __init__(self, row: tuple, run: str, source: object) -> None:
        self.row, self.run, self.source = row, run, source
        self.linked_job: str | None = None  # the job whose gym.job span the root links to (``link_jobs``)

    trace_id = property(lambda self: self.row[f.R_TRACE])
    start_ns = property(lambda self: self.row[f.R_START])
    end_ns = property(lambda self: self.row[f.R_END])
    span_count = property(lambda self: self.row[f.R_COUNT])
    has_error = property(lambda self: self.row[f.R_ERROR])
    reward = property(lambda self: self.row[f.R_REWARD])
    mask_sample = property(lambda self: self.row[f.R_MASK])
    task_index = property(lambda self: self.row[f.R_TASK])
    rollout_index = property(lambda self: self.row[f.R_REPEAT])
    tokens = property(lambda self: self.row[f.R_TOKENS])
    files = property(lambda self: self.row[f.R_FILES])

    @property
    def duration_ms(self) -> float:
        return (self.row[f.R_END] - self.row[f.R_START]) / 1e6

    @property
    def services(self) -> set[str]:
        return set(self.row[f.R_SERVICES])

    @property
    def rollout_ids(self) -> set[str]:
        return set(self.row[f.R_ROLLOUT_IDS])

    @property
    def failure(self) -> dict[str, str]:
        return dict(self.row[f.R_FAILURE])

    @property
    def total_tokens(self) -> int | None:
        tokens = self.row[f.R_TOKENS]
        return sum(tokens) if tokens else None

    @property
    def root(self) -> dict:
        return _span(self.trace_id, self.row[f.R_ROOT])

    @property
    def top_spans(self) -> list[dict]:
        """The trace's spans without a parent (its root first), as ``view`` names them."""
        return [_span(self.trace_id, entry) for entry in self.row[f.R_TOPS]]

    @property
    def is_startup(self) -> bool:
        return self.row[f.R_KIND] == f.STARTUP

    @property
    def is_job(self) -> bool:
        return self.row[f.R_KIND] == f.JOB

    @property
    def is_rollout(self) -> bool:
        return self.row[f.R_KIND] == f.ROLLOUT

    @property
    def job_id(self) -> str | None:
        """The collection job the rollout belongs to (its root's ``nemo.gym.job.id``), or the
        job whose own trace this is."""
        return self.row[f.R_JOB] or self.linked_job

    def seams_ms(self) -> dict[str, float]:
        model, tools, verify = self.row[f.R_SEAMS]
        return {"total": self.duration_ms, "model": model, "tools": tools, "verify": verify}

    def has_attribute(self, key: str, value: str) -> bool:
        if key not in f.TAG_KEYS:
            raise NeedsSpans(key)
        return f"{key}={value}" in self.row[f.R_TAGS]


def link_jobs(rollouts: list[Rollout]) -> None:
    """A rollout whose root names no job (files of older versions) belongs to the job whose
    ``gym.job`` span its root links to."""
    jobs = {}
    for rollout in rollouts:
        for entry in rollout.row[f.R_TOPS]:
            if entry[_T_NAME] == f.JOB_SPAN:
                jobs[(rollout.trace_id, entry[_T_SPAN])] = str(entry[_T_ATTRIBUTES].get(attr.JOB_ID, entry[_T_SPAN]))
    if not jobs:
        return
    for rollout in rollouts:
        if rollout.job_id is None:
            for entry in rollout.row[f.R_TOPS]:
                for link in entry[_T_LINKS]:
                    if tuple(link) in jobs:
                        rollout.linked_job = jobs[tuple(link)]
