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

import random
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import NonRecordingSpan

from gym_autoinstr.fastpath.context_ops import current_context, span_context
from gym_autoinstr.fastpath.contract import BAGGAGE_KEY as _BAGGAGE_KEY
from gym_autoinstr.fastpath.contract import SPAN_KEY as _SPAN_KEY  # None when absent
from gym_autoinstr.fastpath.samplers import JobKeepingSampler, _drops_under_unsampled_parent
from gym_autoinstr.fastpath.w3c import (
    keep_own_root,
    traceparent,
    unsampled_entry,
    unsampled_headers,
    unsampled_lone,
    unsampled_spans,
    w3c_default,
)
from gym_autoinstr.telemetry import spans as _spans
from gym_autoinstr.telemetry.spans import tracer_in_use


def configured_sampler() -> Sampler:
    """``OTEL_TRACES_SAMPLER``/``_ARG`` as the SDK reads them, wrapped to keep job roots."""
    from gym_autoinstr.fastpath.contract import sampler_from_environment

    return JobKeepingSampler(sampler_from_environment())


# -- the dropped-parent fast path --------------------------------------------------------
#
# Under a parent-based sampler whose "parent not sampled" delegates are the static DROP
# sampler (the SDK's default for every ``parentbased_*`` choice), a span whose parent is
# valid and unsampled is never recorded, whatever its name, kind or attributes: the SDK
# hands back a non-recording span with a fresh span id and the parent's flags.  Our
# advice asks first, and for such a request skips building attributes, the sampler call,
# the id and the context switch: the caller's context already carries the decision, and
# injecting the parent's context tells the next hop the same thing.


@dataclass(slots=True)
class _SamplerChecked:
    sampler: Any = None  # the sampler last checked
    drops: bool = False  # whether it drops every span under an unsampled parent


_follows = _SamplerChecked()


# Contexts found holding a dropped span, by id: (the context, the sampler that drops the
# children of its span, the span, and once a call was sent under it: the global textmap
# and the headers ``w3c.unsampled_headers`` made for it).  A request of a dropped
# rollout runs under one context (its caller's, read from the header once per rollout and
# server, or its dropped root's), asked about at each seam and call: from the second time
# on, the answer is one lookup.  Contexts are never changed in place; an entry keeps its
# context alive, so an id cannot be reused while it is kept.  Bounded; cleared when full.
_dropped_contexts: dict[int, tuple] = {}
_DROPPED_CONTEXTS_MAX = 1024


def dropped_span(context: Any = None) -> Any:
    """The current (or ``context``'s) span when it is valid and not sampled and the
    tracer's sampler drops every child of such a parent; else None."""
    if context is None:
        context = current_context()
    hit = _dropped_contexts.get(id(context))
    if hit is not None and hit[0] is context:
        tracer_now = _spans._tracer
        if tracer_now is not None and getattr(tracer_now, "sampler", None) is hit[1]:
            return hit[2]
    if _SPAN_KEY is None:  # pragma: no cover
        span = trace.get_current_span(context)
    else:
        span = context.get(_SPAN_KEY)
    # A span the sampler dropped is a NonRecordingSpan, whether the SDK made it or a
    # caller's header did; any other span (a recording one, none) is not dropped here,
    # and the SDK's sampler decides as usual.
    if type(span) is not NonRecordingSpan:
        return None
    # a span's context never changes: checked once, kept with its headers (w3c)
    hit = unsampled_spans.get(id(span))
    if (hit is None or hit[0] is not span) and unsampled_entry(span) is None:
        return None
    sampler = dropping_sampler()
    if sampler is None:
        return None
    _keep((context, sampler, span, None, None))  # (no headers yet)
    return span


def _keep(entry: tuple) -> None:
    """Remember ``entry`` (``_dropped_contexts``' shape) for its context; bounded."""
    if len(_dropped_contexts) >= _DROPPED_CONTEXTS_MAX:
        _dropped_contexts.clear()
    _dropped_contexts[id(entry[0])] = entry


