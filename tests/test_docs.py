"""The documentation stays true to the code: the configuration reference lists every
declared setting with its kind and default, and every relative link in README.md and
docs/*.md leads to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

from gym_autoinstr import settings

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "configuration.md"


def _documents() -> list[Path]:
    return [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]


def _reference_rows() -> dict[str, tuple[str, str]]:
    """name -> (kind, default) from every table of the reference whose first column is a variable."""
    rows: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("| variable | kind | default |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name = cells[0].strip("`")
        assert name not in rows, f"{name} is listed twice in {REFERENCE.name}"
        rows[name] = (cells[1], cells[2].strip("`"))
    return rows


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, tuple):
        return ",".join(default)
    return str(default)


def test_the_configuration_reference_lists_every_setting_with_its_kind_and_default():
    rows = _reference_rows()
    declared = settings.ALL
    assert sorted(set(declared) - set(rows)) == [], "declared in settings.py, missing from docs/configuration.md"
    assert sorted(set(rows) - set(declared)) == [], "in docs/configuration.md, not declared in settings.py"
    wrong = {
        name: {"docs": rows[name], "settings.py": (setting.kind, _shown(setting.default))}
        for name, setting in declared.items()
        if rows[name] != (setting.kind, _shown(setting.default))
    }
    assert wrong == {}


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(_anchor(line.lstrip("#")))
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_docs_leads_to_a_file_and_heading_that_exist():
    broken = []
    for document in _documents():
        in_code = False
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto: not checked here
                path, _, fragment = target.partition("#")
                resolved = (document.parent / path).resolve() if path else document
                where = f"{document.relative_to(REPO)}:{number}: {target}"
                if not resolved.exists():
                    broken.append(where + " (no such file)")
                elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
                    broken.append(where + " (no such heading)")
    assert broken == []


def test_the_link_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    # the checker's own parts, on a page of known content
    page = tmp_path / "page.md"
    page.write_text("# Gym's `view` command\n\n## Server venvs\n")
    assert _anchors(page) == {"gyms-view-command", "server-venvs"}
    assert LINK.findall("see [a](docs/x.md#y) and [b](https://e.org)") == ["docs/x.md#y", "https://e.org"]


def test_the_readme_names_the_test_command_ci_runs():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert commands == ["tools/lint", "./run-tests"]
    quick_start = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first_block = quick_start.split("```", 2)[1]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["./run-demo", "./run-tests"]


VARIABLE = re.compile(r"\b((?:GYM_AUTOINSTR|OTEL)_[A-Z0-9_]*[A-Z0-9])\b(?!\[)")
COMMAND_LINE = re.compile(r"gym-autoinstr (view|compare|export|doctor)\b([^`\n#]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _known_variables() -> set[str]:
    """Ours (settings.py) and OpenTelemetry's (the SDK's and the API's declared names)."""
    import opentelemetry.environment_variables as api
    import opentelemetry.sdk.environment_variables as sdk

    known = set(settings.ALL)
    # and those the scripts and the test harness read (which Python to build venvs with, ...)
    for script in [
        REPO / "run-demo",
        REPO / "run-tests",
        *(REPO / "tools").iterdir(),
        *(REPO / "tests" / "harness").glob("*.py"),
    ]:
        if script.is_file():
            known |= set(VARIABLE.findall(script.read_text(errors="replace")))
    for module in (api, sdk):
        known |= {value for name, value in vars(module).items() if name.startswith("OTEL_") and isinstance(value, str)}
    return known


def test_every_variable_named_in_the_readme_and_docs_exists():
    known = _known_variables()
    # OpenTelemetry's per-signal and instrumentation names that its modules build at run time
    built = re.compile(r"OTEL_(EXPORTER_OTLP_(TRACES|METRICS|LOGS)_\w+|PYTHON_\w+|SEMCONV_\w+|INSTRUMENTATION_\w+)")
    unknown = {
        f"{document.relative_to(REPO)}: {name}"
        for document in _documents()
        for name in VARIABLE.findall(document.read_text())
        if name not in known and not built.fullmatch(name)
    }
    assert sorted(unknown) == []


def test_every_flag_named_in_the_readme_and_docs_exists():
    from gym_autoinstr.commands.cli import build_parser

    subcommands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 (argparse keeps them there)
    unknown = set()
    for document in _documents():
        for command, rest in COMMAND_LINE.findall(document.read_text()):
            options = subcommands[command]._option_string_actions  # noqa: SLF001
            unknown |= {
                f"{document.relative_to(REPO)}: {command} {flag}" for flag in FLAG.findall(rest) if flag not in options
            }
    assert sorted(unknown) == []
