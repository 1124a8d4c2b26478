"""Build (once) and cache virtualenvs holding a real NeMo Gym release.

``gym_venv("0.7.0")`` returns a venv directory with ``nemo-gym==0.7.0`` and the
minimal third-party set needed to run ``gym env start`` with the example trio
(resources ``example_single_tool_call``, agent ``simple_agent``, model
``openai_model``), plus -- when ``with_project`` -- this repository installed
editable, so edits to ``gym_autoinstr/`` apply without a rebuild.

Venvs live under ``$GYM_AUTOINSTR_TEST_CACHE`` (default ``<repo>/.cache/gymenvs``).
A stamp file records what was installed; a changed ``pyproject.toml``, a changed
``extra`` list or a changed recipe in this file triggers a rebuild.  A lock file
keeps two pytest processes from building the same venv at once.

Interpreters: Python 3.12 for Gym < 0.5, 3.13 for Gym >= 0.5 (0.5+ declare
``>=3.13.14``; they run on 3.13.0: their wheel is installed as for 3.13.14, ``GYM_PYTHON_FLOOR``).
Found via ``$GYM_AUTOINSTR_PY312`` / ``$GYM_AUTOINSTR_PY313``, else
``$(pyenv root)/versions/3.1x.*/bin/python3``, else ``python3.1x`` on PATH (only
if it actually runs: pyenv shims for a non-global version exit 127).

Run as a script to pre-build: ``python -m tests.harness.gym_install 0.4.0 0.7.0 [--bare]``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Bump when the install recipe below changes in a way that needs a rebuild.
RECIPE_VERSION = 5

# Every venv is built by uv (what Gym itself builds its server venvs with): one resolve and
# parallel downloads, several times faster than pip.  uv itself is the one thing pip installs,
# into a venv of its own in the cache.  Its cache (``uv-cache``, shared with the server venvs
# GymTrio has Gym build) sits beside the venvs, on the same file system: installs hard-link.
UV_REQUIREMENT = "uv==0.13.9"
# Gym 0.5+ declare Python >=3.13.14; they run on 3.13.0 (what these machines have).
GYM_PYTHON_FLOOR = "3.13.14"

# Third-party packages the example trio actually needs at run time (found by
# trying: removing any of these breaks import of a server or the CLI).  Gym's own
# version specifiers for these names are taken from the installed METADATA, so
# e.g. 0.4.0 gets ``openai<=2.7.2`` and 0.7.0 ``openai==2.44.0``.  Extras are
# dropped (``ray[default]`` pulls in the dashboard stack, which the trio never uses).
MINIMAL_DEPS: tuple[str, ...] = (
    "fastapi",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "pydantic_core",
    "aiohttp",
    "omegaconf",
    "hydra-core",
    "openai",
    "anthropic",
    "requests",
    "orjson",
    "rich",
    "devtools",
    "psutil",
    "itsdangerous",
    "ray",
    "yappi",
    "pydot",
    "gprof2dot",
    "pandas",
    "scipy",
    "wandb",
    "tqdm",
    "mcp",
    "python-multipart",
    "packaging",
    "jinja2",
    # Gym's rollout collection (`ng_collect_rollouts`, `gym eval run`): its module imports
    # MLflow's client (mlflow-skinny has every module it imports; Gym asks for the whole
    # server too, which it never imports) and Hugging Face datasets.  The README's "tracing
    # your own Gym" runs it in the demo's venv (tests/test_realgym_readme.py).
    "mlflow-skinny",
    "datasets",
)

# Always installed (test-side tools used from inside the venv, cheap).
HARNESS_DEPS: tuple[str, ...] = ("psutil", "pyyaml")


def _log(msg: str) -> None:
    print(f"[gym_install] {msg}", file=sys.stderr, flush=True)


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def python_minor_for(version: str) -> str:
    """The Python minor version ("3.12"/"3.13") a Gym release is run on here."""
    return "3.12" if _vtuple(version) < (0, 5) else "3.13"


def _runs(python: str) -> bool:
    try:
        r = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def find_python(minor: str) -> str:
    """Locate a working interpreter for ``minor`` ("3.12" or "3.13")."""
    env_name = "GYM_AUTOINSTR_PY" + minor.replace(".", "")
    cand = os.environ.get(env_name)
    if cand:
        if not _runs(cand):
            raise RuntimeError(f"${env_name}={cand} does not run")
        return cand
    pyenv = shutil.which("pyenv")
    roots = []
    if os.environ.get("PYENV_ROOT"):
        roots.append(os.environ["PYENV_ROOT"])
    if pyenv:
        try:
            roots.append(
                subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
            )
        except (OSError, subprocess.SubprocessError):
            pass
    for root in roots:
        vdir = pathlib.Path(root) / "versions"
        if not vdir.is_dir():
            continue
        found = sorted(
            (p for p in vdir.iterdir() if re.fullmatch(re.escape(minor) + r"\.\d+", p.name)),
            key=lambda p: _vtuple(p.name),
            reverse=True,
        )
        for p in found:
            exe = p / "bin" / "python3"
            if exe.exists() and _runs(str(exe)):
                return str(exe)
    exe = shutil.which("python" + minor)
    if exe and _runs(exe):
        return exe
    raise RuntimeError(f"no working Python {minor}: set ${env_name} to its interpreter")


def cache_root() -> pathlib.Path:
    p = os.environ.get("GYM_AUTOINSTR_TEST_CACHE")
    return pathlib.Path(p) if p else REPO_ROOT / ".cache" / "gymenvs"


def _pyproject_hash() -> str:
    return hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _stamp_for(version: str, with_project: bool, extra: Sequence[str], python: str) -> dict:
    return {
        "recipe": RECIPE_VERSION,
        "nemo_gym": version,
        "with_project": with_project,
        "checkout": str(REPO_ROOT) if with_project else None,
        "pyproject_sha256": _pyproject_hash() if with_project else None,
        "extra": sorted(extra),
        "python": python,
        "deps": list(MINIMAL_DEPS),
    }


def _venv_name(version: str, with_project: bool, extra: Sequence[str]) -> str:
    name = f"gym-{version}-{'proj' if with_project else 'bare'}"
    if extra:
        name += "-" + hashlib.sha256("\n".join(sorted(extra)).encode()).hexdigest()[:8]
    if with_project and not cache_root().resolve().is_relative_to(REPO_ROOT):
        # A cache shared by several checkouts: the project is installed editable, so each
        # checkout needs venvs of its own (else servers would run another checkout's code).
        name += "-at-" + hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:6]
    return name


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        t0 = time.monotonic()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for lock {path.name} (another process is building)...")
            fcntl.flock(fh, fcntl.LOCK_EX)
            _log(f"got lock after {time.monotonic() - t0:.0f}s")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], **kw) -> None:
    _log("$ " + " ".join(cmd))
    t0 = time.monotonic()
    if pathlib.Path(cmd[0]).name == "uv" and "env" not in kw:
        kw["env"] = uv_environment()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-6000:])
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}")
    _log(f"  done in {time.monotonic() - t0:.1f}s")


def uv_cache() -> pathlib.Path:
    return cache_root() / "uv-cache"


def uv_binary() -> str:
    """The pinned uv, pip-installed once into ``<cache>/tool-uv`` (any Python will do)."""
    root = cache_root()
    venv = root / "tool-uv"
    exe = venv / "bin" / "uv"
    stamp = venv / "gym-autoinstr-stamp.json"
    if stamp.exists() and stamp.read_text() == UV_REQUIREMENT + "\n":
        return str(exe)
    with _file_lock(root / "tool-uv.lock"):
        if not (stamp.exists() and stamp.read_text() == UV_REQUIREMENT + "\n"):
            if venv.exists():
                shutil.rmtree(venv)
            _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "--python",
                    str(venv / "bin" / "python"),
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "-q",
                    UV_REQUIREMENT,
                ]
            )
            stamp.write_text(UV_REQUIREMENT + "\n")
    return str(exe)


def uv_environment() -> dict[str, str]:
    """The environment uv runs in: our cache, never a Python download, no user config."""
    env = dict(os.environ)
    env.update(UV_CACHE_DIR=str(uv_cache()), UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1")
    env.pop("VIRTUAL_ENV", None)
    return env


def uv_pip(vpy: str, *, python_version: str | None = None) -> list[str]:
    """``uv pip install`` into the venv of ``vpy`` (``python_version``: resolve as for that Python)."""
    cmd = [uv_binary(), "pip", "install", "--python", vpy]
    if python_version:
        cmd += ["--python-version", python_version]
    return cmd


def _new_venv(venv: pathlib.Path, python: str) -> str:
    """A fresh venv at ``venv`` on ``python``, with pip (seeded: tests and tools run ``-m pip``)."""
    if venv.exists():
        shutil.rmtree(venv)
    _run([uv_binary(), "venv", "--seed", "--quiet", "--python", python, str(venv)])
    return str(venv / "bin" / "python")


_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gym_requirements(python: str) -> dict[str, str]:
    """``{normalized name: specifier}`` of the installed nemo-gym's base requirements."""
    code = "import json, importlib.metadata as m;print(json.dumps(m.requires('nemo-gym') or []))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    reqs: dict[str, str] = {}
    for line in json.loads(out):
        spec, _, marker = line.partition(";")
        if "extra" in marker:
            continue
        mo = _REQ_NAME.match(spec)
        if not mo:
            continue
        reqs[_norm(mo.group(1))] = mo.group(3).strip().strip("()").replace(" ", "")
    return reqs


