"""A trace UI's page in headless Chromium: its rendered text and a screenshot.

    text = page_text(url, tmp_path)                   # the DOM after the page's scripts ran
    png = screenshot(url, tmp_path / "trace.png")     # look at it, not only at its size

Debian's ``chromium`` (``./run-tests`` installs it as root), run ``--headless`` with a
fresh profile per call and a virtual-time budget, so a single-page app (MLflow's, Phoenix's)
has fetched and drawn its data before the DOM is dumped or the picture taken.  A test
that needs it calls ``require_chromium(what)``: without Chromium it skips, or fails under ``CI=true``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import uuid

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--hide-scrollbars",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium(checked: str) -> str:
    """Chromium's path; else the test skips (fails under ``CI=true``), saying what ``checked`` in it."""
    found = find_chromium()
    if found is None:
        message = f"Chromium is not installed: {checked} in headless Chromium (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _run(args: list[str], url: str, profile_root: pathlib.Path, window: str, budget_ms: int) -> str:
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("Chromium is not installed (apt-get install -y chromium)")
    profile = profile_root / f"chromium-profile-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [
            chromium,
            *FLAGS,
            f"--window-size={window}",
            f"--virtual-time-budget={budget_ms}",
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    shutil.rmtree(profile, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"chromium exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def page_dom(url: str, workdir: os.PathLike[str] | str, window: str = "1800,1000", budget_ms: int = 30000) -> str:
    """The page's DOM once its scripts have run (``--dump-dom``)."""
    return _run(["--dump-dom"], url, pathlib.Path(workdir), window, budget_ms)


def dom_text(dom: str) -> str:
    """What the DOM shows as text: tags, ``<style>`` and ``<script>`` removed, spaces folded."""
    dom = re.sub(r"<(style|script)\b[^>]*>.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)).strip()


def page_text(url: str, workdir: os.PathLike[str] | str, window: str = "1800,1000", budget_ms: int = 30000) -> str:
    return dom_text(page_dom(url, workdir, window, budget_ms))


def screenshot(
    url: str, png: os.PathLike[str] | str, window: str = "1800,1000", budget_ms: int = 30000
) -> pathlib.Path:
    """A PNG of the page at ``window`` size (``--screenshot``); the profile beside it."""
    png = pathlib.Path(png).absolute()
    png.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--screenshot={png}"], url, png.parent, window, budget_ms)
    if not png.is_file() or png.stat().st_size < 10_000:
        raise RuntimeError(f"chromium wrote no usable screenshot at {png}")
    return png
