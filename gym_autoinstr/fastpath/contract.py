"""Every private OpenTelemetry name this package touches, in one table.

The fast parts (``lean.py``, ``wire.py``, ``batching.py``, ``histograms.py``,
``context_ops.py``, ``w3c.py``, ``samplers.py``) and a few set-up paths replace SDK machinery, and
to do so they read names OpenTelemetry keeps private: context keys, attributes of the
SDK's tracer, provider, samplers and exporters, modules with a leading underscore.  A
release may rename or drop any of them without notice.  So each one is a row here: the
name, where OpenTelemetry keeps it, which part uses it, how it is resolved on the
installed version, and a check.  Other modules get private names only from here
(``tests/fastpath/test_contract.py`` scans the source and fails otherwise); a
``# contract row: <name>`` comment elsewhere marks a private name still to be routed
here, and fails that scan too.

Names the hot paths need are resolved once, when this module is imported, into the
module-level names below (a missing one is ``None``, or a stand-in that keeps the stock
behaviour); attribute names are plain strings (``getattr(provider, ACTIVE_SPAN_PROCESSOR,
None)`` costs what the literal did).  Whether each fast part is used at all is decided
when the pipeline is built (``parts.py``: the rows exist and a behavioural probe agrees
with the SDK); ``part_on`` is what the parts ask, and ``GYM_AUTOINSTR_FAST_PATH=off``
turns every one off.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gym_autoinstr import settings

# -- the parts ---------------------------------------------------------------------------

CONTEXT = "context"  # context_ops.py: current context, attach and spans set in a context, on its ContextVar
W3C = "w3c_propagation"  # w3c.py: traceparent/tracestate written and read directly
LEAN = "lean_spans"  # lean.py: LeanSpan/LeanTracer behind our own pipeline
WIRE = "wire_encoder"  # wire.py: spans written as OTLP protobuf bytes
ENCODE_ON_END = "encode_on_end"  # batching.py: spans encoded when they end, bytes through the OTLP exporter
HISTOGRAMS = "histograms"  # histograms.py: request histograms aggregated by us, merged at export
SAMPLERS = "samplers"  # samplers.py: stock samplers' decisions read off their objects
# not fast parts: set-up and instrumentation paths that also touch private names (no switch)
SETUP = "setup"
LOGS = "logs"
INSTRUMENTATION = "instrumentation"

FAST_PARTS = (CONTEXT, W3C, WIRE, ENCODE_ON_END, LEAN, HISTOGRAMS, SAMPLERS)  # (a part after those it needs)


@dataclass(frozen=True)
class Row:
    """One private OpenTelemetry name: ``name`` as OpenTelemetry spells it, ``owner`` the
    module or class that holds it, ``part`` the part that uses it, ``how`` how it is
    resolved across versions, ``check`` True when it is there (may raise: then False).
    ``optional``: absent on some supported versions, with a stand-in (the part does not
    depend on it)."""

    name: str
    owner: str
    part: str
    how: str
    check: Callable[[], bool]
    optional: bool = False


def _from(module: str, name: str, default: Any = None) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return default


def _has(module: str, name: str) -> Callable[[], bool]:
    return lambda: hasattr(importlib.import_module(module), name)


def _importable(module: str) -> Callable[[], bool]:
    return lambda: importlib.import_module(module) is not None


def _attribute_of(make: Callable[[], Any], name: str) -> Callable[[], bool]:
    return lambda: hasattr(make(), name)


def _set_in_init(owner: Callable[[], Any], name: str) -> Callable[[], bool]:
    """``name`` is an attribute ``owner().__init__`` sets (for objects too costly to make)."""
    return lambda: name in owner().__init__.__code__.co_names


# -- values resolved at import (the hot paths bind them once) ----------------------------

# where the API keeps the current span in a context (since API 1.0)
SPAN_KEY = _from("opentelemetry.trace.propagation", "_SPAN_KEY")
# the key baggage lives under (since API 1.0); get_all() copies it into a proxy
BAGGAGE_KEY = _from("opentelemetry.baggage", "_BAGGAGE_KEY")
# the runtime context object behind opentelemetry.context (contextvars by default)
RUNTIME_CONTEXT = _from("opentelemetry.context", "_RUNTIME_CONTEXT")
# exporters attach it around their own requests (older APIs: a plain string key)
SUPPRESS_INSTRUMENTATION_KEY = _from(
    "opentelemetry.context", "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation"
)
# HTTP client instrumentations skip their span under it (older APIs: in the instrumentation package)
SUPPRESS_HTTP_INSTRUMENTATION_KEY = _from("opentelemetry.context", "_SUPPRESS_HTTP_INSTRUMENTATION_KEY") or _from(
    "opentelemetry.instrumentation.utils", "_SUPPRESS_HTTP_INSTRUMENTATION_KEY"
)
if SUPPRESS_HTTP_INSTRUMENTATION_KEY is None:  # pragma: no cover (no API has neither): a key nobody else sets
    from opentelemetry.context import create_key

    SUPPRESS_HTTP_INSTRUMENTATION_KEY = create_key("suppress_http_instrumentation")
# the SDK's attribute validation: SDK >= 1.40 (keeps None, odd types made str), older ones
CLEAN_ATTRIBUTE_VALUE = _from("opentelemetry.attributes", "_clean_attribute_value")
CLEAN_ATTRIBUTE = _from("opentelemetry.attributes", "_clean_attribute")


def _cleaned_by_key() -> bool:
    """Which of the two the installed API's ``BoundedAttributes`` (what SDK spans store
    attributes in) calls: API 1.39 has both functions but still cleans by key."""
    try:
        from opentelemetry.attributes import BoundedAttributes

        return "_clean_attribute" in BoundedAttributes.__setitem__.__code__.co_names
    except (ImportError, AttributeError):
        return CLEAN_ATTRIBUTE is not None


ATTRIBUTES_CLEANED_BY_KEY = _cleaned_by_key()

# -- attribute names (read with getattr, where they were read before) ---------------------

TRACER_PROVIDER_GLOBAL = "_TRACER_PROVIDER"  # opentelemetry.trace: the global provider once set
RUNTIME_CONTEXT_VAR = "_current_context"  # ContextVarsRuntimeContext: its ContextVar
COMPOSITE_PROPAGATORS = "_propagators"  # CompositePropagator: its propagators
TRACESTATE_MEMBERS = "_dict"  # TraceState: its members, in order (filled directly for Level 2 keys)
TRACER_SCOPE = "_instrumentation_scope"  # sdk Tracer
TRACER_SPAN_LIMITS = "_span_limits"  # sdk Tracer
ACTIVE_SPAN_PROCESSOR = "_active_span_processor"  # sdk TracerProvider: its multi-processor
SPAN_PROCESSORS = "_span_processors"  # the multi-processor's tuple of processors
PROVIDER_RESOURCE = "_resource"  # sdk TracerProvider
PROVIDER_TRACERS = "_tracers"  # sdk TracerProvider (newer SDKs, not 1.39): the tracers it handed out
GRPC_TRANSLATE = "_translate_data"  # OTLP/gRPC span exporter: the method that calls encode_spans
PARENT_BASED_ROOT = "_root"  # ParentBased: the root sampler
REMOTE_PARENT_SAMPLED = "_remote_parent_sampled"  # ParentBased's four delegates
REMOTE_PARENT_NOT_SAMPLED = "_remote_parent_not_sampled"
LOCAL_PARENT_SAMPLED = "_local_parent_sampled"
LOCAL_PARENT_NOT_SAMPLED = "_local_parent_not_sampled"
STATIC_DECISION = "_decision"  # StaticSampler: its decision
PREFERRED_TEMPORALITY = "_preferred_temporality"  # MetricExporter
PREFERRED_AGGREGATION = "_preferred_aggregation"  # MetricExporter
BUCKET_BOUNDARIES = "_boundaries"  # ExplicitBucketHistogramAggregation
RECORD_MIN_MAX = "_record_min_max"  # ExplicitBucketHistogramAggregation
READER_EXPORTER = "_exporter"  # PeriodicExportingMetricReader
INSTRUMENTED_APP = "_is_instrumented_by_opentelemetry"  # set on an app by the FastAPI/Starlette instrumentations

# -- private modules (loaded when first needed: ``load(LOGS_SDK)``) ------------------------

LOGS_API = "opentelemetry._logs"
LOGS_SDK = "opentelemetry.sdk._logs"
LOGS_SDK_EXPORT = "opentelemetry.sdk._logs.export"
OTLP_HTTP_LOG_EXPORTER = "opentelemetry.exporter.otlp.proto.http._log_exporter"
OTLP_GRPC_LOG_EXPORTER = "opentelemetry.exporter.otlp.proto.grpc._log_exporter"
LOG_ENCODER = "opentelemetry.exporter.otlp.proto.common._log_encoder"
SDK_CONFIGURATION = "opentelemetry.sdk._configuration"


def load(module: str) -> Any:
    """One of the private modules above (raises ImportError as ``import`` would)."""
    return importlib.import_module(module)


@functools.cache
def _sdk_provider() -> Any:
    """A bare SDK provider to look at (its resource given: ``Resource.create`` would run
    the resource detectors, on threads)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(resource=Resource({}), shutdown_on_exit=False)


