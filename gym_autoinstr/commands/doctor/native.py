"""Is Gym's own telemetry (0.7+, through nemo-lens) live here?  Then we stand down."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from gym_autoinstr.commands.doctor.report import INFO, WARNING, Problem, adder

# The names Gym 0.7's ``init_telemetry`` imports from nemo-lens; without every one of
# them it logs "nemo-lens is not installed" and its call sites stay inert.
NEMO_LENS_NAMES = (
    ("nemo.lens", ("NemoLensConfig", "TelemetryHandle", "get_meter", "get_tracer", "setup_telemetry", "handle")),
    ("nemo.lens.semconv", ("NV_DL_RANK", "NV_DL_WORLD_SIZE")),
)


def native_telemetry(report: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Problem]]:
    """Whether Gym's own OpenTelemetry call sites (0.7+) would export in a Gym server."""
    from gym_autoinstr.advice import coexistence

    section: dict[str, Any] = {
        "present": False,
        "call_sites": False,
        "enabled": False,
        "nemo_lens": None,
        "exporting_now": False,
        "live": False,
    }
    problems: list[Problem] = []
    add = adder(problems, "Gym telemetry")
    setup = sys.modules.get("nemo_gym.telemetry.setup")
    server_utils = sys.modules.get("nemo_gym.server_utils")
    if setup is None:
        return section, problems
    section["present"] = True
    try:
        section["call_sites"] = hasattr(getattr(server_utils, "SimpleServer", None), "setup_telemetry")
        section["enabled"] = bool(setup.is_telemetry_env_enabled())
    except Exception:
        pass
    missing = []
    for module, names in NEMO_LENS_NAMES:
        try:
            loaded = importlib.import_module(module)
        except Exception:
            missing.append(module)
            continue
        missing += [f"{module}.{name}" for name in names if not hasattr(loaded, name)]
    section["nemo_lens"] = "usable" if not missing else f"missing {', '.join(missing)}"
    section["exporting_now"] = coexistence._handle_is_exporting()
    section["live"] = section["exporting_now"] or (section["call_sites"] and section["enabled"] and not missing)
    standing_down = next((r for r in report if r["name"] == "coexistence"), None)
    if section["live"]:
        if standing_down is not None and not standing_down["resolved"]:
            add(
                WARNING,
                "Gym's own telemetry is live but the coexistence pointcut did not resolve: every span would be doubled",
                "turn Gym's telemetry off (unset NEMO_GYM_OTEL_ENABLED / NEMO_LENS_ENABLED)",
            )
        else:
            add(
                INFO,
                "Gym's own telemetry is live (nemo-lens): gym-autoinstr stands down in Gym servers, "
                "traces come from Gym",
                "to trace with gym-autoinstr instead, unset NEMO_GYM_OTEL_ENABLED / NEMO_LENS_ENABLED",
            )
    elif section["enabled"] and section["call_sites"]:
        add(
            INFO,
            f"Gym's own telemetry is enabled but inert (nemo-lens {section['nemo_lens']}): "
            "gym-autoinstr traces instead",
            "nothing to do",
        )
    return section, problems
