"""Sandbox spans: ``gym.sandbox.start`` / ``.exec`` / ``.stop`` on ``AsyncSandbox`` (0.4.0+).

Every provider (docker, daytona, opensandbox, a user's own) is driven through
``nemo_gym.sandbox.api.AsyncSandbox``; the synchronous ``Sandbox`` runs the async one on
a private loop, so patching the async class covers both.

Only content-free facts are recorded: the provider name, the sandbox id, and for exec
the return code and the provider's error type.  The command is model output or task
content, and cwd, env, stdout and stderr can hold anything: none of them is ever read.

Metrics (whatever the span groups, when metrics are live): ``gym.sandbox.active``
(up-down counter: +1 when a start succeeds, -1 when a running sandbox is stopped),
``gym.sandbox.startup_duration_ms`` and ``gym.sandbox.exec_duration_ms`` (histograms,
failures included), and ``gym.sandbox.create_retry_total`` (counter), all by
``nemo.gym.sandbox.provider``.

Create retries.  The providers that retry their creates (opensandbox from 0.4.0, daytona
from 0.5.0) do it with tenacity, passing their module-level ``_log_create_retry`` as
``before_sleep``: it runs once per failed attempt that will be tried again.  The retry
policy is built inside ``create`` on every call, so the name is looked up in the
provider's module at that moment and a patch of the module attribute is seen (no name
copies to chase).  The provider is the module's package name, as Gym's own call site in
0.7.0 spells it (``opensandbox``, ``daytona``).

Gym 0.7.0 records every one of these metrics itself through ``nemo_gym.telemetry`` (inert
without a working nemo-lens).  Where Gym's own telemetry is live
(``coexistence.native_telemetry_live``) we record none of them, so nothing is counted
twice; Gym then records them under its own sandbox span-group switch.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gym_autoinstr._log import warn_once
from gym_autoinstr.advice import coexistence
from gym_autoinstr.attributes import SANDBOX_ERROR_TYPE, SANDBOX_ID, SANDBOX_PROVIDER, SANDBOX_RETURN_CODE
from gym_autoinstr.telemetry import groups, metrics
from gym_autoinstr.telemetry.spans import run_in_span, tracer


def _provider_name(sandbox: Any) -> str:
    provider = getattr(sandbox, "_provider", None)
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


def _sandbox_id(sandbox: Any) -> str | None:
    sandbox_id = getattr(getattr(sandbox, "_handle", None), "sandbox_id", None)
    return str(sandbox_id) if sandbox_id is not None else None


def _enabled() -> bool:
    return groups.SANDBOX in groups.ENABLED and not coexistence.native_telemetry_live()


def _metrics_live() -> bool:
    return metrics.LIVE and not coexistence.native_telemetry_live()


def _open(name: str, sandbox: Any) -> trace.Span | None:
    try:
        attributes: dict[str, Any] = {SANDBOX_PROVIDER: _provider_name(sandbox)}
        sandbox_id = _sandbox_id(sandbox)
        if sandbox_id:
            attributes[SANDBOX_ID] = sandbox_id
        return tracer().start_span(name, kind=SpanKind.INTERNAL, attributes=attributes)
    except Exception as error:
        warn_once(f"sandbox:{name}", "%s span skipped: %r", name, error)
        return None


async def _traced(name: str, sandbox: Any, call: Any, after: Any = None) -> Any:
    span = _open(name, sandbox)
    if span is None:
        return await call()
    return await run_in_span(span, call, after, label=name)


async def _measured(kind: str, sandbox: Any, call: Any) -> Any:
    """``call()`` timed into the sandbox metrics (a start that succeeds also counts as active)."""
    started = time.perf_counter()
    ok = False
    try:
        result = await call()
        ok = True
        return result
    finally:
        try:
            metrics.record_sandbox(kind, _provider_name(sandbox), (time.perf_counter() - started) * 1000.0, ok)
        except Exception as error:
            warn_once(f"sandbox-metrics:{kind}", "sandbox %s not measured: %r", kind, error)


async def start_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _metrics_live():
        return await _measured("start", instance, lambda: _start(wrapped, instance, args, kwargs))
    return await _start(wrapped, instance, args, kwargs)


async def _start(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not _enabled():
        return await wrapped(*args, **kwargs)

    def after(span: Any, result: Any) -> None:
        sandbox_id = _sandbox_id(instance)
        if sandbox_id:
            span.set_attribute(SANDBOX_ID, sandbox_id)

    return await _traced("gym.sandbox.start", instance, lambda: wrapped(*args, **kwargs), after)


async def exec_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _metrics_live():
        return await _measured("exec", instance, lambda: _exec(wrapped, instance, args, kwargs))
    return await _exec(wrapped, instance, args, kwargs)


async def _exec(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not _enabled():
        return await wrapped(*args, **kwargs)

    def after(span: Any, result: Any) -> None:
        return_code = getattr(result, "return_code", None)
        if isinstance(return_code, int) and not isinstance(return_code, bool):
            span.set_attribute(SANDBOX_RETURN_CODE, return_code)
        error_type = getattr(result, "error_type", None)
        if error_type is not None:
            span.set_attribute(SANDBOX_ERROR_TYPE, str(error_type))

    return await _traced("gym.sandbox.exec", instance, lambda: wrapped(*args, **kwargs), after)


async def stop_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Only a stop that closes a running sandbox is work worth a span.
    running = getattr(instance, "_handle", None) is not None and not getattr(instance, "_stopped", True)
    if running and _metrics_live():
        try:
            metrics.record_sandbox("stop", _provider_name(instance), 0.0, True)
        except Exception as error:
            warn_once("sandbox-metrics:stop", "sandbox stop not counted: %r", error)
    if not running or not _enabled():
        return await wrapped(*args, **kwargs)
    return await _traced("gym.sandbox.stop", instance, lambda: wrapped(*args, **kwargs))


_PROVIDERS_PACKAGE = "nemo_gym.sandbox.providers."


def _retrying_provider(wrapped: Any) -> str:
    """``opensandbox`` for ``nemo_gym.sandbox.providers.opensandbox.provider``."""
    module = getattr(wrapped, "__module__", None) or ""
    if module.startswith(_PROVIDERS_PACKAGE):
        return module[len(_PROVIDERS_PACKAGE) :].split(".", 1)[0]
    return module.rsplit(".", 1)[-1] or "unknown"


def create_retry_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Around a provider's ``_log_create_retry`` (tenacity's ``before_sleep``): Gym logs the
    retry, then one ``gym.sandbox.create_retry_total`` by provider."""
    result = wrapped(*args, **kwargs)
    if _metrics_live():
        try:
            metrics.record_sandbox_create_retry(_retrying_provider(wrapped))
        except Exception as error:
            warn_once("sandbox-metrics:create_retry", "sandbox create retry not counted: %r", error)
    return result