def _sdk_tracer() -> Any:
    return _sdk_provider().get_tracer("gym_autoinstr.contract")


def _parent_based() -> Any:
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    return ParentBased(ALWAYS_ON)


def _static() -> Any:
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    return ALWAYS_ON


def _metric_exporter() -> Any:
    from opentelemetry.sdk.metrics.export import MetricExporter

    class Probe(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            return None

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            return None

    return Probe()


def _bucket_aggregation() -> Any:
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation

    return ExplicitBucketHistogramAggregation()


def _periodic_reader() -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return PeriodicExportingMetricReader


def _grpc_exporter_calls_encode_spans() -> bool:
    import sys

    module = sys.modules.get("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    if module is None:  # not in use here (importing it costs ~100 ms): nothing to hook there
        return True
    code = getattr(getattr(module.OTLPSpanExporter, GRPC_TRANSLATE, None), "__code__", None)
    return code is not None and "encode_spans" in code.co_names


def _exporter_module_encodes(module_name: str, method: str) -> Callable[[], bool]:
    """The exporter module's ``encode_spans`` (batching.py wraps it) is there, and its
    span exporter's ``method`` calls it; True when the module is not loaded (not in use)."""

    def check() -> bool:
        import sys

        module = sys.modules.get(module_name)
        if module is None:
            return True
        code = getattr(getattr(module.OTLPSpanExporter, method, None), "__code__", None)
        return callable(getattr(module, "encode_spans", None)) and code is not None and "encode_spans" in code.co_names

    return check


def _runtime_context_var() -> bool:
    import contextvars

    return isinstance(getattr(RUNTIME_CONTEXT, RUNTIME_CONTEXT_VAR, None), contextvars.ContextVar)


ROWS: tuple[Row, ...] = (
    Row("_SPAN_KEY", "opentelemetry.trace.propagation", CONTEXT, "module constant", lambda: SPAN_KEY is not None),
    Row("_RUNTIME_CONTEXT", "opentelemetry.context", CONTEXT, "module constant", lambda: RUNTIME_CONTEXT is not None),
    Row(RUNTIME_CONTEXT_VAR, "ContextVarsRuntimeContext", CONTEXT, "instance attribute", _runtime_context_var),
    Row("_BAGGAGE_KEY", "opentelemetry.baggage", W3C, "module constant", lambda: BAGGAGE_KEY is not None),
    Row(
        COMPOSITE_PROPAGATORS,
        "opentelemetry.propagators.composite.CompositePropagator",
        W3C,
        "instance attribute",
        lambda: hasattr(
            importlib.import_module("opentelemetry.propagators.composite").CompositePropagator([]), "_propagators"
        ),
    ),
    Row(
        TRACESTATE_MEMBERS,
        "opentelemetry.trace.TraceState",
        W3C,
        "instance attribute; checked again by behaviour at import (else the API's constructor, Level 1 keys only)",
        _attribute_of(lambda: importlib.import_module("opentelemetry.trace").TraceState(), TRACESTATE_MEMBERS),
        optional=True,
    ),
    Row(
        "_clean_attribute_value",
        "opentelemetry.attributes",
        LEAN,
        "function; used when BoundedAttributes.__setitem__ does not call _clean_attribute (API >= 1.40)",
        lambda: CLEAN_ATTRIBUTE_VALUE is not None,
        optional=True,
    ),
    Row(
        "_clean_attribute",
        "opentelemetry.attributes",
        LEAN,
        "function; used when BoundedAttributes.__setitem__ calls it (APIs before 1.40, 1.39 has both)",
        lambda: CLEAN_ATTRIBUTE is not None,
        optional=True,
    ),
    Row(
        TRACER_SCOPE,
        "opentelemetry.sdk.trace.Tracer",
        LEAN,
        "instance attribute",
        _attribute_of(_sdk_tracer, TRACER_SCOPE),
    ),
    Row(
        TRACER_SPAN_LIMITS,
        "opentelemetry.sdk.trace.Tracer",
        LEAN,
        "instance attribute",
        _attribute_of(_sdk_tracer, TRACER_SPAN_LIMITS),
    ),
    Row(
        ACTIVE_SPAN_PROCESSOR,
        "opentelemetry.sdk.trace.TracerProvider",
        LEAN,
        "instance attribute",
        _attribute_of(_sdk_provider, ACTIVE_SPAN_PROCESSOR),
    ),
    Row(
        SPAN_PROCESSORS,
        "opentelemetry.sdk.trace.SynchronousMultiSpanProcessor",
        LEAN,
        "instance attribute",
        lambda: hasattr(getattr(_sdk_provider(), ACTIVE_SPAN_PROCESSOR), SPAN_PROCESSORS),
    ),
    Row(
        TRACER_PROVIDER_GLOBAL,
        "opentelemetry.trace",
        LEAN,
        "module global (None until set; then get_tracer_provider() is used)",
        _has("opentelemetry.trace", TRACER_PROVIDER_GLOBAL),
        optional=True,
    ),
    Row(
        "_SUPPRESS_INSTRUMENTATION_KEY",
        "opentelemetry.context",
        ENCODE_ON_END,
        "module constant (older APIs: the string 'suppress_instrumentation')",
        _has("opentelemetry.context", "_SUPPRESS_INSTRUMENTATION_KEY"),
        optional=True,
    ),
    Row(
        "encode_spans",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter (public name, wrapped in place)",
        ENCODE_ON_END,
        "module function its OTLPSpanExporter.export calls (checked in its code)",
        _exporter_module_encodes("opentelemetry.exporter.otlp.proto.http.trace_exporter", "export"),
    ),
    Row(
        "encode_spans",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter (public name, wrapped in place)",
        ENCODE_ON_END,
        "module function its OTLPSpanExporter._translate_data calls (checked in its code)",
        _exporter_module_encodes("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", GRPC_TRANSLATE),
    ),
    Row(
        GRPC_TRANSLATE,
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter.OTLPSpanExporter",
        ENCODE_ON_END,
        "method that calls encode_spans (checked in its code)",
        _grpc_exporter_calls_encode_spans,
    ),
    Row(
        PARENT_BASED_ROOT,
        "opentelemetry.sdk.trace.sampling.ParentBased",
        SAMPLERS,
        "instance attribute",
        _attribute_of(_parent_based, PARENT_BASED_ROOT),
    ),
    *(
        Row(
            delegate,
            "opentelemetry.sdk.trace.sampling.ParentBased",
            SAMPLERS,
            "instance attribute",
            _attribute_of(_parent_based, delegate),
        )
        for delegate in (
            REMOTE_PARENT_SAMPLED,
            REMOTE_PARENT_NOT_SAMPLED,
            LOCAL_PARENT_SAMPLED,
            LOCAL_PARENT_NOT_SAMPLED,
        )
    ),
    Row(
        STATIC_DECISION,
        "opentelemetry.sdk.trace.sampling.StaticSampler",
        SAMPLERS,
        "instance attribute",
        _attribute_of(_static, STATIC_DECISION),
    ),
    *(
        Row(
            name,
            "opentelemetry.sdk.metrics.export.MetricExporter",
            HISTOGRAMS,
            "instance attribute",
            _attribute_of(_metric_exporter, name),
        )
        for name in (PREFERRED_TEMPORALITY, PREFERRED_AGGREGATION)
    ),
    *(
        Row(
            name,
            "opentelemetry.sdk.metrics.view.ExplicitBucketHistogramAggregation",
            HISTOGRAMS,
            "instance attribute",
            _attribute_of(_bucket_aggregation, name),
        )
        for name in (BUCKET_BOUNDARIES, RECORD_MIN_MAX)
    ),
    Row(
        READER_EXPORTER,
        "opentelemetry.sdk.metrics.export.PeriodicExportingMetricReader",
        HISTOGRAMS,
        "instance attribute (set in __init__: checked in its code)",
        _set_in_init(_periodic_reader, READER_EXPORTER),
    ),
    Row(
        "_get_from_env_or_default",
        "opentelemetry.sdk.trace.sampling",
        SETUP,
        "function (absent: a TracerProvider's own sampler, which it reads the same way)",
        _has("opentelemetry.sdk.trace.sampling", "_get_from_env_or_default"),
        optional=True,
    ),
    Row(
        "_BaseConfigurator",
        SDK_CONFIGURATION,
        SETUP,
        "class (absent: a stand-in with its configure() entry)",
        _has(SDK_CONFIGURATION, "_BaseConfigurator"),
        optional=True,
    ),
    Row(
        PROVIDER_RESOURCE,
        "opentelemetry.sdk.trace.TracerProvider",
        SETUP,
        "instance attribute",
        _attribute_of(_sdk_provider, PROVIDER_RESOURCE),
    ),
    Row(
        PROVIDER_TRACERS,
        "opentelemetry.sdk.trace.TracerProvider",
        SETUP,
        "instance attribute, SDKs after 1.39 (absent: no tracers kept, nothing to update)",
        _attribute_of(_sdk_provider, PROVIDER_TRACERS),
        optional=True,
    ),
    *(
        Row(module, module, LOGS, "private module (the logs signal's)", _importable(module), optional=optional)
        for module, optional in (
            (LOGS_API, False),
            (LOGS_SDK, False),
            (LOGS_SDK_EXPORT, False),
            (OTLP_HTTP_LOG_EXPORTER, True),
            (OTLP_GRPC_LOG_EXPORTER, True),
            (LOG_ENCODER, True),
        )
    ),
    Row(
        "_SUPPRESS_HTTP_INSTRUMENTATION_KEY",
        "opentelemetry.context (older: opentelemetry.instrumentation.utils)",
        INSTRUMENTATION,
        "module constant (absent in both: a key nobody sets)",
        lambda: (
            _from("opentelemetry.context", "_SUPPRESS_HTTP_INSTRUMENTATION_KEY") is not None
            or _from("opentelemetry.instrumentation.utils", "_SUPPRESS_HTTP_INSTRUMENTATION_KEY") is not None
        ),
    ),
    Row(
        INSTRUMENTED_APP,
        "opentelemetry.instrumentation.fastapi (an app it instrumented)",
        INSTRUMENTATION,
        "attribute read with getattr (absent: not instrumented by it)",
        lambda: True,
        optional=True,
    ),
)


def row_resolves(row: Row) -> bool:
    try:
        return bool(row.check())
    except Exception:
        return False


def missing(part: str) -> list[str]:
    """The rows of ``part`` that do not resolve and that the part cannot do without."""
    return [row.name for row in ROWS if row.part == part and not row.optional and not row_resolves(row)]


def sampler_from_environment() -> Any:
    """``OTEL_TRACES_SAMPLER``/``_ARG`` as the SDK reads them."""
    from opentelemetry.sdk.trace import sampling

    read = getattr(sampling, "_get_from_env_or_default", None)
    if read is not None:
        return read()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(resource=Resource({}), shutdown_on_exit=False).sampler


def base_configurator() -> type:
    """The SDK's ``_BaseConfigurator`` (what ``opentelemetry_configurator`` entry points
    subclass), or a stand-in with the same ``configure`` entry."""
    found = _from(SDK_CONFIGURATION, "_BaseConfigurator")
    if found is not None:
        return found

    class BaseConfigurator:  # pragma: no cover (every SDK we support has it)
        def configure(self, **kwargs: Any) -> None:
            self._configure(**kwargs)

        def _configure(self, **kwargs: Any) -> None:
            raise NotImplementedError

    return BaseConfigurator


# -- which parts are on ------------------------------------------------------------------


@dataclass(slots=True)
class PartStatus:
    on: bool
    reason: str  # why off (or "" when on)


# Filled by parts.check() when the pipeline is built; a part not in it is on while the
# master switch is (its check has not run: nothing was built yet).
STATUS: dict[str, PartStatus] = {}


def switch_on() -> bool:
    return settings.FAST_PATH.read()


def part_on(part: str) -> bool:
    """Whether ``part`` may replace the SDK's machinery here (asked at build time)."""
    if not switch_on():
        return False
    status = STATUS.get(part)
    return status is None or status.on
