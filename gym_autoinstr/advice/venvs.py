"""Server venvs: every venv Gym builds gets gym-autoinstr, pinned to what the orchestrator runs.

Why this module exists: ``opentelemetry-instrument`` hands its ``sitecustomize`` to every
child through ``PYTHONPATH``, but each child imports OpenTelemetry from *its own* venv,
and ``gym env start`` builds one uv venv per server.  A server venv without our packages
prints "Error in sitecustomize" and runs untraced: a trace with a hole in the middle.

Gym already has the seam for this: ``GlobalConfigDictParser.parse`` rebuilds the
``head_server_deps`` list on every call (users cannot set it), and ``setup_env_command``
appends that list, joined by spaces, to the ``uv pip install`` that builds each server
venv.  So, in the orchestrator only:

* after ``parse`` returns, our requirements are appended to ``head_server_deps``
  (idempotently), each one pinned to the distribution installed *here*, read from its
  metadata and PEP 610 ``direct_url.json``, so no server resolves a different version
  from an index: ``name==X`` (an index install), ``name @ file:///...`` (a local wheel or
  directory), ``-e <path>`` (editable), ``name @ git+<url>@<commit>`` (VCS).  Gym joins
  the list unquoted and bash runs it, so each argument is ``shlex``-quoted.
* after ``setup_env_command`` returns a command that reuses an existing venv
  (``skip_venv_if_present``), that venv is checked for our packages; if they are missing
  or differ, one message names the server, the venv and the command that fixes it.

Servers on other hosts: Gym builds a server's venv on the host the server runs on (a
multi-node Ray cluster, e.g. NeMo RL's).  An index or git install pins a requirement
installable anywhere; a local wheel, directory or editable checkout is a path on *this*
machine, which is fine while every server runs here (and while it exists: a path that is
gone is never handed on, see ``server_requirements``).  Then the orchestrator notes it once
(INFO, as ``gym-autoinstr doctor`` rates it: nothing to fix on one host), and
``GYM_AUTOINSTR_SERVER_REQUIREMENT`` names the requirement to install instead (a path every
host shares, a wheel URL, a git URL).

What is pinned: the part of gym-autoinstr's dependency closure that carries a span from
the SDK to the wire.  OpenTelemetry's own packages pin each other exactly (sdk -> api,
exporters -> proto), ``wrapt`` applies our patches, ``protobuf`` and
``googleapis-common-protos`` run generated code that is checked against the protobuf
runtime, ``grpcio`` and ``requests`` are the two exporters' transports.  Left to the
server's own resolver: general-purpose libraries every server stack depends on anyway
(``typing-extensions``, ``packaging``, ``importlib-metadata``, ``urllib3``, ``idna``,
``certifi``, ...), where a pin would only add conflicts with a server's requirements.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from gym_autoinstr import settings
from gym_autoinstr._log import note_once, warn_once

PROJECT = "gym-autoinstr"
# Beyond opentelemetry-*: the closure members on the span's way to the wire (see above).
WIRE_PATH = frozenset({PROJECT, "wrapt", "protobuf", "googleapis-common-protos", "grpcio", "requests"})
HEAD_SERVER_DEPS_KEY = "head_server_deps"
# The requirement server venvs install gym-autoinstr from, instead of this machine's.
SERVER_REQUIREMENT_VARIABLE = settings.SERVER_REQUIREMENT.name


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_pinned(name: str) -> bool:
    name = canonical_name(name)
    return name in WIRE_PATH or name.startswith("opentelemetry-")


@dataclass(frozen=True)
class PinnedRequirement:
    name: str  # canonical distribution name
    version: str
    arguments: tuple[str, ...]  # what `uv pip install` gets, before shell quoting
    kind: str  # "index" | "archive" | "directory" | "editable" | "vcs"

    def shell(self) -> str:
        """The requirement as shell words that survive Gym's unquoted ``" ".join``."""
        return " ".join(shlex.quote(argument) for argument in self.arguments)

    @property
    def local_path(self) -> str | None:
        """The path on this machine it is installed from (a local wheel, directory or
        editable checkout), which another host cannot install; None otherwise."""
        if self.kind == "editable":
            return self.arguments[-1]
        if self.kind in ("archive", "directory"):
            url = self.arguments[0].partition(" @ ")[2]
            if url.startswith("file:"):
                return _file_path(url)
        return None

    @property
    def gone(self) -> bool:
        """Installed from a path on this machine that no longer exists (a wheel deleted
        after the install, as a Dockerfile's clean-up does): no venv can install it."""
        path = self.local_path
        return path is not None and not os.path.exists(path)

    def from_index(self) -> PinnedRequirement:
        """The same version, from the package index."""
        return PinnedRequirement(self.name, self.version, (f"{self.name}=={self.version}",), "index")


