"""Server venvs get our packages pinned to the orchestrator's: requirement derivation (fast).

Every install kind is a real distribution installed by pip into a scratch venv: a wheel
file, a directory, an editable (tiny projects with an in-tree PEP 517/660 backend, so no
index is needed), plus a hand-written ``direct_url.json`` with ``vcs_info`` and a real
index-installed package.  Shell safety is checked by letting bash split Gym's unquoted
join.  The real ``gym env start`` paths are in ``test_realgym_venvs.py``.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shlex
import subprocess
import sys
import sysconfig
import textwrap
import urllib.parse
from importlib import metadata

import pytest

from gym_autoinstr.advice import venvs

# A complete PEP 517 + PEP 660 backend: enough for pip to install a directory, an
# editable and a wheel without touching an index.
BACKEND = textwrap.dedent("""
    import base64, hashlib, json, os, zipfile

    def _project():
        with open("tiny.json") as fh:
            return json.load(fh)

    def _wheel(directory, files):
        project = _project()
        name, version = project["name"], project["version"]
        module = name.replace("-", "_")
        dist_info = f"{module}-{version}.dist-info"
        files = dict(files)
        files[f"{dist_info}/METADATA"] = (
            f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
            + "".join(f"Requires-Dist: {r}\\n" for r in project.get("requires", []))
        )
        files[f"{dist_info}/WHEEL"] = (
            "Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
        )
        record = []
        for path, text in files.items():
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(text.encode())}")
        record.append(f"{dist_info}/RECORD,,")
        files[f"{dist_info}/RECORD"] = "\\n".join(record) + "\\n"
        filename = f"{module}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(os.path.join(directory, filename), "w") as wheel:
            for path, text in files.items():
                wheel.writestr(path, text)
        return filename

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        module = _project()["name"].replace("-", "_")
        return _wheel(wheel_directory, {f"{module}/__init__.py": "KIND = 'built'\\n"})

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        module = _project()["name"].replace("-", "_")
        return _wheel(wheel_directory, {f"_{module}_editable.pth": os.path.abspath("src") + "\\n"})

    def build_sdist(sdist_directory, config_settings=None):
        raise NotImplementedError
""")


def _tiny_project(directory: pathlib.Path, name: str, version: str, requires=()) -> pathlib.Path:
    directory.mkdir(parents=True)
    (directory / "tiny_backend.py").write_text(BACKEND)
    (directory / "tiny.json").write_text(json.dumps({"name": name, "version": version, "requires": list(requires)}))
    (directory / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "tiny_backend"\nbackend-path = ["."]\n'
    )
    module = name.replace("-", "_")
    (directory / "src" / module).mkdir(parents=True)
    (directory / "src" / module / "__init__.py").write_text("KIND = 'editable'\n")
    return directory


def _build_wheel(project: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    code = "import sys, tiny_backend; print(tiny_backend.build_wheel(sys.argv[1]))"
    name = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=project, capture_output=True, text=True, check=True
    ).stdout.strip()
    return out / name


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A scratch venv with a wheel file, a directory and an editable installed by pip.

    Paths carry a space and shell metacharacters, as users' paths sometimes do."""
    root = tmp_path_factory.mktemp("venvs") / "a dir with $(echo meta) & 'quotes'"
    root.mkdir()
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheel = _build_wheel(_tiny_project(root / "wheelproj", "tiny-wheel", "1.0"), root / "dist")
    directory = _tiny_project(root / "dirproj", "tiny-dir", "2.0")
    editable = _tiny_project(root / "editproj", "tiny-edit", "3.0")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + [str(wheel), str(directory), "-e", str(editable)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    return {"venv": venv, "site": site, "wheel": wheel, "directory": directory, "editable": editable}


def _distribution(site: pathlib.Path, name: str) -> metadata.Distribution:
    return next(iter(metadata.distributions(name=name, path=[str(site)])))


def _bash_words(joined: str) -> list[str]:
    """What bash hands ``uv pip install`` for Gym's unquoted join."""
    out = subprocess.run(["bash", "-c", f'printf "%s\\n" {joined}'], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_an_index_install_is_pinned_to_its_version():
    distribution = metadata.distribution("wrapt")  # installed from PyPI in this venv
    requirement = venvs.pinned_requirement(distribution)
    assert requirement.kind == "index"
    assert requirement.arguments == (f"wrapt=={distribution.version}",)
    assert requirement.shell() == f"wrapt=={distribution.version}"


@pytest.mark.parametrize(
    "distribution, kind, path",
    [("tiny-wheel", "archive", "wheel"), ("tiny-dir", "directory", "directory")],
    ids=["a wheel from a local file", "a directory"],
)
def test_a_local_install_is_pinned_to_its_file_or_directory(installed, distribution, kind, path):
    requirement = venvs.pinned_requirement(_distribution(installed["site"], distribution))
    assert requirement.kind == kind
    (argument,) = requirement.arguments
    name, _, url = argument.partition(" @ ")
    assert name == distribution and url.startswith("file://")
    assert pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)) == installed[path]


