"""The ``versions`` strings of the pointcut table (``gym_autoinstr/pointcuts.py``): their
format, and that every row declares releases it can be checked on.  Every row resolved
against every real release: ``test_realgym_version_matrix.py``."""

from __future__ import annotations

import pytest

from gym_autoinstr.commands.doctor import is_gym_module
from gym_autoinstr.pointcuts import POINTCUTS, RAY_WORKER_POINTCUTS, version_applies
from tests.test_realgym_version_matrix import RELEASES

# -- the table itself (fast) -----------------------------------------------------------


@pytest.mark.parametrize(
    "versions, gym_version, applies",
    [
        ("0.2.0+", "0.2.0", True),
        ("0.2.0+", "0.7.0rc1", True),
        ("0.4.0+", "0.3.0", False),
        ("0.5.0-0.6.x", "0.5.0", True),
        ("0.5.0-0.6.x", "0.6.9", True),
        ("0.5.0-0.6.x", "0.7.0", False),
        ("0.5.0-0.6.x", "0.4.0", False),
        ("0.5.x", "0.5.1", True),
        ("0.5.1", "0.5.0", False),
        ("0.2.0-0.3.x, 0.6.0+", "0.4.0", False),
        ("0.2.0-0.3.x, 0.6.0+", "0.6.0", True),
        ("any uvicorn", "0.2.0", True),
    ],
)
def test_versions_format_reads_as_documented(versions, gym_version, applies):
    assert version_applies(versions, gym_version) is applies


@pytest.mark.parametrize("malformed", ["", "soon", "0.x.1+", "1.2.3.4", "any", "0.2.0 -"])
def test_a_malformed_versions_string_is_an_error(malformed):
    with pytest.raises(ValueError):
        version_applies(malformed, "0.4.0")


@pytest.mark.parametrize("pointcut", POINTCUTS + RAY_WORKER_POINTCUTS, ids=lambda p: p.name)
def test_every_pointcut_declares_readable_versions(pointcut):
    covered = [version_applies(pointcut.versions, release) for release in RELEASES]
    if is_gym_module(pointcut.module):
        assert not pointcut.versions.startswith("any "), "'any <library>' is for targets outside Gym"
        if not pointcut.optional:
            assert all(covered), f"{pointcut.name} is not optional, so its versions must cover {RELEASES}"
        else:
            assert any(covered), f"{pointcut.name} applies to no supported release"
    else:
        assert pointcut.versions.startswith("any "), f"{pointcut.module} is not Gym: declare 'any <library>'"