def _file_path(url: str) -> str:
    return urllib.request.url2pathname(urllib.parse.urlparse(url).path)


def pinned_requirement(distribution: metadata.Distribution) -> PinnedRequirement:
    """Reinstalls exactly ``distribution``: its recorded install source, else its version."""
    name = canonical_name(distribution.metadata["Name"])
    version = distribution.version
    direct_url = None
    try:
        raw = distribution.read_text("direct_url.json")
        direct_url = json.loads(raw) if raw else None
    except (OSError, ValueError):
        direct_url = None
    if not isinstance(direct_url, dict) or not direct_url.get("url"):
        return PinnedRequirement(name, version, (f"{name}=={version}",), "index")
    url = direct_url["url"]
    subdirectory = direct_url.get("subdirectory")
    fragment = f"#subdirectory={subdirectory}" if subdirectory else ""
    vcs_info = direct_url.get("vcs_info")
    if isinstance(vcs_info, dict):
        revision = vcs_info.get("commit_id") or vcs_info.get("requested_revision")
        at = f"@{revision}" if revision else ""
        return PinnedRequirement(name, version, (f"{name} @ {vcs_info.get('vcs', 'git')}+{url}{at}{fragment}",), "vcs")
    dir_info = direct_url.get("dir_info")
    if isinstance(dir_info, dict):
        if dir_info.get("editable") and url.startswith("file:"):
            path = _file_path(url)
            return PinnedRequirement(
                name, version, ("-e", os.path.join(path, subdirectory) if subdirectory else path), "editable"
            )
        return PinnedRequirement(name, version, (f"{name} @ {url}{fragment}",), "directory")
    return PinnedRequirement(name, version, (f"{name} @ {url}{fragment}",), "archive")


def _dependency_closure(root: str, path: list[str] | None = None) -> dict[str, metadata.Distribution]:
    """Every installed distribution ``root`` needs here (markers evaluated, extras followed)."""
    from packaging.requirements import InvalidRequirement, Requirement

    def find(name: str) -> metadata.Distribution | None:
        # What an installer installed (it writes INSTALLER) wins over metadata that merely
        # lies on sys.path, such as the .egg-info a source checkout holds after an
        # editable build, found first when the checkout is the working directory.
        candidates = list(metadata.distributions(name=name, **({} if path is None else {"path": path})))
        installed = [d for d in candidates if d.read_text("INSTALLER") is not None]
        return (installed or candidates or [None])[0]

    found: dict[str, metadata.Distribution] = {}
    followed: set[tuple[str, str]] = set()
    pending: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while pending:
        name, extras = pending.pop()
        key = canonical_name(name)
        wanted = {(key, extra) for extra in extras | {""}}
        if wanted <= followed:
            continue
        distribution = found.get(key) or find(name)
        if distribution is None:
            continue
        found[key] = distribution
        for extra in sorted(extras | {""}):
            if (key, extra) in followed:
                continue
            followed.add((key, extra))
            for raw in distribution.requires or ():
                try:
                    requirement = Requirement(raw)
                except InvalidRequirement:
                    continue
                if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
                    continue
                pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def pinned_requirements(root: str = PROJECT, path: list[str] | None = None) -> list[PinnedRequirement]:
    """``root`` and the wire-path part of its dependency closure, as installed here; sorted."""
    closure = _dependency_closure(root, path)
    return [pinned_requirement(d) for key, d in sorted(closure.items()) if is_pinned(key)]


def _override(environ: Any = None) -> tuple[tuple[str, ...] | None, tuple[str, str] | None]:
    """(install arguments, None) for ``GYM_AUTOINSTR_SERVER_REQUIREMENT``; (None, (problem,
    fix)) when it is not one requirement; (None, None) when unset."""
    raw = (settings.SERVER_REQUIREMENT.raw(environ) or "").strip()
    if not raw:
        return None, None
    # One requirement, as pip and uv take it ("name @ url" stays one argument), or -e PATH.
    if raw.startswith("-e ") or raw.startswith("-e\t"):
        words: tuple[str, ...] = ("-e", raw[3:].strip())
    elif raw.startswith("-"):
        words = ()
    else:
        words = (raw,)
    if not words or not words[-1]:
        return None, (
            f"{SERVER_REQUIREMENT_VARIABLE}={raw!r} is not one requirement: server venvs get this machine's "
            "gym-autoinstr instead",
            "set one requirement, e.g. '-e /shared/path', 'gym-autoinstr @ https://host/x.whl' or "
            "'gym-autoinstr @ git+<repository URL>@<commit>'",
        )
    return words, None


