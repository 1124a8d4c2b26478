"""Metric instruments, with Gym's own names, units and attributes where Gym defines them.

Every recorder is gated by ``LIVE`` (a meter provider of ours is configured: an OTLP
endpoint, or the embedded file default), checked before anything is built.  On the hot
path a recorder is one histogram record with an attribute dict built once (per server,
route or outcome), never per request; gauges are observed at collection time.  The
instruments and their attributes: docs/spans-and-metrics.md, "Metrics".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics

from gym_autoinstr import attributes as attr
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import histograms
from gym_autoinstr.version import __version__

# True once `activate()` ran with a real meter provider: every recorder checks it first.
LIVE = False

SUCCESS, FAILURE = "success", "failure"

# Milliseconds.  The SDK's default boundaries stop at 10 s; a rollout or a reasoning
# model's call runs for minutes.
DURATION_BOUNDARIES_MS = (
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
)
# Gym's sandbox buckets: 250 ms to 30 min.
SANDBOX_BOUNDARIES_MS = (250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000)
TTFB_BOUNDARIES_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000)

# A reward is usually in [0, 1]; the sum and count are exact whatever it is.
REWARD_BOUNDARIES = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1)

# The semantic conventions' advice for http.server.request.duration, extended to Gym's minutes.
HTTP_BOUNDARIES_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 120, 300, 600)

# key, name, unit, description, bucket boundaries
_HISTOGRAMS = (
    ("duration", "http.server.request.duration", "s", "Duration of HTTP server requests.", HTTP_BOUNDARIES_S),
    (
        "rollout",
        "gym.rollout.duration_ms",
        "ms",
        "Duration of one rollout (agent /run), failures included.",
        DURATION_BOUNDARIES_MS,
    ),
    (
        "verify",
        "gym.verify.duration_ms",
        "ms",
        "Duration of one verification (resources /verify).",
        DURATION_BOUNDARIES_MS,
    ),
    (
        "reward",
        "gym.rollout.reward",
        "1",
        "The verifier's reward of one rollout (agent /run), masked samples included (nemo.gym.mask_sample).",
        REWARD_BOUNDARIES,
    ),
    ("model", "gym.model.call_duration_ms", "ms", "Duration of one model-server dialect call.", DURATION_BOUNDARIES_MS),
    (
        "ttfb",
        "gym.model.time_to_first_byte_ms",
        "ms",
        "Time to the first response byte of one model-server call.",
        TTFB_BOUNDARIES_MS,
    ),
    (
        "sandbox.start",
        "gym.sandbox.startup_duration_ms",
        "ms",
        "Duration of one sandbox start, failures included.",
        SANDBOX_BOUNDARIES_MS,
    ),
    (
        "sandbox.exec",
        "gym.sandbox.exec_duration_ms",
        "ms",
        "Duration of one command run in a sandbox, failures included.",
        SANDBOX_BOUNDARIES_MS,
    ),
)

_instruments: dict[str, Any] = {}
_lock = threading.Lock()
# server name -> [requests in flight]; read by the observable gauge at collection time.
_in_flight: dict[str, list[int]] = {}


def meter() -> Any:
    return metrics.get_meter_provider().get_meter("gym_autoinstr", __version__)


def histogram(name: str, unit: str, description: str, boundaries: Any) -> Any:
    """A histogram of ours on the current meter provider: aggregated in ``histograms.py``
    when the provider is the one ``setup/meters.py`` built for it, else the SDK's."""
    return histograms.histogram(meter(), metrics.get_meter_provider(), name, unit, description, boundaries)


def activate() -> bool:
    """Create the instruments on the current meter provider; ``LIVE`` if it is a real one."""
    global LIVE
    provider = metrics.get_meter_provider()
    if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
        LIVE = False
        return False
    m = provider.get_meter("gym_autoinstr", __version__)
    with _lock:
        _instruments.clear()
        for key, name, unit, description, boundaries in _HISTOGRAMS:
            _instruments[key] = histograms.histogram(m, provider, name, unit, description, boundaries)
        _instruments["servers"] = m.create_gauge(
            "gym.servers.active", unit="{server}", description="Gym servers up in this run (orchestrator)."
        )
        _instruments["sandbox.active"] = m.create_up_down_counter(
            "gym.sandbox.active", unit="{sandbox}", description="Sandboxes started and not yet stopped, by provider."
        )
        _instruments["sandbox.create_retry"] = m.create_counter(
            "gym.sandbox.create_retry_total", unit="{retry}", description="Sandbox-create attempts a provider retried."
        )
        _sandbox_attributes.clear()
        m.create_observable_gauge(
            "gym.server.requests.in_flight",
            callbacks=[_observe_in_flight],
            unit="{request}",
            description="Requests a Gym server is serving right now.",
        )
        _span_health(m)
    LIVE = True
    return True