def test_an_editable_install_stays_editable_from_the_same_path(installed):
    requirement = venvs.pinned_requirement(_distribution(installed["site"], "tiny-edit"))
    assert requirement.kind == "editable"
    assert requirement.arguments == ("-e", str(installed["editable"]))


def test_a_vcs_install_is_pinned_to_its_commit(tmp_path):
    site = tmp_path / "site"
    dist_info = site / "tiny_vcs-0.3.0+g1234.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-vcs\nVersion: 0.3.0+g1234\n")
    commit = "0123456789abcdef0123456789abcdef01234567"
    (dist_info / "direct_url.json").write_text(
        json.dumps(
            {
                "url": "https://github.com/example/tiny-vcs.git",
                "vcs_info": {"vcs": "git", "requested_revision": "main", "commit_id": commit},
                "subdirectory": "python",
            }
        )
    )
    requirement = venvs.pinned_requirement(_distribution(site, "tiny-vcs"))
    assert requirement.kind == "vcs"
    assert requirement.arguments == (
        f"tiny-vcs @ git+https://github.com/example/tiny-vcs.git@{commit}#subdirectory=python",
    )


def test_every_kind_survives_gyms_unquoted_shell_join(installed):
    requirements = [
        venvs.pinned_requirement(_distribution(installed["site"], name))
        for name in ("tiny-wheel", "tiny-dir", "tiny-edit")
    ] + [venvs.pinned_requirement(metadata.distribution("wrapt"))]
    # What Gym does: f"... {' '.join(head_server_deps)}", run by bash.
    gym_deps = ["ray[default]==2.55.1", "openai==2.7.2"]
    joined = " ".join(venvs.with_server_requirements(gym_deps, [r.shell() for r in requirements]))
    expected = gym_deps + [argument for r in requirements for argument in r.arguments]
    assert _bash_words(joined) == expected
    assert any("$(echo meta)" in word for word in _bash_words(joined))  # never expanded


def test_the_closure_follows_markers_and_extras_and_pins_only_the_wire_path(tmp_path):
    site = tmp_path / "site"

    def dist(name, version, *requires):
        directory = site / f"{name.replace('-', '_')}-{version}.dist-info"
        directory.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires]
        (directory / "METADATA").write_text("\n".join(lines) + "\n")

    dist(
        "gym-autoinstr",
        "9.0",
        "opentelemetry-sdk>=1",
        "helper[wire]",
        "opentelemetry-never; python_version < '3'",
        "typing-extensions",
    )
    dist("opentelemetry-sdk", "1.5", "opentelemetry-api==1.5", "typing-extensions")
    dist("opentelemetry-api", "1.5")
    dist("opentelemetry-never", "1.0")
    dist("helper", "1.0", "protobuf<9; extra == 'wire'", "grpcio; extra == 'other'")
    dist("protobuf", "6.1")
    dist("grpcio", "1.7")
    dist("typing-extensions", "4.0")
    pinned = venvs.pinned_requirements(path=[str(site)])
    assert [r.shell() for r in pinned] == [
        "gym-autoinstr==9.0",
        "opentelemetry-api==1.5",
        "opentelemetry-sdk==1.5",
        "protobuf==6.1",
    ]