def requirement_override(environ: Any = None) -> tuple[str, ...] | None:
    """``GYM_AUTOINSTR_SERVER_REQUIREMENT`` as install arguments; None when unset or bad
    (bad: with one warning, ``requirement_problem``)."""
    words, problem = _override(environ)
    if problem:
        warn_once("venvs:override", "%s. Fix: %s.", *problem)
    return words


def requirement_problem(environ: Any = None) -> tuple[str, str] | None:
    """(problem, fix) when ``GYM_AUTOINSTR_SERVER_REQUIREMENT`` is set but not used; logs nothing."""
    return _override(environ)[1]


@functools.lru_cache(maxsize=1)
def server_requirements() -> tuple[str, ...]:
    """What every server venv must install, as shell-quoted ``head_server_deps`` entries.

    A requirement whose local file is gone (``gone_requirements``) is never handed on: uv
    would fail the server venv's whole install, and Gym with it.  Ours is left out then (it
    is on no package index: those servers run untraced, said once); any other is installed
    at the same version from the index."""
    override = requirement_override()
    entries = []
    for requirement in pinned_requirements():
        if override and requirement.name == PROJECT:
            entries.append(" ".join(shlex.quote(word) for word in override))
        elif not requirement.gone:
            entries.append(requirement.shell())
        elif requirement.name != PROJECT:
            entries.append(requirement.from_index().shell())
    return tuple(entries)


def _overridden(requirement: PinnedRequirement) -> bool:
    return requirement.name == PROJECT and requirement_override() is not None


def local_requirements() -> list[PinnedRequirement]:
    """The pinned requirements installed from a path on this machine that is still there (not overridden)."""
    return [r for r in pinned_requirements() if r.local_path and not r.gone and not _overridden(r)]


def gone_requirements() -> list[PinnedRequirement]:
    """The pinned requirements installed from a path on this machine that no longer exists (not overridden)."""
    return [r for r in pinned_requirements() if r.gone and not _overridden(r)]


def gone_message(gone: list[PinnedRequirement]) -> str:
    names = ", ".join(f"{r.name} ({r.local_path})" for r in gone)
    instead = [
        "server venvs are built without gym-autoinstr, so the servers Gym starts in them run untraced"
        if r.name == PROJECT
        else f"{r.name} {r.version} is installed from the package index instead"
        for r in gone
    ]
    return (
        f"server venvs cannot install {names}: this environment was installed from that path, which no longer "
        f"exists (deleted after the install?). Gym runs as usual; {'; '.join(dict.fromkeys(instead))}"
    )


def gone_fix() -> str:
    return (
        "keep the file where it was installed from (a Dockerfile that installs a wheel must not delete it: "
        "docs/slurm.md#the-driver-image), reinstall from a path that stays, or set "
        f"{SERVER_REQUIREMENT_VARIABLE} to a requirement server venvs can install, e.g. "
        "'gym-autoinstr @ file:///opt/wheels/gym_autoinstr-<version>-py3-none-any.whl' or "
        "'gym-autoinstr @ https://host/gym_autoinstr-<version>-py3-none-any.whl'"
    )


def local_path_message(local: list[PinnedRequirement]) -> str:
    names = ", ".join(f"{r.name} ({r.local_path})" for r in local)
    return (
        f"server venvs install {names} from a path on this machine: a server venv Gym builds on another host "
        f"(a multi-node Ray cluster) cannot install it, and that server runs untraced"
    )


def local_path_fix() -> str:
    # gym-autoinstr is on no package index: the fixes are a shared path, a wheel URL or git.
    return (
        f"nothing while every server runs on this host; for servers on other hosts, set "
        f"{SERVER_REQUIREMENT_VARIABLE} to a requirement every host can install, e.g. "
        f"'-e /path/shared/by/every/host', 'gym-autoinstr @ https://host/gym_autoinstr-<version>-py3-none-any.whl' "
        f"or 'gym-autoinstr @ git+<repository URL>@<commit>'"
    )


# -- head_server_deps ----------------------------------------------------------------------


