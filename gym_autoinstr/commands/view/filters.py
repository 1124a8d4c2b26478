"""The list's filters: by trace id prefix, rollout, service, attribute and status, the
N slowest, the order."""

from __future__ import annotations

from collections.abc import Sequence

from gym_autoinstr.commands.view.model import Trace, short_service
from gym_autoinstr.commands.view.text import count


class AmbiguousTrace(ValueError):
    """A ``--trace`` prefix shared by more than one trace."""

    def __init__(self, prefix: str, candidates: list[Trace]) -> None:
        self.prefix, self.candidates = prefix, candidates
        super().__init__(prefix)


class Unmatched(ValueError):
    """A ``--trace`` that names nothing in the run: the message says what there is."""


def _has_service(trace: Trace, name: str) -> bool:
    return any(s == name or short_service(s) == name for s in trace.services)


def _has_attribute(trace: Trace, key: str, value: str) -> bool:
    for span in trace.spans:
        for attributes in (span.get("attributes") or {}, span.get("resource") or {}):
            if key in attributes and _text(attributes[key]) == value:
                return True
    return False


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


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
    sort: str = "start",
) -> list[Trace]:
    """The traces the filters keep, in start order (``sort="duration"``: longest first;
    ``slowest``: the N longest, longest first).  ``trace_id`` is any prefix of one trace's
    id (case-insensitive); a prefix of several raises ``AmbiguousTrace``, of none
    ``Unmatched``."""
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
        chosen = [t for t in chosen if _has_service(t, service_name)]
    for key, value in attributes:
        chosen = [t for t in chosen if _has_attribute(t, key, value)]
    if errors or status == "error":
        chosen = [t for t in chosen if t.has_error]
    elif status == "ok":
        chosen = [t for t in chosen if not t.has_error]
    if slowest is not None:
        chosen = sorted(chosen, key=lambda t: t.duration_ms, reverse=True)[:slowest]
    elif sort == "duration":
        chosen = sorted(chosen, key=lambda t: t.duration_ms, reverse=True)
    return chosen
