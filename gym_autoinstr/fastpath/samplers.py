"""The samplers our fast paths know: the job-keeping wrapper the configurator installs
(``telemetry/sampling.py`` says why a job is always kept), and what the SDK's stock
samplers decide, read off their objects, so that a fast path can skip asking them
(``lean.py`` for new spans, ``telemetry/sampling.py`` for children of a dropped parent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

from gym_autoinstr import settings
from gym_autoinstr.attributes import JOB_ID, TASK_INDEX
from gym_autoinstr.fastpath import contract

JOB_SPAN_NAME = "gym.job"


def _task_trace_id(job_id: Any, task_index: Any) -> int:
    """A stand-in trace id the same for every repeat of one task of one job: what a ratio
    sampler (which decides on a trace id's low 64 bits) is asked about, so that it keeps or
    drops the task's repeats together, and tasks at its ratio."""
    digest = hashlib.blake2b(f"{job_id}\x00{task_index}".encode(), digest_size=16).digest()
    return int.from_bytes(digest, "big")


class JobKeepingSampler(Sampler):
    """The configured sampler, except that a root ``gym.job`` is always kept; and with
    ``GYM_AUTOINSTR_SAMPLING_UNIT=task``, a collection job's rollout root is decided on its
    job and task (every repeat of a task alike) instead of its own trace id."""

    def __init__(self, delegate: Sampler, by_task: bool | None = None) -> None:
        self.delegate = delegate
        self.by_task = settings.SAMPLING_UNIT.read() == "task" if by_task is None else by_task

    def should_sample(
        self,
        parent_context: Any | None,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Sequence[Any] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name == JOB_SPAN_NAME and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        if self.by_task and attributes:
            task_index = attributes.get(TASK_INDEX)
            job_id = attributes.get(JOB_ID)
            if (
                task_index is not None
                and job_id is not None
                and not trace.get_current_span(parent_context).get_span_context().is_valid
            ):
                trace_id = _task_trace_id(job_id, task_index)
        return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        unit = ",by task" if self.by_task else ""
        return f"JobKeepingSampler{{{self.delegate.get_description()}{unit}}}"


FAST_PATH_ENV = settings.DROPPED_FAST_PATH.name


def _drops_under_unsampled_parent(sampler: Any) -> bool:
    if not settings.DROPPED_FAST_PATH.read():
        return False
    return _parent_delegates_decide(
        sampler, Decision.DROP, contract.REMOTE_PARENT_NOT_SAMPLED, contract.LOCAL_PARENT_NOT_SAMPLED
    )


def keeps_under_sampled_parent(sampler: Any) -> bool:
    """Whether ``sampler`` answers every span whose parent is valid and sampled, local or
    remote, with the SDK's ``ALWAYS_ON`` answer (recorded and sampled, the span's own
    attributes, the parent's trace state), whatever its name, kind, attributes and links:
    the stock ``ParentBased`` (every ``parentbased_*`` choice) with the SDK's defaults for
    sampled parents.  The lean tracer then starts such a span without asking it."""
    return _parent_delegates_decide(
        sampler, Decision.RECORD_AND_SAMPLE, contract.REMOTE_PARENT_SAMPLED, contract.LOCAL_PARENT_SAMPLED
    )


def _parent_delegates_decide(sampler: Any, decision: Any, *delegates: str) -> bool:
    """Whether ``sampler`` (inside our job-keeping wrapper or not: it keeps only parentless
    job spans) is ``ParentBased``'s own ``should_sample`` whose named delegates are static
    samplers answering ``decision``.  A subclass with its own should_sample may decide
    otherwise: it is asked."""
    from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler

    if not contract.part_on(contract.SAMPLERS):
        return False
    if isinstance(sampler, JobKeepingSampler):
        sampler = sampler.delegate
    if not isinstance(sampler, ParentBased) or type(sampler).should_sample is not ParentBased.should_sample:
        return False
    return all(
        isinstance(d, StaticSampler) and getattr(d, contract.STATIC_DECISION, None) is decision
        for d in (getattr(sampler, name, None) for name in delegates)
    )


def _stock_parent_based(sampler: Any) -> bool:
    """``ParentBased`` itself, or the SDK's ``ParentBasedTraceIdRatio`` (what
    ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` makes), a subclass that only chooses
    the root sampler."""
    from opentelemetry.sdk.trace import sampling as sdk_sampling

    cls = type(sampler)
    return cls is sdk_sampling.ParentBased or (
        cls is getattr(sdk_sampling, "ParentBasedTraceIdRatio", None) and "should_sample" not in vars(cls)
    )


class RootDecision(NamedTuple):
    """How a sampler decides a root on its trace id alone: dropped when ``trace_id & mask
    >= bound`` and its name is not ``kept``, sampled otherwise."""

    mask: int
    bound: int
    kept: str | None  # gym.job when the job-keeping wrapper is there, else None


def root_decision(sampler: Any) -> RootDecision | None:
    """When ``sampler`` decides a root span by its trace id alone (``parentbased_traceidratio``,
    ``parentbased_always_off``, either wrapped in ``JobKeepingSampler`` deciding by rollout): ``(mask, bound,
    kept)``, where a root is dropped when ``trace_id & mask >= bound`` and its name is not
    ``kept`` (``gym.job`` when the job-keeping wrapper is there, else None), sampled
    otherwise.  None for any other sampler (or with the fast paths switched off): the
    sampler decides every root itself."""
    from opentelemetry.sdk.trace.sampling import StaticSampler, TraceIdRatioBased

    if not settings.DROPPED_FAST_PATH.read() or not contract.part_on(contract.SAMPLERS):
        return None
    kept = JOB_SPAN_NAME if type(sampler) is JobKeepingSampler else None
    if kept:
        if sampler.by_task:  # a rollout root's decision rests on its job and task too
            return None
        sampler = sampler.delegate
    if not _stock_parent_based(sampler):
        return None
    root = getattr(sampler, contract.PARENT_BASED_ROOT, None)
    if type(root) is TraceIdRatioBased and type(root.bound) is int and type(root.TRACE_ID_LIMIT) is int:
        return RootDecision(root.TRACE_ID_LIMIT, root.bound, kept)
    if type(root) is StaticSampler and getattr(root, contract.STATIC_DECISION, None) is Decision.DROP:
        return RootDecision(0, 0, kept)
    return None