# -- the pipeline's own health: OpenTelemetry's SDK self-observability names -----------
COMPONENT_TYPE = "otel.component.type"
COMPONENT_NAME = "otel.component.name"


def _span_health(m: Any) -> None:
    """``otel.sdk.processor.span.processed`` (spans a processor finished with; ``error.type``
    the reason it dropped one: ``queue_full``, ...), ``otel.sdk.processor.span.queue.size``
    and ``otel.sdk.exporter.span.exported`` (``error.type``: ``export_failed``,
    ``disk_budget``, ``unwritable``), per exporter, read from the loss ledger at collection
    time.  The exit's own counts (``exit_unflushed``) come after the last collection: the
    process note and the exit line have them."""
    from gym_autoinstr.losses import LEDGER, PROCESSOR_REASONS

    def component(exporter: str, kind: str) -> dict[str, str]:
        return {COMPONENT_TYPE: kind, COMPONENT_NAME: f"gym_autoinstr/{exporter}"}

    def processed(_options: Any) -> list[Any]:
        found = []
        for exporter, counts in LEDGER.by_exporter().items():
            base = component(exporter, "batching_span_processor")
            dropped = {r: n for r, n in counts["lost"].items() if r in PROCESSOR_REASONS}
            found.append(metrics.Observation(max(counts["ended"] - sum(dropped.values()), 0), base))
            found.extend(metrics.Observation(n, {**base, attr.ERROR_TYPE: r}) for r, n in dropped.items())
        return found

    def queued(_options: Any) -> list[Any]:
        return [
            metrics.Observation(counts["queued"], component(exporter, "batching_span_processor"))
            for exporter, counts in LEDGER.by_exporter().items()
        ]

    def exported(_options: Any) -> list[Any]:
        found = []
        for exporter, counts in LEDGER.by_exporter().items():
            base = component(exporter, f"{exporter}_span_exporter")
            found.append(metrics.Observation(counts["written"], base))
            found.extend(
                metrics.Observation(n, {**base, attr.ERROR_TYPE: r})
                for r, n in counts["lost"].items()
                if r not in PROCESSOR_REASONS and r != "exit_unflushed"
            )
        return found

    m.create_observable_counter(
        "otel.sdk.processor.span.processed",
        callbacks=[processed],
        unit="{span}",
        description="Spans a span processor finished with; error.type says why one was dropped.",
    )
    m.create_observable_up_down_counter(
        "otel.sdk.processor.span.queue.size",
        callbacks=[queued],
        unit="{span}",
        description="Spans ended and not yet exported.",
    )
    m.create_observable_counter(
        "otel.sdk.exporter.span.exported",
        callbacks=[exported],
        unit="{span}",
        description="Spans an exporter finished with (after its retries); error.type says why one failed.",
    )


def _observe_in_flight(_options: Any) -> list[Any]:
    return [metrics.Observation(cell[0], {attr.SERVER_NAME: name}) for name, cell in list(_in_flight.items())]


def in_flight_cell(server_name: str) -> list[int]:
    """The counter a server's middleware increments and decrements (one per server)."""
    with _lock:
        return _in_flight.setdefault(server_name, [0])


# -- seam kinds: the attribute dicts are built once, at route registration ------------


# The attribute ``routes.py`` sets on a seam's endpoint wrapper; the ingress reads it off
# the matched route once the request is done.
SEAM_ATTRIBUTE = "_gym_autoinstr_metric"


class SeamMetric:
    """What a marked route records per request; attributes pre-built."""

    __slots__ = ("kind", "ok", "failed", "identity")

    def __init__(self, kind: str, server_name: str, dialect: str | None = None) -> None:
        self.kind = kind
        if kind == "rollout":
            self.ok, self.failed = {attr.ROLLOUT_OUTCOME: SUCCESS}, {attr.ROLLOUT_OUTCOME: FAILURE}
        elif kind == "verify":
            self.ok, self.failed = {attr.VERIFY_OUTCOME: SUCCESS}, {attr.VERIFY_OUTCOME: FAILURE}
        else:
            self.ok = self.failed = {attr.MODEL_DIALECT: dialect or "unknown", attr.SERVER_NAME: server_name}
        self.identity = self.ok


