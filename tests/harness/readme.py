"""The README's backend recipes, read from the README itself: the tests export with what a
user following it sets, so a recipe that drifts fails a test.

``recipe("MLflow")``: the ``export NAME=VALUE`` settings under the ``# MLflow ...`` comment
of the README's "Sending traces elsewhere" block (up to the next comment), as a dict."""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Sending traces elsewhere"


def recipe(name: str) -> dict[str, str]:
    block = README.read_text().split(SECTION, 1)[1].split("```", 2)[1]
    settings: dict[str, str] = {}
    inside = False
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("#"):
            if inside and not line.startswith("# or"):
                break
            inside = line[1:].strip().startswith(name)
            continue
        if inside and line.startswith("export "):
            for word in shlex.split(line[len("export ") :], comments=True):
                key, _, value = word.partition("=")
                settings[key] = value
    assert settings, f"no recipe for {name} in {README.name}'s {SECTION!r}"
    return settings