def _requirements_for(python: str, names: Iterable[str]) -> list[str]:
    gym = gym_requirements(python)
    out = []
    for n in names:
        spec = gym.get(_norm(n), "")
        out.append(n + spec)
    return out


def _build(venv: pathlib.Path, version: str, with_project: bool, extra: Sequence[str], python: str) -> None:
    t0 = time.monotonic()
    _log(f"building {venv.name} with {python}")
    # Built in place under its final name (a venv's scripts embed its path); the
    # stamp is written last, so an interrupted build is simply redone.
    vpy = _new_venv(venv, python)
    # 0.5+ declare Python >=3.13.14 and run here on 3.13.0: only Gym's own wheel is told so.
    _run(
        uv_pip(vpy, python_version=GYM_PYTHON_FLOOR if _vtuple(version) >= (0, 5) else None)
        + ["--no-deps", f"nemo-gym=={version}"]
    )
    reqs = _requirements_for(vpy, MINIMAL_DEPS)
    have = {_norm(n) for n in MINIMAL_DEPS}
    reqs += [d for d in HARNESS_DEPS if _norm(d) not in have]
    reqs += list(extra)
    # Ray and the project in ONE resolve: Ray pins opentelemetry ranges that the
    # project's exporters must agree with.
    if with_project:
        reqs += ["-e", str(REPO_ROOT)]
    _run(uv_pip(vpy) + reqs)
    # Fail early (and clearly) if the CLI cannot start.
    # (cwd: a scratch dir -- Gym's Hydra setup may write outputs/ into the cwd.)
    check = "import nemo_gym.cli.main, ray, fastapi, openai"
    if with_project:
        check += ", opentelemetry.sdk, gym_autoinstr"
    with tempfile.TemporaryDirectory() as scratch:
        _run([vpy, "-c", check], cwd=scratch)
    _log(f"built {venv.name} in {time.monotonic() - t0:.0f}s")


