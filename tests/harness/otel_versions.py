"""The OpenTelemetry versions the project is tested on: the declared floor and the newest.

``pyproject.toml`` declares ``opentelemetry-api/sdk/exporters >=FLOOR.core,<2`` and the
contrib packages ``>=FLOOR.contrib,<1``; the floor is what Gym 0.7's ``telemetry`` extra
asks for (``opentelemetry-instrumentation-*>=0.60b0``, which pins ``opentelemetry-api``
1.39.0 through ``opentelemetry-semantic-conventions``).  ``otel_venv("floor")`` and
``otel_venv("newest")`` are venvs like the runner's (``tools/runner-venv``: Gym 0.4.0, the
project editable, the test tools) with every OpenTelemetry package pinned to one set,
built by ``gym_install.gym_venv`` (cached, locked, stamped: a new set is a new venv).

The newest set is resolved from the package index at test time (``pip index versions``),
remembered for a day in ``<cache>/otel-newest.json``; offline, the last resolved set is
used, else ``NEWEST_KNOWN`` (bump it when a release is verified; it is only a fallback).
Core and contrib release together: contrib ``0.(N+21)bK`` pins core ``1.N.*`` (0.60b0 ->
1.39.0), so the newest contrib minor picks the core minor; pip then installs each
package's newest release of its minor that agrees with the others (the packages publish
patch releases one by one and pin each other exactly).

Run as a script to pre-build: ``python -m tests.harness.otel_versions floor newest``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from . import gym_install

# The OpenTelemetry packages the project depends on (core, versioned 1.x) and those the
# test venvs add (contrib, versioned 0.xbK): each is pinned to its set's version.
CORE = (
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-proto",
)
CONTRIB = (
    "opentelemetry-instrumentation",
    "opentelemetry-instrumentation-aiohttp-client",
    "opentelemetry-distro",
)
# tools/runner-venv's extras (keep them in step): the runner venv, unpinned, is shared as
# the newest set's venv while it holds the newest minors.
RUNNER_EXTRAS = (
    "pytest",
    "pytest-xdist",
    "rotel",
    "opentelemetry-proto",
    "httpx",
    "opentelemetry-instrumentation-aiohttp-client",
    "opentelemetry-distro",
    "import-linter==2.17",
)
TEST_TOOLS = tuple(e for e in RUNNER_EXTRAS if not e.startswith("opentelemetry-"))

GYM_RELEASE = "0.4.0"  # the runner's Gym (Python 3.12)
CONTRIB_MINOR_OFFSET = 21  # contrib 0.(N+21) goes with core 1.N


@dataclass(frozen=True)
class OtelSet:
    """Core (``opentelemetry-sdk``'s) and contrib (``opentelemetry-instrumentation``'s)
    versions: exact releases, or (``exact=False``) minors such as "1.45" / "0.66", each
    package then at pip's newest consistent release of that minor (the packages publish
    patch releases one by one, and pin each other exactly: pip picks the set)."""

    core: str
    contrib: str
    exact: bool = True

    def requirements(self) -> list[str]:
        if self.exact:
            return [f"{n}=={self.core}" for n in CORE] + [f"{n}=={self.contrib}" for n in CONTRIB]
        core_next = f"1.{_minor(self.core) + 1}"
        contrib_next = f"0.{_minor(self.contrib) + 1}b0"
        return [f"{n}>={self.core}.0,<{core_next}" for n in CORE] + [
            f"{n}>={self.contrib}b0,<{contrib_next}" for n in CONTRIB
        ]

    def matches(self, package: str, installed: str) -> bool:
        """Whether ``installed`` (a version of ``package``, core or contrib) is of this set."""
        want = self.core if package in CORE else self.contrib
        return installed == want if self.exact else _minor(installed) == _minor(want)


FLOOR = OtelSet(core="1.39.0", contrib="0.60b0")
NEWEST_KNOWN = OtelSet(core="1.45", contrib="0.66", exact=False)  # a fallback only: see the docstring
RESOLVE_TTL = 24 * 3600


def _versions(package: str, pre: bool) -> list[str]:
    """Every release of ``package`` on the index, newest first (pip's order)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    if pre:
        cmd.append("--pre")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    mo = re.search(r"Available versions:\s*(.+)", out)
    if not mo:
        raise ValueError(f"no versions of {package} in: {out[-300:]!r}")
    return [v.strip() for v in mo.group(1).split(",") if v.strip()]


def _minor(version: str) -> int:
    return int(version.split(".")[1].split("b")[0])


def resolve_newest() -> OtelSet:
    """The newest contrib minor on the index and the core minor it goes with."""
    contrib_minor = _minor(_versions("opentelemetry-instrumentation", pre=True)[0])
    core_minor = contrib_minor - CONTRIB_MINOR_OFFSET
    if not any(v.startswith(f"1.{core_minor}.") for v in _versions("opentelemetry-sdk", pre=False)):
        raise ValueError(f"contrib 0.{contrib_minor} is out, opentelemetry-sdk 1.{core_minor} is not")
    return OtelSet(core=f"1.{core_minor}", contrib=f"0.{contrib_minor}", exact=False)


def newest() -> OtelSet:
    cache = gym_install.cache_root() / "otel-newest.json"
    remembered = None
    try:
        data = json.loads(cache.read_text())
        remembered = OtelSet(data["core"], data["contrib"], data["exact"])
        if time.time() - data["resolved_at"] < RESOLVE_TTL:
            return remembered
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        found = resolve_newest()
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        fallback = remembered or NEWEST_KNOWN
        gym_install._log(f"cannot resolve the newest OpenTelemetry ({exc}); using {fallback}")
        return fallback
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({**asdict(found), "resolved_at": time.time()}) + "\n")
    return found


def otel_set(name: str) -> OtelSet:
    return {"floor": lambda: FLOOR, "newest": newest}[name]()


def installed(venv) -> dict[str, str]:
    """The versions of the OpenTelemetry packages (``CORE`` and ``CONTRIB``) in ``venv``."""
    code = f"import importlib.metadata as m, json; print(json.dumps({{n: m.version(n) for n in {CORE + CONTRIB!r}}}))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def otel_venv(name: str):
    """A runner-like venv (Gym 0.4.0, the project, the test tools) on the ``name`` set: the
    runner venv itself when it is built and holds that set (it is unpinned: the newest
    when built), so CI builds one venv less."""
    pins = otel_set(name)
    runner = gym_install.built_gym_venv(GYM_RELEASE, extra=RUNNER_EXTRAS)
    if runner is not None and all(pins.matches(n, v) for n, v in installed(runner).items()):
        return runner
    return gym_install.gym_venv(GYM_RELEASE, extra=[*TEST_TOOLS, *pins.requirements()])


if __name__ == "__main__":
    for n in sys.argv[1:] or ["floor", "newest"]:
        print(n, otel_set(n), otel_venv(n))