def _requirement_name(entry: str) -> str | None:
    found = re.match(r"\s*'?\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(entry))
    return canonical_name(found.group(1)) if found and not str(entry).lstrip("'").startswith("-") else None


def with_server_requirements(deps: Iterable[str], ours: Iterable[str]) -> list[str]:
    """``deps`` plus each of ``ours`` not already named there (Gym's own entries win)."""
    result = [str(d) for d in deps]
    names = {_requirement_name(d) for d in result} - {None}
    for entry in ours:
        name = _requirement_name(entry)
        if entry in result or (name is not None and name in names):
            continue
        result.append(entry)
    return result


def _is_orchestrator() -> bool:
    from gym_autoinstr.setup.configurator import STATE
    from gym_autoinstr.setup.identity import Role, detect

    # A Ray worker running Gym's orchestration (ray_actor) is the orchestrator by what it
    # does, not by its command line.
    if STATE.identity is not None and STATE.identity.role is Role.ORCHESTRATOR:
        return True
    return detect().role is Role.ORCHESTRATOR


def head_server_deps_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``GlobalConfigDictParser.parse``: our pinned requirements join ``head_server_deps``."""
    config = wrapped(*args, **kwargs)
    try:
        if _is_orchestrator() and config is not None and HEAD_SERVER_DEPS_KEY in config:
            ours = server_requirements()
            deps = with_server_requirements(config[HEAD_SERVER_DEPS_KEY] or (), ours)
            _store(config, deps)
            gone = gone_requirements()
            if gone:
                warn_once("venvs:gone", "%s. Fix: %s.", gone_message(gone), gone_fix())
            local = local_requirements()
            if local:
                # a note, not a warning: on one host (most runs) there is nothing to fix
                note_once("venvs:local-path", "%s. Fix: %s.", local_path_message(local), local_path_fix())
    except Exception as error:  # never raise into Gym: its venvs are built as before
        warn_once(
            "venvs:head_server_deps",
            "could not add gym-autoinstr to the server venvs' requirements (%r): servers in venvs "
            "without it run untraced.",
            error,
        )
    return config


def _store(config: Any, deps: list[str]) -> None:
    try:
        from omegaconf import DictConfig, open_dict
    except ImportError:
        DictConfig = None  # type: ignore[assignment]
    if DictConfig is not None and isinstance(config, DictConfig):
        with open_dict(config):
            config[HEAD_SERVER_DEPS_KEY] = deps
    else:
        config[HEAD_SERVER_DEPS_KEY] = deps


# -- venvs Gym reuses without installing ---------------------------------------------------


def _reused_venv(command: str) -> Path | None:
    """The venv a ``setup_env_command`` result activates without installing anything, if any."""
    if "uv pip install" in command or "uv venv" in command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for before, word in zip(words, words[1:]):
        if before in ("source", ".") and word.endswith("/bin/activate"):
            return Path(word[: -len("/bin/activate")])
    return None


def _site_packages(venv: Path) -> list[str]:
    return [str(p) for p in sorted(venv.glob("lib/python*/site-packages"))]


def missing_in(venv: Path, wanted: Iterable[PinnedRequirement] | None = None) -> list[str]:
    """What ``venv`` lacks of ``wanted`` (missing, or another version), read from metadata only."""
    wanted = list(pinned_requirements() if wanted is None else wanted)
    installed: dict[str, str] = {}
    for distribution in metadata.distributions(path=_site_packages(venv)):
        try:
            installed.setdefault(canonical_name(distribution.metadata["Name"]), distribution.version)
        except Exception:
            continue
    problems = []
    for requirement in wanted:
        have = installed.get(requirement.name)
        if have is None:
            problems.append(requirement.name)
        elif have != requirement.version:
            problems.append(f"{requirement.name} {have} (orchestrator: {requirement.version})")
    return problems


def fix_command(venv: Path) -> str:
    requirements = " ".join(server_requirements())
    return f"uv pip install --python {shlex.quote(str(venv / 'bin' / 'python'))} {requirements}"


def setup_env_command_advice(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """After ``setup_env_command``: a reused venv without our packages is named, with its fix."""
    command = wrapped(*args, **kwargs)
    try:
        venv = _reused_venv(command) if isinstance(command, str) and _is_orchestrator() else None
        if venv is not None:
            problems = missing_in(venv)
            if problems:
                server = args[2] if len(args) > 2 else kwargs.get("prefix", "?")
                warn_once(
                    f"venvs:stale:{venv}",
                    "server %r reuses the venv %s (skip_venv_if_present), which lacks %s: this server "
                    "runs untraced (Python prints 'Error in sitecustomize' there); the rest of the "
                    "fleet is traced. Fix: %s",
                    server,
                    venv,
                    ", ".join(problems),
                    fix_command(venv),
                )
    except Exception as error:
        warn_once("venvs:stale-check", "could not check a reused server venv (%r).", error)
    return command