def test_this_venv_pins_our_opentelemetry_stack_at_the_installed_versions():
    pinned = {r.name: r for r in venvs.pinned_requirements()}
    for name in (
        "gym-autoinstr",
        "wrapt",
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-instrumentation",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-exporter-otlp-proto-grpc",
        "opentelemetry-proto",
        "protobuf",
        "grpcio",
        "requests",
        "googleapis-common-protos",
    ):
        assert name in pinned, name
        assert pinned[name].version == metadata.version(name)
    assert not {"typing-extensions", "urllib3", "packaging", "certifi"} & set(pinned)
    # the project runs editable here (tests/harness/gym_install.py): it must stay so
    assert pinned["gym-autoinstr"].kind == "editable"


# -- the two advices, on Gym's real functions ---------------------------------------------


@pytest.fixture
def orchestrator(monkeypatch):
    monkeypatch.setattr(venvs, "_is_orchestrator", lambda: True)


@pytest.fixture
def said(monkeypatch):
    from gym_autoinstr import _log

    _log.forget_said()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("gym_autoinstr").addHandler(handler)
    yield records
    logging.getLogger("gym_autoinstr").removeHandler(handler)
    _log.forget_said()


def _parsed(tmp_path) -> object:
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from omegaconf import OmegaConf

    parser = GlobalConfigDictParser()
    config = GlobalConfigDictParserConfig(
        initial_global_config_dict=OmegaConf.create({"head_server": {"host": "127.0.0.1", "port": 11000}}),
        skip_load_from_cli=True,
        skip_load_from_dotenv=True,
    )
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return venvs.head_server_deps_advice(parser.parse, parser, (config,), {})
    finally:
        os.chdir(cwd)


def test_gyms_head_server_deps_gain_our_requirements_once(tmp_path, orchestrator):
    parsed = _parsed(tmp_path)
    deps = list(parsed["head_server_deps"])
    assert deps[0].startswith("ray[default]==") and deps[1].startswith("openai==")
    assert deps[2:] == list(venvs.server_requirements())
    again = venvs.head_server_deps_advice(lambda: parsed, None, (), {})
    assert list(again["head_server_deps"]) == deps  # idempotent


def test_head_server_deps_are_untouched_outside_the_orchestrator(tmp_path):
    # pytest is no orchestrator (identity.detect() says "process")
    deps = list(_parsed(tmp_path)["head_server_deps"])
    assert [d.split("==")[0] for d in deps] == ["ray[default]", "openai"]


def _setup_env_command(tmp_path, venv_root: pathlib.Path, skip: bool) -> str:
    from nemo_gym.cli.setup_command import setup_env_command
    from omegaconf import OmegaConf

    server_dir = tmp_path / "pkg" / "resources_servers" / "tiny"
    server_dir.mkdir(parents=True, exist_ok=True)
    (server_dir / "requirements.txt").write_text("")
    config = OmegaConf.create(
        {
            "head_server_deps": ["openai==1"],
            "uv_venv_dir": str(venv_root),
            "python_version": "3.12",
            "skip_venv_if_present": skip,
            "uv_cache_dir": str(tmp_path / "uv"),
        }
    )
    return venvs.setup_env_command_advice(setup_env_command, None, (server_dir, config, "tiny_server"), {})


def _fake_venv(root: pathlib.Path) -> pathlib.Path:
    venv = root / "resources_servers" / "tiny" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "bin" / "activate").write_text("")
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    return venv


def test_a_reused_venv_without_our_packages_is_named_with_its_fix(tmp_path, orchestrator, said):
    venv = _fake_venv(tmp_path / "venvs")
    command = _setup_env_command(tmp_path, tmp_path / "venvs", skip=True)
    assert "uv pip install" not in command  # Gym reuses it
    (record,) = said
    message = record.getMessage()
    assert "'tiny_server'" in message and str(venv) in message and "gym-autoinstr" in message
    fix = message.split("Fix: ", 1)[1]
    assert shlex.split(fix) == ["uv", "pip", "install", "--python", str(venv / "bin" / "python")] + [
        argument for requirement in venvs.pinned_requirements() for argument in requirement.arguments
    ]


