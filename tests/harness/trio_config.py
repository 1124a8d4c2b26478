"""What a real Gym trio (``trio.py``) is made of: its servers' names, the resources servers it can
run and their task rows, and ``TrioConfig``, the half of ``GymTrio`` that writes the Gym config
and the per-server venv links and gives the command line and environment Gym starts with.

Servers (top-level config keys, fixed by this harness):

* ``example_single_tool_call`` -- resources ``resources_servers/example_single_tool_call``
* ``example_single_tool_call_simple_agent`` -- agent ``responses_api_agents/simple_agent``
* ``policy_model`` -- model ``responses_api_models/openai_model`` -> ``policy_url``
* 0.7.0+: ``example_single_tool_call_environment_server`` -- the
  ``environment_servers/legacy_agent`` relay in front of the agent.  Gym would
  generate one itself (random port, deprecation warning); we declare it so its
  port is fixed.  Rollouts are posted to the relay's ``/run``, which forwards the
  body to the agent's ``/run`` unchanged.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

RESOURCES = "example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"
MODEL = "policy_model"
ENVIRONMENT = "example_single_tool_call_environment_server"

# The resources servers a trio can run, with the settings their configs need.
RESOURCES_CONFIGS: dict[str, dict[str, Any]] = {
    RESOURCES: {"domain": "agent", "verified": False, "description": "Basic single-step tool calling"},
    # Gym's competitive-coding verifier: runs the model's fenced python block against
    # the row's unit tests in a Ray task (SPREAD, runtime_env replacing PYTHONPATH).
    "code_gen": {
        "domain": "coding",
        "verified": False,
        "description": "code_gen",
        "num_processes": 4,
        "unit_test_timeout_secs": 30,
        "debug": False,
    },
    # A test server in the style of Gym's actor-based verifiers (tests/fixtures/ray_scorer): its
    # verify calls long-lived Ray actors (plain, threaded, async).
    "ray_scorer": {"domain": "other", "verified": False, "description": "ray_scorer"},
    # A test server whose verify returns each row's own reward (tests/fixtures/graded): varied,
    # known rewards; its tool is get_weather, as the example's.
    "graded": {"domain": "other", "verified": False, "description": "graded"},
}
# The resources servers whose verify runs Ray tasks or actors (their workers are the fleet's).
RAY_RESOURCES = ("code_gen", "ray_scorer")
# Resources servers that are not Gym's: their source directory, copied into the working
# directory as resources_servers/<name> (where `gym env start` looks first).
LOCAL_RESOURCES: dict[str, pathlib.Path] = {
    "ray_scorer": pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "ray_scorer",
    "graded": pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "graded",
}
# A ray_scorer task row; `fail` ("await" or "get") makes its verify also call an actor
# method that raises, and wait for it that way.
RAY_SCORER_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Say something."}]},
    "verifier_metadata": {"fail": "", "secret": ""},
}
# A code_gen task row the policy model's CODE_ANSWER solves.
CODE_GEN_ROW = {
    "responses_create_params": {
        "input": [
            {"role": "user", "content": "Read two integers and print their sum. Answer with a ```python code block."}
        ]
    },
    "verifier_metadata": {"unit_tests": {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"], "fn_name": None}},
}
CODE_ANSWER = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

_MARKER_ENV = "GYM_AUTOINSTR_TRIO_ID"


def _deep_merge(dst: dict, src: Mapping) -> dict:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


class GymTrioError(RuntimeError):
    pass


class TrioConfig:
    """``GymTrio``'s config: read off the attributes ``GymTrio.__init__`` sets."""

    # ------------------------------------------------------------------ config

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.ports[name]}"

    @property
    def run_url(self) -> str:
        """Where a task row is POSTed: the relay on 0.7+, else the agent."""
        return self.url(ENVIRONMENT if self.has_relay else AGENT) + "/run"

    def build_config(self) -> dict:
        h = self.host
        cfg: dict[str, Any] = {
            "head_server": {"host": h, "port": self.head_port},
            self.resources: {
                "resources_servers": {
                    self.resources: {
                        "entrypoint": "app.py",
                        "host": h,
                        "port": self.ports[self.resources],
                        **RESOURCES_CONFIGS[self.resources],
                    }
                }
            },
            AGENT: {
                "responses_api_agents": {
                    "simple_agent": {
                        "entrypoint": "app.py",
                        "host": h,
                        "port": self.ports[AGENT],
                        "resources_server": {"type": "resources_servers", "name": self.resources},
                        "model_server": {"type": "responses_api_models", "name": MODEL},
                    }
                }
            },
            MODEL: {
                "responses_api_models": {
                    "openai_model": {
                        "entrypoint": "app.py",
                        "host": h,
                        "port": self.ports[MODEL],
                        "openai_base_url": self.policy_url,
                        "openai_api_key": "dummy-key",
                        "openai_model": "policy",
                        "openai_default_headers": {},
                    }
                }
            },
        }
        if self.ray_address:
            cfg["ray_head_node_address"] = self.ray_address
        if self.has_relay:
            cfg[ENVIRONMENT] = {
                "environment_servers": {
                    "legacy_agent": {
                        "entrypoint": "app.py",
                        "host": h,
                        "port": self.ports[ENVIRONMENT],
                        "agent_server": {"type": "responses_api_agents", "name": AGENT},
                    }
                }
            }
        # extra_config: a key naming one of our servers merges into that server's
        # inner block (e.g. {"policy_model": {"num_workers": 2}}); anything else
        # merges at the top level (e.g. {"telemetry": {...}}).
        for key, value in self.extra_config.items():
            if key in cfg and key != "head_server" and isinstance(value, Mapping):
                inner = next(iter(next(iter(cfg[key].values())).values()))
                _deep_merge(inner, value)
            elif isinstance(value, Mapping) and isinstance(cfg.get(key), dict):
                _deep_merge(cfg[key], value)
            else:
                cfg[key] = copy.deepcopy(value)
        return cfg

    def _server_dirs(self, cfg: dict) -> list[tuple[str, str]]:
        out = []
        for name in self.server_names:
            ((typ, inner),) = cfg[name].items()
            ((impl, _),) = inner.items()
            out.append((typ, impl))
        return out

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.build_config()
        # JSON is valid YAML; no PyYAML needed on the test side.
        self.config_path.write_text(json.dumps(cfg, indent=1) + "\n")
        source = LOCAL_RESOURCES.get(self.resources)
        if source is not None:
            shutil.copytree(
                source,
                self.workdir / "resources_servers" / self.resources,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", ".venv"),
            )
        if self.build_venvs:
            return  # Gym creates <type>/<name>/.venv itself
        for name, (typ, impl) in zip(self.server_names, self._server_dirs(cfg)):
            target = self.server_venvs.get(name, self.venv)
            d = self.workdir / typ / impl
            d.mkdir(parents=True, exist_ok=True)
            link = d / ".venv"
            if link.is_symlink() or link.exists():
                if link.resolve() == target.resolve():
                    continue
                link.unlink()
            link.symlink_to(target, target_is_directory=True)

    def server_venv(self, name: str) -> pathlib.Path:
        """Where Gym finds (or builds) the venv of server ``name``: ``<workdir>/<type>/<impl>/.venv``."""
        ((typ, inner),) = self.build_config()[name].items()
        ((impl, _),) = inner.items()
        return self.workdir / typ / impl / ".venv"

    # ------------------------------------------------------------------ command line and environment

    def command(self) -> list[str]:
        cmd = [str(self.venv / "bin" / "gym"), "env", "start", f"+config_paths=[{self.config_path}]"]
        if self.build_venvs:
            cmd.append(f"+uv_cache_dir={self.uv_cache_dir}")
        else:
            cmd.append("+skip_venv_if_present=true")
        if self.instrument:
            cmd = [str(self.venv / "bin" / "opentelemetry-instrument")] + cmd
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The test process may itself run inside some venv: do not leak it.
        for k in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
            env.pop(k, None)
        # Nor the test process's own Gym/telemetry settings: each trio gets exactly
        # what its test passes in `env`.
        for k in [k for k in env if k.startswith(("NEMO_GYM_", "GYM_AUTOINSTR_", "OTEL_"))]:
            env.pop(k)
        path = [str(self.venv / "bin")]
        if self.build_venvs:
            # uv finds the interpreter Gym names (`uv venv --python 3.12.1`) on PATH, but
            # not inside a venv: put the Gym venv's base interpreter there too.
            path.append(self._base_interpreter_dir())
        env["PATH"] = os.pathsep.join(path + [env.get("PATH", "")])
        env["RAY_AUTH_MODE"] = "disabled"
        env["RAY_TMPDIR"] = self.ray_tmpdir or ""
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env["PYTHONUNBUFFERED"] = "1"
        env["WANDB_MODE"] = "disabled"
        env[_MARKER_ENV] = self.trio_id
        env.update(self.extra_env)
        return env

    def _base_interpreter_dir(self) -> str:
        for line in (self.venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                return value.strip()
        raise GymTrioError(f"no home in {self.venv / 'pyvenv.cfg'}")

    # ------------------------------------------------------------------ task rows

    def default_row(self) -> dict:
        if self.resources == "code_gen":
            return copy.deepcopy(CODE_GEN_ROW)
        if self.resources == "ray_scorer":
            return copy.deepcopy(RAY_SCORER_ROW)
        data = self.site_packages() / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
        with open(data) as fh:
            return json.loads(fh.readline())

    def site_packages(self) -> pathlib.Path:
        found = sorted(self.venv.glob("lib/python3*/site-packages"))
        if not found:
            raise GymTrioError(f"no site-packages in {self.venv}")
        return found[0]
