"""The fleet's addresses: ``host:port`` -> the Gym server there and its kind, from the
config dict Gym already loaded (``nemo_gym.global_config``).  Read once that config is
loaded; egress names its CLIENT spans' callees by it, ``pool`` its metrics' destinations.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gym_autoinstr._log import warn_once


@dataclass(slots=True)
class _Addresses:
    names: dict[str, str] | None = None  # host:port -> Gym server name, once Gym's config is loaded
    kinds: dict[str, str] | None = None  # host:port -> the server's kind (responses_api_models, ...)


_state = _Addresses()


def server_names() -> dict[str, str]:
    """``host:port`` -> Gym server name, from the config dict Gym already loaded."""
    names = _state.names
    if names is not None:
        return names
    names, kinds = {}, {}
    config = getattr(sys.modules.get("nemo_gym.global_config"), "_GLOBAL_CONFIG_DICT", None)
    if config is not None:
        try:
            for top, value in config.items():
                try:
                    # {name: {kind: {implementation: {host, port, ...}}}}
                    kind, implementations = next(iter(value.items()))
                    server = next(iter(implementations.values()))
                    key = f"{server['host']}:{server['port']}"
                    names[key] = str(top)
                    kinds[key] = str(kind)
                except Exception:
                    continue
        except Exception as error:
            warn_once("pool:names", "destination server names unavailable (%r); host:port is used.", error)
        _state.kinds = kinds
        _state.names = names  # cached only once Gym's config is loaded
    return names


def server_name_for(host: str | None, port: int | None) -> str | None:
    """The Gym server at ``host:port`` per Gym's config, or None."""
    return server_names().get(f"{host}:{port}")


def server_kind_for(host: str | None, port: int | None) -> str | None:
    """The kind of the Gym server at ``host:port`` (``responses_api_agents``,
    ``responses_api_models``, ``resources_servers``, ...) per Gym's config, or None."""
    server_names()
    return (_state.kinds or {}).get(f"{host}:{port}")
