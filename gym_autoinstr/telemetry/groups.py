"""Span groups: which families of spans a process emits.

Every site that can create a span is gated by one group, checked *before* any work
(attribute dicts, string formatting) happens, so a disabled site costs one frozenset
membership test.  The spec is read once per process from ``GYM_AUTOINSTR_SPAN_GROUPS``
or, for users of Gym's own knob, ``NEMO_GYM_OTEL_SPAN_GROUPS``.

Spec syntax: comma-separated, case-insensitive, whitespace-trimmed names of groups and
presets, mixed freely (``default,sandbox``).  ``none`` (or an empty spec) turns every
group off.

A spec with a name that is neither a group nor a preset does not parse, and as every
setting that does not parse (``settings.py``) it falls back to the default, as a whole:
the ``default`` preset, with one warning naming the bad name, the closest valid one and
the fix.  Not "the valid rest": a typo in ``alll`` would leave nothing, and one in
``server,agnet`` a trace with a hole nobody asked for.  ``check`` gives the verdict without
logging, for ``gym-autoinstr doctor``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import NamedTuple

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
DEFAULT = PRESETS["default"]

VALID_NAMES = "groups " + ", ".join(sorted(ALL_GROUPS)) + "; presets " + ", ".join(p for p in PRESETS if p != "off")


class Spec(NamedTuple):
    """A spec as read: where it came from, the groups it turns on, and why it was not taken."""

    variable: str | None  # the variable it came from; None: neither is set
    spec: str | None  # its text as set
    enabled: frozenset[str]  # the groups on: the spec's, or the default preset when it does not parse
    unknown: tuple[str, ...] = ()  # names that are neither a group nor a preset (then: the default)
    problem: str = ""  # why the spec was not taken ("" when it was)
    fix: str = ""  # what to set instead

    @property
    def message(self) -> str:
        """The one warning a process logs for it ("" when the spec was taken)."""
        return f"{self.problem}. Fix: {self.fix}." if self.problem else ""


def closest(name: str) -> str | None:
    """The group or preset name closest to ``name`` (a misspelling), or None."""
    found = difflib.get_close_matches(name.lower(), sorted(ALL_GROUPS | PRESETS.keys()), n=1, cutoff=0.6)
    return found[0] if found else None


def check(spec: str, *, source: str = "span group spec") -> Spec:
    """The groups ``spec`` turns on, or the default preset with the problem and its fix
    when a name in it is neither a group nor a preset.  Logs nothing."""
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
    if not unknown:
        return Spec(source, spec, frozenset(enabled))
    guesses = {name: closest(name) for name in unknown}
    named = ", ".join(f"{name!r} (did you mean {guess!r}?)" if guess else repr(name) for name, guess in guesses.items())
    verb = "is not a span group or preset" if len(unknown) == 1 else "are not span groups or presets"
    problem = (
        f"{source}={spec!r}: {named} {verb}; the whole spec is ignored and the default preset is used "
        f"({', '.join(sorted(DEFAULT))})"
    )
    if all(guesses.values()):
        corrected = ",".join(guesses.get(raw.strip(), raw.strip()) for raw in spec.split(",") if raw.strip())
        fix = f"set {source}={corrected} (names: {VALID_NAMES})"
    else:
        fix = f"set {source} to names from: {VALID_NAMES}; or unset it for the default preset"
    return Spec(source, spec, DEFAULT, tuple(unknown), problem, fix)


def parse_spec(spec: str, *, source: str = "span group spec") -> frozenset[str]:
    """Turn a spec such as ``"default, Sandbox"`` into the set of enabled groups; a spec
    with an unknown name gives the default preset, with one warning (``check``)."""
    found = check(spec, source=source)
    if found.problem:
        warn_once(f"groups:{source}:{spec}", "%s", found.message)
    return found.enabled


def from_environment(environ: Mapping[str, str] | None = None) -> Spec:
    """The spec in force: ours, else Gym's knob, else the default preset.  Logs nothing."""
    for setting in (settings.SPAN_GROUPS, settings.GYM_SPAN_GROUPS):
        spec = setting.raw(environ)
        if spec is not None:
            return check(spec, source=setting.name)
    return Spec(None, None, DEFAULT)


def groups_from_environment(environ: Mapping[str, str] | None = None, *, quiet: bool = False) -> frozenset[str]:
    """The groups on; a spec that does not parse is warned about once (unless ``quiet``)."""
    found = from_environment(environ)
    if found.problem and not quiet:
        warn_once(f"groups:{found.variable}:{found.spec}", "%s", found.message)
    return found.enabled


# The process-wide set every gate reads.  Rebound (never mutated) by `reload()`.  Read
# quietly at import (every process under opentelemetry-instrument imports this, Ray's
# daemons too); a bad spec is warned about where the instrumentor reloads it.
ENABLED: frozenset[str] = groups_from_environment(quiet=True)


def reload(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Re-read the spec (at instrument time, and in tests)."""
    global ENABLED
    ENABLED = groups_from_environment(environ)
    return ENABLED