def test_a_reused_venv_with_our_packages_or_a_fresh_build_says_nothing(tmp_path, orchestrator, said):
    venv = _fake_venv(tmp_path / "venvs")
    # Gym builds it (no skip): the install carries our requirements, nothing to say
    assert "uv pip install" in _setup_env_command(tmp_path, tmp_path / "venvs", skip=False)
    # reused, and holding exactly what the orchestrator runs (this venv's site-packages)
    site = venv / "lib" / "python3.12" / "site-packages"
    site.rmdir()
    site.symlink_to(sysconfig.get_paths()["purelib"])
    assert venvs.missing_in(venv) == []
    _setup_env_command(tmp_path, tmp_path / "venvs", skip=True)
    assert said == []


# -- servers on other hosts ------------------------------------------------------------------


def test_local_installs_name_their_path_and_index_installs_none(installed):
    assert venvs.pinned_requirement(metadata.distribution("wrapt")).local_path is None
    assert venvs.pinned_requirement(_distribution(installed["site"], "tiny-wheel")).local_path == str(
        installed["wheel"]
    )
    assert venvs.pinned_requirement(_distribution(installed["site"], "tiny-dir")).local_path == str(
        installed["directory"]
    )
    assert venvs.pinned_requirement(_distribution(installed["site"], "tiny-edit")).local_path == str(
        installed["editable"]
    )


@pytest.fixture
def fresh_requirements():
    venvs.server_requirements.cache_clear()
    yield
    venvs.server_requirements.cache_clear()


def test_a_local_gym_autoinstr_is_said_once_with_the_fix(tmp_path, orchestrator, said, fresh_requirements, monkeypatch):
    monkeypatch.delenv(venvs.SERVER_REQUIREMENT_VARIABLE, raising=False)
    # this checkout is installed editable: a path no other host has
    assert "gym-autoinstr" in {r.name for r in venvs.local_requirements()}
    _parsed(tmp_path)
    _parsed(tmp_path)
    records = [r for r in said if "from a path on this machine" in r.getMessage()]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "gym-autoinstr (" in message and venvs.SERVER_REQUIREMENT_VARIABLE in message
    # nothing to fix on one host: a note, as the doctor rates it, not a warning
    assert records[0].levelno == logging.INFO
    # and no fix through a package index: gym-autoinstr is on none
    assert "index" not in message and "==" not in message, message


def test_the_setting_names_the_requirement_server_venvs_install(
    tmp_path, orchestrator, said, fresh_requirements, monkeypatch
):
    monkeypatch.setenv(
        venvs.SERVER_REQUIREMENT_VARIABLE,
        "gym-autoinstr @ https://example.invalid/gym_autoinstr-0.1.0-py3-none-any.whl",
    )
    deps = list(_parsed(tmp_path)["head_server_deps"])
    ours = [d for d in deps if "gym" in d and "autoinstr" in d]
    assert ours == ["'gym-autoinstr @ https://example.invalid/gym_autoinstr-0.1.0-py3-none-any.whl'"]
    assert _bash_words(ours[0]) == ["gym-autoinstr @ https://example.invalid/gym_autoinstr-0.1.0-py3-none-any.whl"]
    assert "gym-autoinstr" not in {r.name for r in venvs.local_requirements()}
    assert any(d.startswith("opentelemetry-sdk==") for d in deps)  # the rest stays pinned


def test_a_setting_that_is_not_one_requirement_is_named_and_ignored(said, fresh_requirements, monkeypatch):
    monkeypatch.setenv(venvs.SERVER_REQUIREMENT_VARIABLE, "--index-url http://x gym-autoinstr")
    assert venvs.requirement_override() is None
    (warning,) = [r.getMessage() for r in said if venvs.SERVER_REQUIREMENT_VARIABLE in r.getMessage()]
    assert "not one requirement" in warning and "==" not in warning  # its examples need no package index
    problem, fix = venvs.requirement_problem()  # what the doctor says
    assert warning == f"{problem}. Fix: {fix}."
    (ours,) = [r for r in venvs.pinned_requirements() if r.name == "gym-autoinstr"]
    assert ours.shell() in venvs.server_requirements()


