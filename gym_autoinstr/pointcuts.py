"""Every place gym-autoinstr touches, as data.

Reading this table tells the whole footprint of the instrumentor: which module and
attribute, the advice applied, the Gym versions it exists in, and the span group it
serves.  ``instrumentor.py`` applies it through post-import hooks; ``gym-autoinstr
doctor`` prints it against the installed Gym.

Advice functions have wrapt's wrapper signature ``(wrapped, instance, args, kwargs)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import coexistence, egress, groups, ingress


@dataclass(frozen=True)
class Pointcut:
    name: str
    module: str
    attribute: str  # dotted path inside the module: "request", "SimpleServer.run_webserver"
    advice: Callable[[Any, Any, tuple, dict], Any]
    versions: str  # the nemo-gym releases where the target exists
    group: "str | None"  # the span group its spans belong to (None: plumbing)
    purpose: str
    rebind_copies: bool = False  # modules copy it by name (`from m import f`)
    optional: bool = False  # absent in some supported Gym versions: not a warning


POINTCUTS: tuple[Pointcut, ...] = (
    Pointcut(
        name="egress",
        module="nemo_gym.server_utils",
        attribute="request",
        advice=egress.request_advice,
        versions="0.2.0+",
        group=groups.HTTP_CLIENT,
        purpose="CLIENT span per logical request, traceparent injected into a copy of the headers",
        rebind_copies=True,
    ),
    Pointcut(
        name="ingress",
        module="nemo_gym.server_utils",
        attribute="SimpleServer.run_webserver",
        advice=ingress.run_webserver_advice,
        versions="0.2.0+",
        group=groups.SERVER,
        purpose="scope the uvicorn advice to Gym servers; instrument the app each uvicorn worker serves",
    ),
    Pointcut(
        name="ingress.uvicorn",
        module="uvicorn",
        attribute="run",
        advice=ingress.uvicorn_run_advice,
        versions="any uvicorn",
        group=groups.SERVER,
        purpose="SERVER-span middleware on the app before it starts; flush when serving ends",
    ),
    Pointcut(
        name="ingress.head_server",
        module="nemo_gym.server_utils",
        attribute="HeadServer.setup_webserver",
        advice=ingress.head_server_advice,
        versions="0.2.0+",
        group=None,
        purpose="keep FastAPI's built-in telemetry off the head server (orchestrator plumbing, not rollout work)",
    ),
    Pointcut(
        name="egress.attempts",
        module="aiohttp.client",
        attribute="ClientSession.request",
        advice=egress.count_attempt_advice,
        versions="any aiohttp",
        group=groups.HTTP_CLIENT,
        purpose="count the attempts inside one traced request (http.request.resend_count)",
    ),
    Pointcut(
        name="coexistence",
        module="nemo_gym.telemetry.setup",
        attribute="init_telemetry",
        advice=coexistence.init_telemetry_advice,
        versions="0.6.0+",
        group=None,
        purpose="stand down where Gym's own telemetry is live",
        optional=True,
    ),
)