def dropped_call(context: Any) -> tuple[Any, dict[str, str] | None] | None:
    """For a call sent under ``context``: ``(dropped_span(context), the headers that carry
    its context on)`` when that span is dropped, else None.  The headers are
    ``w3c.unsampled_headers``' (None: inject the usual way); the same dict for
    every call under ``context``, so not to be changed: copy it."""
    hit = _dropped_contexts.get(id(context))
    if hit is not None and hit[0] is context:
        if hit[3] is not None:
            tracer_now = _spans._tracer
            if (
                tracer_now is not None
                and getattr(tracer_now, "sampler", None) is hit[1]
                and hit[3] is propagate.get_global_textmap()
            ):
                return hit[2], hit[4]
    elif _SPAN_KEY is not None and type(context.get(_SPAN_KEY)) is not NonRecordingSpan:
        return None  # (a recording span, or none: dropped_span's first test, without its frame)
    span = dropped_span(context)
    if span is None:
        return None
    headers = unsampled_headers(span, context)
    hit = _dropped_contexts.get(id(context))
    if hit is not None and hit[0] is context and hit[2] is span:  # (kept by dropped_span just now)
        _keep((*hit[:3], propagate.get_global_textmap(), headers))
    return span, headers


def _new_span_id() -> int:
    ids = getattr(_spans._tracer or tracer_in_use(), "id_generator", None)
    return ids.generate_span_id() if ids is not None else random.getrandbits(64) or 1


def own_operation(parent: Any) -> NonRecordingSpan:
    """The span a request under the dropped ``parent`` runs in, as the SDK's sampler makes it:
    ``parent``'s context, local, with a span id of its own (W3C: the current operation's)."""
    made = parent.get_span_context()
    return NonRecordingSpan(span_context(made.trace_id, _new_span_id(), False, made.trace_flags, made.trace_state))


def forwarded(header: str) -> Any:
    """For a lone ``traceparent`` first seen here, unsampled in the SDK's form, when the
    sampler drops every child of such a parent: the context the request runs under
    (``w3c.unsampled_lone``'s), kept as ``dropped_call`` keeps it after a call, and by
    ``header`` and the one it sends on (``w3c.own_root``); else None."""
    sampler = dropping_sampler()
    if sampler is None or _SPAN_KEY is None:
        return None
    span_id = _new_span_id()
    own = unsampled_lone(header, span_id)
    if own is None:
        return None
    sent = f"{header[:36]}{span_id:016x}{header[52:]}"
    _keep((own, sampler, own[_SPAN_KEY], propagate.get_global_textmap(), {"traceparent": sent}))
    keep_own_root(header, own)
    keep_own_root(sent, own)
    return own


def dropped_root(context: Any, span: Any) -> None:
    """For a context holding ``span``, a span the sampler dropped at its start (a root, as
    the lean tracer makes it): kept as ``dropped_call`` would keep it after its first
    call, with the headers that carry it on, and by that ``traceparent`` for a call of
    this server to itself (``w3c.own_root``), when the sampler drops the children
    of such a span (else nothing is kept, and each hop asks as usual)."""
    sampler = dropping_sampler()
    if sampler is None or _SPAN_KEY is None:
        return
    # what unsampled_headers(span, context) writes, for a root: no baggage, W3C's propagator
    if context.get(_BAGGAGE_KEY) or not w3c_default():
        return
    made = span.get_span_context()
    if made.trace_flags & 0x01 or not made.is_valid or made.trace_state:
        return  # (not the lean tracer's dropped root: each hop asks as usual)
    header = traceparent(made)
    _keep((context, sampler, span, propagate.get_global_textmap(), {"traceparent": header}))
    keep_own_root(header, context)  # (a call of this server to itself: the ingress finds it)


def dropping_sampler() -> Any:
    """The tracer's sampler when it drops every child of an unsampled parent (worked out
    once per sampler object), else None."""
    tracer_now = _spans._tracer  # (the tracer ``tracer()`` last handed out: tracer_in_use())
    sampler = getattr(tracer_now if tracer_now is not None else tracer_in_use(), "sampler", None)
    if sampler is not _follows.sampler:
        _check_sampler(sampler)
    return sampler if _follows.drops else None


def _check_sampler(sampler: Any) -> None:
    try:
        follows = _drops_under_unsampled_parent(sampler)
    except Exception:
        follows = False
    _follows.sampler, _follows.drops = sampler, follows
