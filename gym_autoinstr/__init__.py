"""gym-autoinstr: zero-code OpenTelemetry tracing for NVIDIA NeMo Gym.

Run Gym under ``opentelemetry-instrument`` with this package installed and every
rollout becomes one trace across the agent, model and resources server processes.
See README.md for usage and ``pointcuts.py`` for everything it touches in Gym.
"""

from gym_autoinstr.version import __version__

__all__ = ["__version__"]
