"""On/off switches read from the environment (``GYM_AUTOINSTR_*``), all parsed one way."""

from __future__ import annotations

import os
from typing import Mapping

from gym_autoinstr._log import warn_once

OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")


def switched_off(name: str, environ: "Mapping[str, str] | None" = None) -> bool:
    """Whether the default-on switch ``name`` is turned off (0, false, no, off).

    Unset or empty keeps it on; any other value keeps it on too, with a warning that
    names the variable and the values it takes."""
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if value in OFF:
        return True
    if value and value not in ON:
        warn_once(f"switch:{name}:{value}", "%s=%r is not an on/off value; it stays on. Set it to 'false' "
                  "(or 0, no, off) to turn it off, 'true' to keep it on.", name, raw)
    return False
