"""The package's import structure: the layers of ``gym_autoinstr/README.md`` ("The map"),
and no import cycles, imports inside functions included; and every attribute name declared
once, in ``gym_autoinstr/attributes.py``.

The rules live in ``pyproject.toml`` (``[tool.importlinter]``), where ``lint-imports``
reads them; here they run in-process with the suite, beside a plain check that lists
every cycle among our modules.  Both need import-linter (and grimp, which it brings) in
the test environment.
"""

from __future__ import annotations

import ast
import pathlib

import grimp
from importlinter import configuration
from importlinter.application import use_cases

import gym_autoinstr
from gym_autoinstr import attributes

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_import_linter_contracts_are_kept(capsys):
    assert pathlib.Path(gym_autoinstr.__file__).resolve().parent == ROOT / "gym_autoinstr", "not this checkout"
    # (what `lint-imports` runs, without its command's set-up: that one reconfigures
    # logging, which would silence every logger already made, ours included)
    configuration.configure()
    kept = use_cases.lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, report
    assert "0 broken" in report


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(imports[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_that():
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert _cycles(imports) == [["a", "b", "c"]]


def test_no_module_of_ours_is_part_of_an_import_cycle():
    graph = grimp.build_graph("gym_autoinstr", cache_dir=None)
    assert len(graph.modules) > 50  # the whole package, not an empty graph
    # (a module naming itself, as the wrappers Ray pickles by value do, is no cycle)
    imports = {
        m: {i for i in graph.find_modules_directly_imported_by(m) if i in graph.modules and i != m}
        for m in graph.modules
    }
    lines = []
    for component in _cycles(imports):
        lines.append(" <-> ".join(component))
        for importer in component:
            for imported in sorted(imports[importer] & set(component)):
                at = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
                lines.append(f"    {importer} -> {imported} (line {', '.join(map(str, at))})")
    assert not lines, "import cycles:\n" + "\n".join(lines)


def test_attribute_names_are_declared_once_and_documented():
    """No ``nemo.gym.*`` string literal in the package outside ``attributes.py`` (docstrings
    aside): writers and readers use its names, so a typo is a NameError; and each name there
    is in docs/spans-and-metrics.md unless its line says ``# internal``."""
    table = pathlib.Path(attributes.__file__)
    stray = []
    for path in sorted(set((ROOT / "gym_autoinstr").rglob("*.py")) - {table}):
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        stray += [
            f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and str(n.value).startswith("nemo.gym.") and id(n) not in docs
        ]
    assert not stray, "use gym_autoinstr/attributes.py's names:\n" + "\n".join(stray)
    lines = table.read_text().splitlines()
    declared = {
        n.value.value: lines[n.lineno - 1] for n in ast.parse("\n".join(lines)).body if isinstance(n, ast.Assign)
    }
    assert len(declared) == len([k for k in vars(attributes) if k.isupper()]) > 50
    documented = (ROOT / "docs" / "spans-and-metrics.md").read_text()
    missing = [v for v, line in declared.items() if f"`{v}" not in documented and "# internal" not in line]
    assert not missing, f"not in docs/spans-and-metrics.md: {missing}"