# -- a local file that is gone ----------------------------------------------------------------


@pytest.fixture
def deleted_wheels(tmp_path, monkeypatch, fresh_requirements):
    """This environment as a Dockerfile that installs wheels and deletes them leaves it:
    gym-autoinstr and opentelemetry-sdk installed from files that are gone, wrapt from the index."""
    site = tmp_path / "site"
    wheels = tmp_path / "wheels"  # never created: deleted after the install

    def dist(name, version, url=None, *requires):
        directory = site / f"{name.replace('-', '_')}-{version}.dist-info"
        directory.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        (directory / "METADATA").write_text("\n".join(lines + [f"Requires-Dist: {r}" for r in requires]) + "\n")
        (directory / "INSTALLER").write_text("pip\n")
        if url:
            (directory / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))

    ours = wheels / "gym_autoinstr-0.1.0-py3-none-any.whl"
    dist("gym-autoinstr", "0.1.0", ours.as_uri(), "opentelemetry-sdk", "wrapt")
    dist("opentelemetry-sdk", "1.2.3", (wheels / "opentelemetry_sdk-1.2.3-py3-none-any.whl").as_uri())
    dist("wrapt", "1.17.0")
    real = venvs.pinned_requirements
    monkeypatch.setattr(venvs, "pinned_requirements", lambda root=venvs.PROJECT, path=None: real(root, [str(site)]))
    monkeypatch.delenv(venvs.SERVER_REQUIREMENT_VARIABLE, raising=False)
    return ours


def test_a_requirement_whose_file_is_gone_is_not_handed_to_server_venvs(tmp_path, orchestrator, said, deleted_wheels):
    deps = list(_parsed(tmp_path)["head_server_deps"])
    # nothing uv would fail the server venv's whole install on: no file:// of a file that is gone
    assert not [d for d in deps if "file:" in d], deps
    assert "opentelemetry-sdk==1.2.3" in deps and "wrapt==1.17.0" in deps  # the same versions, from the index
    assert not [d for d in deps if "autoinstr" in d]  # ours is on no index: left out
    (warning,) = [r for r in said if "no longer exists" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert f"gym-autoinstr ({deleted_wheels})" in message and "no longer exists" in message
    assert "servers Gym starts in them run untraced" in message and "Gym runs as usual" in message
    assert "opentelemetry-sdk 1.2.3 is installed from the package index instead" in message
    assert "must not delete it" in message and venvs.SERVER_REQUIREMENT_VARIABLE in message
    assert venvs.local_requirements() == []  # not "a path on this machine" too: it is on none
    _parsed(tmp_path)
    assert len([r for r in said if "no longer exists" in r.getMessage()]) == 1  # said once


def test_the_doctor_names_a_requirement_whose_file_is_gone(deleted_wheels):
    from gym_autoinstr.commands.doctor.venvs import server_venvs

    section, problems = server_venvs([{"name": "venvs.requirements", "resolved": True}])
    assert section["gone_paths"]["gym-autoinstr"] == str(deleted_wheels)
    (problem,) = [p for p in problems if "no longer exists" in p.problem]
    assert problem.severity == "warning" and "must not delete it" in problem.fix


def test_the_setting_replaces_a_gone_gym_autoinstr(tmp_path, orchestrator, said, deleted_wheels, monkeypatch):
    monkeypatch.setenv(venvs.SERVER_REQUIREMENT_VARIABLE, "gym-autoinstr @ https://example.invalid/g.whl")
    deps = list(_parsed(tmp_path)["head_server_deps"])
    assert "'gym-autoinstr @ https://example.invalid/g.whl'" in deps
    assert "opentelemetry-sdk==1.2.3" in deps
    (message,) = [r.getMessage() for r in said if "no longer exists" in r.getMessage()]
    assert message.startswith("server venvs cannot install opentelemetry-sdk (")  # ours is the setting's now
    assert "gym-autoinstr (" not in message and "run untraced" not in message