def gym_venv(version: str, *, with_project: bool = True, extra: Sequence[str] = ()) -> pathlib.Path:
    """Return a ready venv for ``nemo-gym==version`` (built once, then cached)."""
    extra = list(extra)
    python = find_python(python_minor_for(version))
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / _venv_name(version, with_project, extra)
    stamp_path = venv / "gym-autoinstr-stamp.json"
    want = _stamp_for(version, with_project, extra, python)

    def current() -> bool:
        try:
            return json.loads(stamp_path.read_text()) == want and (venv / "bin" / "gym").exists()
        except (OSError, ValueError):
            return False

    if current():
        return venv
    with _file_lock(root / (venv.name + ".lock")):
        if current():  # built by another process while we waited
            return venv
        _build(venv, version, with_project, extra, python)
        stamp_path.write_text(json.dumps(want, indent=1) + "\n")
    return venv


def built_gym_venv(version: str, *, with_project: bool = True, extra: Sequence[str] = ()) -> pathlib.Path | None:
    """The venv ``gym_venv`` would return, if it is built and current; else None (nothing is built)."""
    extra = list(extra)
    venv = cache_root() / _venv_name(version, with_project, extra)
    want = _stamp_for(version, with_project, extra, find_python(python_minor_for(version)))
    try:
        current = json.loads((venv / "gym-autoinstr-stamp.json").read_text()) == want
    except (OSError, ValueError):
        return None
    return venv if current and (venv / "bin" / "gym").exists() else None


def tool_venv(name: str, requirements: Sequence[str], *, python_minor: str = "3.12", check: str = "") -> pathlib.Path:
    """A cached venv holding ``requirements`` alone (no Gym, no project): a backend such
    as MLflow runs from one, as its own process, as a user would install it.  Same cache,
    stamp and lock as ``gym_venv``; rebuilt when the requirements change.  ``check`` is
    Python run in the venv after the install (fail early on a broken build)."""
    python = find_python(python_minor)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"tool-{name}"
    stamp_path = venv / "gym-autoinstr-stamp.json"
    want = {"recipe": RECIPE_VERSION, "tool": name, "requirements": list(requirements), "python": python}

    def current() -> bool:
        try:
            return json.loads(stamp_path.read_text()) == want
        except (OSError, ValueError):
            return False

    if current():
        return venv
    with _file_lock(root / (venv.name + ".lock")):
        if current():
            return venv
        t0 = time.monotonic()
        vpy = _new_venv(venv, python)
        _run(uv_pip(vpy) + list(requirements))
        if check:
            with tempfile.TemporaryDirectory() as scratch:
                _run([vpy, "-c", check], cwd=scratch)
        _log(f"built {venv.name} in {time.monotonic() - t0:.0f}s")
        stamp_path.write_text(json.dumps(want, indent=1) + "\n")
    return venv


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--bare", action="store_true", help="without this project")
    ap.add_argument("--extra", action="append", default=[])
    a = ap.parse_args(argv)
    for v in a.versions:
        print(gym_venv(v, with_project=not a.bare, extra=a.extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
