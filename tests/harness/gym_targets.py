"""Many nemo-gym releases for the price of two venvs.

Importing Gym (not running a fleet) needs its third-party deps once per Python; the Gym
package itself is small.  So each release is installed alone with ``uv pip install
--no-deps --target <dir>`` and put first on ``PYTHONPATH`` of a host venv from
``gym_install`` (0.4.0's on Python 3.12 for Gym < 0.5, 0.7.0's on 3.13 for 0.5+), where
it shadows the host's own nemo-gym, package and metadata alike.

Gym 0.2/0.3's CLI module imports at load time what 0.4.0's loads lazily (mlflow,
datasets); those are installed once into a support directory that is appended to
``sys.path`` (after the host's site-packages, so it never shadows the host's copies).

Everything is cached under ``gym_install.cache_root()/gym-targets/``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from . import gym_install

HOST_RELEASE = {"3.12": "0.4.0", "3.13": "0.7.0"}

# Imported at load time by some releases' modules, missing from the host venvs.
SUPPORT_DEPS = {"3.12": ("mlflow-skinny", "datasets")}

# Settings a test process may carry that would change what a Gym process does.
INHERITED_PREFIXES = ("OTEL_", "GYM_AUTOINSTR_", "NEMO_GYM_", "NEMO_LENS_")


def host_venv(version: str) -> pathlib.Path:
    """The venv (with this project) whose Python and third-party deps run ``version``."""
    return gym_install.gym_venv(HOST_RELEASE[gym_install.python_minor_for(version)], with_project=True)


def gym_target(version: str) -> pathlib.Path:
    """A directory holding only ``nemo-gym==version`` (installed once, then cached)."""
    root = gym_install.cache_root() / "gym-targets"
    target = root / version
    stamp = target / ".gym-autoinstr-complete"
    if stamp.exists():
        return target
    python = str(host_venv(version) / "bin" / "python")
    with gym_install._file_lock(root / f"{version}.lock"):
        if stamp.exists():
            return target
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
        minor = gym_install.python_minor_for(version)
        floor = gym_install.GYM_PYTHON_FLOOR if minor != "3.12" else None
        command = gym_install.uv_pip(python, python_version=floor) + [
            "--no-deps",
            "--target",
            str(target),
            f"nemo-gym=={version}",
        ]
        gym_install._run(command)
        stamp.write_text(version + "\n")
    return target


def support_directory(version: str) -> pathlib.Path | None:
    """Extra third-party packages the release's Python needs (installed once), or None."""
    minor = gym_install.python_minor_for(version)
    if not SUPPORT_DEPS.get(minor):
        return None
    root = gym_install.cache_root() / "gym-targets"
    target = root / f"support-{minor}"
    stamp = target / ".gym-autoinstr-complete"
    want = " ".join(SUPPORT_DEPS[minor]) + "\n"
    if stamp.exists() and stamp.read_text() == want:
        return target
    python = str(host_venv(version) / "bin" / "python")
    with gym_install._file_lock(root / f"support-{minor}.lock"):
        if stamp.exists() and stamp.read_text() == want:
            return target
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
        gym_install._run(gym_install.uv_pip(python) + ["--target", str(target), *SUPPORT_DEPS[minor]])
        stamp.write_text(want)
    return target


def clean_environment(**overrides: str) -> dict[str, str]:
    """The test process's environment without Gym/OpenTelemetry settings (nor pytest-xdist's
    worker identity: a child is no worker), plus ``overrides``."""
    dropped = (*INHERITED_PREFIXES, "PYTEST_XDIST_")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(dropped) and k != "PYTHONPATH"}
    environ.update(overrides)
    return environ


def run_doctor(
    version: str, *, cwd: str, pythonpath: list[str] = (), env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    """``gym-autoinstr doctor --json`` on the host venv's Python, with ``nemo-gym==version``
    (then ``pythonpath``) first on the path and the support directory last."""
    python = str(host_venv(version) / "bin" / "python")
    environ = clean_environment() if env is None else dict(env)
    environ["PYTHONPATH"] = os.pathsep.join([str(gym_target(version)), *pythonpath])
    support = support_directory(version)
    code = "import site, sys\n"
    if support is not None:
        code += f"site.addsitedir({str(support)!r})\n"
    code += "from gym_autoinstr.commands.cli import main\nsys.exit(main(['doctor', '--json']))\n"
    return subprocess.run([python, "-c", code], cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    for release in sys.argv[1:]:
        print(gym_target(release))
