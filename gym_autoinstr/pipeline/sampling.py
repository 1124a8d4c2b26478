"""The sampler: the configured one (``OTEL_TRACES_SAMPLER``), except that a job is always kept.

Under Gym's collection driver every rollout is a root trace of its own, linked to the
``gym.job`` span, which is a root trace too (see ``advice/job.py``).  A ratio sampler
(``parentbased_traceidratio``) then decides once per rollout, at its root in the
orchestrator; every server downstream follows the sampled flag in ``traceparent``, so a
rollout is exported whole or not at all.  The job's trace is one span: it is always
recorded and sampled, so that every kept rollout's link leads somewhere and the job's
counts survive any ratio.  Everything else goes to the configured sampler unchanged.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

JOB_SPAN_NAME = "gym.job"


class JobKeepingSampler(Sampler):
    def __init__(self, delegate: Sampler) -> None:
        self.delegate = delegate

    def should_sample(
        self,
        parent_context: Optional[Any],
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Optional[Sequence[Any]] = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name == JOB_SPAN_NAME and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"JobKeepingSampler{{{self.delegate.get_description()}}}"


def configured_sampler() -> Sampler:
    """``OTEL_TRACES_SAMPLER``/``_ARG`` as the SDK reads them, wrapped to keep job roots."""
    from opentelemetry.sdk.trace import sampling

    return JobKeepingSampler(sampling._get_from_env_or_default())
