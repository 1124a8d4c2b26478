"""The meter provider of a Gym process, and its readers from ``OTEL_METRICS_EXPORTER``.

Metrics go where spans go unless told otherwise: OTLP when an OTLP endpoint is
configured, the run directory in the embedded file default.  They are read every 10 s
(the SDK's default is 60 s: a short run would show nothing until its shutdown flush).
"""

from __future__ import annotations

from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import warn_once
from gym_autoinstr.fastpath import parts
from gym_autoinstr.setup import files, identity


def _otlp_exporter() -> Any:
    protocol = (settings.OTLP_METRICS_PROTOCOL.raw() or settings.OTLP_TRACES_PROTOCOL.read()).strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def _exporter(name: str, who: identity.ProcessIdentity | None) -> Any:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    built = {
        "otlp": _otlp_exporter,
        "console": ConsoleMetricExporter,
        "files": lambda: files.metric_exporter(
            files.resolve_output_dir(identity.run_id()), identity.service_name(who or identity.detect())
        ),
        "none": lambda: None,
    }
    if name in built:
        return built[name]()
    warn_once(
        f"metrics-exporter:{name}",
        "OTEL_METRICS_EXPORTER names %r, which is not supported here: no metrics go to it; known here: %s.",
        name,
        ", ".join(built),
    )
    return None


def readers(who: identity.ProcessIdentity | None = None) -> list[Any]:
    """Metric readers from ``OTEL_METRICS_EXPORTER``, defaulting to where spans go."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    default = "files" if files.embedded_default_applies() else "otlp"
    interval = settings.METRIC_EXPORT_INTERVAL.read()
    parts.check()  # (the fast histograms, now that the SDK's metrics are loaded)
    found = []
    configured = settings.METRICS_EXPORTER.raw()
    for raw in (default if configured is None else configured).split(","):
        name = raw.strip().lower()
        if not name:
            continue
        try:
            exporter = _exporter(name, who)
        except Exception as error:
            warn_once(f"metrics-exporter-error:{name}", "metric exporter %r could not be created: %r", name, error)
            continue
        if exporter is not None:
            from gym_autoinstr.fastpath import histograms

            if histograms.qualifies(exporter):  # request histograms aggregated by us, merged at export
                exporter = histograms.MergingExporter(exporter)
            found.append(PeriodicExportingMetricReader(exporter, export_interval_millis=interval))
    return found


def configure(resource: Any, who: identity.ProcessIdentity | None = None) -> bool:
    """Set the global meter provider when any reader is configured; True when our
    request metrics are recorded."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    from gym_autoinstr.fastpath import histograms
    from gym_autoinstr.telemetry import metrics as gym_metrics
    from gym_autoinstr.telemetry import runtime

    chosen = readers(who)
    if not chosen:
        return False
    options: dict[str, Any] = {}
    if not settings.METRICS_EXEMPLAR_FILTER.raw():
        # The SDK's default samples an exemplar on every record made inside a sampled
        # span: about as costly as the record itself, on every request.
        try:
            from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter

            options["exemplar_filter"] = AlwaysOffExemplarFilter()
        except ImportError:
            pass
    provider = MeterProvider(resource=resource, metric_readers=chosen, shutdown_on_exit=False, **options)
    metrics.set_meter_provider(provider)
    # ours only: if another provider is already global (an embedder's), its readers
    # never see our merged histograms, so the SDK's instruments serve it
    histograms.bind(provider, chosen)
    recorded = gym_metrics.activate()
    if recorded:
        runtime.start(who)
    return recorded
