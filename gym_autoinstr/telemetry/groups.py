"""Span groups: which families of spans a process emits.

Every site that can create a span is gated by one group, checked *before* any work
(attribute dicts, string formatting) happens, so a disabled site costs one frozenset
membership test.  The spec is read once per process from ``GYM_AUTOINSTR_SPAN_GROUPS``
or, for users of Gym's own knob, ``NEMO_GYM_OTEL_SPAN_GROUPS``.

Spec syntax: comma-separated, case-insensitive, whitespace-trimmed names of groups and
presets, mixed freely (``default,sandbox``).  ``none`` (or an empty spec) turns every
group off.
"""

from __future__ import annotations

import os

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once

JOB = "job"
SERVER = "server"
HTTP_CLIENT = "http_client"
ROLLOUT = "rollout"
VERIFY = "verify"
AGENT = "agent"
MODEL_CALL = "model_call"
SANDBOX = "sandbox"
RAY = "ray"
STARTUP = "startup"

ALL_GROUPS = frozenset({JOB, SERVER, HTTP_CLIENT, ROLLOUT, VERIFY, AGENT, MODEL_CALL, SANDBOX, RAY, STARTUP})

PRESETS: dict[str, frozenset[str]] = {
    # `ray` is in the default: its spans exist only where Gym hands work to Ray (a
    # verifier's tasks), and without them a rollout's trace stops at a black box.
    # `startup`: once per server, not per rollout.
    "default": frozenset({JOB, SERVER, HTTP_CLIENT, ROLLOUT, RAY, STARTUP}),
    "per_rollout": frozenset({SERVER, HTTP_CLIENT, ROLLOUT, VERIFY, AGENT, MODEL_CALL, RAY}),
    "all": ALL_GROUPS,
    "none": frozenset(),
    "off": frozenset(),
}

SPEC_VARIABLES = (settings.SPAN_GROUPS.name, settings.GYM_SPAN_GROUPS.name)


def parse_spec(spec: str, *, source: str = "span group spec") -> frozenset[str]:
    """Turn a spec such as ``"default, Sandbox"`` into the set of enabled groups.

    Unknown names are ignored with one warning that lists the valid names; the rest of
    the spec still applies.
    """
    enabled: set[str] = set()
    unknown: list[str] = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name in PRESETS:
            enabled |= PRESETS[name]
        elif name in ALL_GROUPS:
            enabled.add(name)
        else:
            unknown.append(raw.strip())
    if unknown:
        warn_once(
            f"groups:{source}:{','.join(unknown)}",
            "%s: unknown span group(s) %s ignored. Valid groups: %s; presets: %s.",
            source,
            ", ".join(repr(u) for u in unknown),
            ", ".join(sorted(ALL_GROUPS)),
            ", ".join(p for p in PRESETS if p != "off"),
        )
    return frozenset(enabled)


def groups_from_environment(environ: os._Environ[str] | dict[str, str] | None = None) -> frozenset[str]:
    for setting in (settings.SPAN_GROUPS, settings.GYM_SPAN_GROUPS):
        spec = setting.raw(environ)
        if spec is not None:
            return parse_spec(spec, source=setting.name)
    return PRESETS["default"]


# The process-wide set every gate reads.  Rebound (never mutated) by `reload()`.
ENABLED: frozenset[str] = groups_from_environment()


def reload(environ: dict[str, str] | None = None) -> frozenset[str]:
    """Re-read the spec (at instrument time, and in tests)."""
    global ENABLED
    ENABLED = groups_from_environment(environ)
    return ENABLED