# (method, route template, status) -> the attribute dict recorded for such requests: built
# once, the same object every time (the fast histograms find its point by identity).
_request_attributes: dict[tuple, dict[str, Any]] = {}
_REQUEST_ATTRIBUTE_SETS = 1024  # routes are templates, statuses a few: never near it in Gym


def _request_attributes_of(method: str, route: str | None, status: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {attr.HTTP_REQUEST_METHOD: method}
    if route:
        attributes[attr.HTTP_ROUTE] = route
    if status:
        attributes[attr.HTTP_RESPONSE_STATUS_CODE] = status
    if len(_request_attributes) >= _REQUEST_ATTRIBUTE_SETS:
        _request_attributes.clear()
    _request_attributes[(method, route, status)] = attributes
    return attributes


def record_request(
    method: str,
    route: str | None,
    status: int | None,
    seconds: float,
    ttfb_seconds: float | None,
    seam: SeamMetric | None,
) -> None:
    """Everything the ingress records when a request ends (caller checked ``LIVE``)."""
    attributes = _request_attributes.get((method, route, status))
    if attributes is None:
        attributes = _request_attributes_of(method, route, status)
    _instruments["duration"].record(seconds, attributes)
    if seam is None:
        return
    failed = status is None or status >= 500
    ms = seconds * 1000.0
    if seam.kind == "rollout":
        _instruments["rollout"].record(ms, seam.failed if failed else seam.ok)
    elif seam.kind == "verify":
        _instruments["verify"].record(ms, seam.failed if failed else seam.ok)
    else:
        _instruments["model"].record(ms, seam.identity)
        if ttfb_seconds is not None:
            _instruments["ttfb"].record(ttfb_seconds * 1000.0, seam.identity)


class RewardMetric:
    """The attribute sets one agent's rewards are recorded with (built once: the fast
    histograms find a point by its attribute set's identity)."""

    __slots__ = ("kept", "masked")

    def __init__(self, agent: str, resources_server: str | None) -> None:
        base: dict[str, Any] = {attr.AGENT_NAME: agent}
        if resources_server:
            base[attr.RESOURCES_SERVER] = resources_server
        self.kept = {**base, attr.MASK_SAMPLE: False}
        self.masked = {**base, attr.MASK_SAMPLE: True}


def record_reward(reward: float, masked: bool, metric: RewardMetric) -> None:
    """One rollout's reward (caller checked ``LIVE``)."""
    _instruments["reward"].record(reward, metric.masked if masked else metric.kept)


_sandbox_attributes: dict[str, dict[str, str]] = {}


def _sandbox_attributes_of(provider: str) -> dict[str, str]:
    attributes = _sandbox_attributes.get(provider)
    if attributes is None:
        if len(_sandbox_attributes) > 64:  # providers are a handful; never grow without end
            _sandbox_attributes.clear()
        attributes = _sandbox_attributes[provider] = {attr.SANDBOX_PROVIDER: provider}
    return attributes


def record_sandbox_create_retry(provider: str) -> None:
    """One sandbox-create attempt a provider retried (caller checked ``LIVE``)."""
    _instruments["sandbox.create_retry"].add(1, _sandbox_attributes_of(provider))


def record_sandbox(kind: str, provider: str, ms: float, ok: bool) -> None:
    """A sandbox ``start``, ``exec`` or ``stop`` (caller checked ``LIVE``)."""
    attributes = _sandbox_attributes_of(provider)
    if kind == "stop":
        _instruments["sandbox.active"].add(-1, attributes)
        return
    _instruments["sandbox.start" if kind == "start" else "sandbox.exec"].record(ms, attributes)
    if kind == "start" and ok:
        _instruments["sandbox.active"].add(1, attributes)


def set_servers_active(value: int) -> None:
    if not LIVE:
        return
    try:
        _instruments["servers"].set(value)
    except Exception as error:
        warn_once("servers-active", "could not record gym.servers.active: %r", error)


def observable(name: str, kind: str, callback: Callable[[Any], list[Any]], unit: str, description: str) -> None:
    """Register an instrument observed at collection time (runtime gauges and counters)."""
    create = getattr(meter(), f"create_observable_{kind}")
    create(name, callbacks=[callback], unit=unit, description=description)
