"""The list's filters: by trace id prefix, rollout, service, attribute, status and
``--where`` conditions (``where``), the N slowest, the order.

Orders (``--sort``, ``SORTS``): ``start`` (the default, earliest first), ``duration``
(longest first), ``reward`` (lowest first: the worst rollouts on top), ``tokens`` (most
first), ``task`` (task index, then repeat index, ascending); ``--reverse`` turns any of
them round.  Traces without the value sorted on (no reward, no tokens, no task index)
come last either way, in start order.

``--service NAME`` takes a service's name (``nemo-gym/policy_model``), its short name
(``policy_model``, without ``nemo-gym/``), or a part of one short name (``model``, any
case): the first of these that matches wins.  A part shared by several services, or a
name no service has, is refused with the services it could have meant."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gym_autoinstr.commands.view.model import Trace, short_service
from gym_autoinstr.commands.view.text import count
from gym_autoinstr.commands.view.where import Condition

# --sort: what to sort on, and whether largest first (before --reverse)
SORTS: dict[str, tuple[Callable[[Trace], object], bool]] = {
    "start": (lambda t: t.start_ns, False),
    "duration": (lambda t: t.duration_ms, True),
    "reward": (lambda t: t.reward, False),
    "tokens": (lambda t: t.total_tokens, True),
    "task": (lambda t: None if t.task_index is None else (t.task_index, t.rollout_index or 0), False),
}


class AmbiguousTrace(ValueError):
    """A ``--trace`` prefix shared by more than one trace."""

    def __init__(self, prefix: str, candidates: list[Trace]) -> None:
        self.prefix, self.candidates = prefix, candidates
        super().__init__(prefix)


class Unmatched(ValueError):
    """A ``--trace`` or ``--service`` that names nothing in the run (or, for a service,
    several things): the message says what there is."""


def resolve_service(name: str, services: set[str]) -> set[str]:
    """The services (full ``service.name`` values) ``--service name`` means, among
    ``services``: the one of that name, else those of that short name, else the one whose
    short name contains ``name``; ``Unmatched`` when none does, or several do."""
    if name in services:
        return {name}
    exact = {s for s in services if short_service(s) == name}
    if exact:
        return exact
    wanted = name.lower()
    partial = {s for s in services if wanted in short_service(s).lower()}
    shorts = sorted({short_service(s) for s in partial})
    if len(shorts) == 1:
        return partial
    if shorts:
        raise Unmatched(f"--service {name} matches {len(shorts)} services: {', '.join(shorts)}; give one of them")
    known = ", ".join(sorted({short_service(s) for s in services})) or "none"
    raise Unmatched(f"--service {name} matches no service; the run's services: {known}")


def parse_attribute_filter(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise ValueError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def select(
    traces: Sequence[Trace],
    *,
    rollout: str | None = None,
    slowest: int | None = None,
    errors: bool = False,
    trace_id: str | None = None,
    service_name: str | None = None,
    attributes: Sequence[tuple[str, str]] = (),
    status: str | None = None,
    where: Sequence[Condition] = (),
    sort: str = "start",
    reverse: bool = False,
) -> list[Trace]:
    """The traces the filters keep (every ``where`` condition holding), in start order or
    in the order ``sort`` names (``order``; ``slowest``: the N longest rollout traces,
    longest first, start-up and job traces aside).  ``trace_id`` is any prefix of one
    trace's id (case-insensitive); a prefix of several raises ``AmbiguousTrace``, of none
    ``Unmatched``, as does a ``service_name`` that names no service of ``traces`` or
    several (``resolve_service``)."""
    chosen = list(traces)
    if trace_id is not None:
        prefix = trace_id.strip().lower()
        chosen = [t for t in chosen if t.trace_id.startswith(prefix)]
        if not chosen:
            raise Unmatched(f"no trace id starts with {prefix} (of the {count(len(traces), 'trace')} read)")
        if len(chosen) > 1 and not any(t.trace_id == prefix for t in chosen):
            raise AmbiguousTrace(prefix, chosen)
        chosen = [t for t in chosen if t.trace_id == prefix] or chosen
    if rollout is not None:
        chosen = [t for t in chosen if rollout in t.rollout_ids]
    if service_name is not None:
        wanted = resolve_service(service_name, {s for t in traces for s in t.services})
        chosen = [t for t in chosen if not wanted.isdisjoint(t.services)]
    for key, value in attributes:
        chosen = [t for t in chosen if t.has_attribute(key, value)]
    if errors or status == "error":
        chosen = [t for t in chosen if t.has_error]
    elif status == "ok":
        chosen = [t for t in chosen if not t.has_error]
    for condition in where:
        chosen = [t for t in chosen if condition.matches(t)]
    if slowest is not None:
        rollouts = [t for t in chosen if t.is_rollout]
        if chosen and not rollouts:
            raise Unmatched(
                f"--slowest ranks rollout traces, and the filters leave none, only {count(len(chosen), 'trace')} "
                "of start-up or of a job's own (--sort duration lists them longest first)"
            )
        chosen = sorted(rollouts, key=lambda t: t.duration_ms, reverse=True)[:slowest]
    elif sort != "start" or reverse:
        chosen = order(chosen, sort, reverse=reverse)
    return chosen


def order(traces: Sequence[Trace], sort: str, *, reverse: bool = False) -> list[Trace]:
    """``traces`` in the order ``sort`` names (``SORTS``), turned round by ``reverse``;
    those without the value last, in their order in ``traces``."""
    key, largest_first = SORTS[sort]
    keyed = [(key(t), t) for t in traces]
    present = [pair for pair in keyed if pair[0] is not None]
    present.sort(key=lambda pair: pair[0], reverse=largest_first != reverse)  # type: ignore[arg-type,return-value]
    return [t for _value, t in present] + [t for value, t in keyed if value is None]
