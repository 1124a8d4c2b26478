"""Patch lifecycle, each case in a fresh interpreter (ddtrace style): import then
instrument, instrument then import, instrument twice, uninstrument (originals back by
identity, name copies included), re-instrument; and a pointcut that cannot apply is
skipped alone, with one warning naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("nemo_gym")

PRELUDE = textwrap.dedent(
    """
    import json, os, sys, tempfile
    os.chdir(tempfile.mkdtemp())  # Gym's config loader may write outputs/ into the cwd
    import wrapt
    from gym_autoinstr.instrumentor import GymInstrumentor

    def wrapped(obj):
        return isinstance(obj, wrapt.FunctionWrapper) and getattr(obj, "_self_gym_autoinstr", False)

    def state():
        import nemo_gym.server_utils as su, nemo_gym.openai_utils as ou
        return {
            "request": wrapped(su.request),
            "copy_in_openai_utils": wrapped(ou.request),
            "run_webserver": wrapped(su.SimpleServer.__dict__["run_webserver"]),
            "run_webserver_is_classmethod_like": callable(su.SimpleServer.run_webserver),
        }
    """
)


def run_case(body: str) -> dict:
    code = PRELUDE + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))}
    env["NEMO_GYM_CONFIG_DICT"] = "{}"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"out": json.loads(result.stdout.strip().splitlines()[-1]), "err": result.stderr}


def test_instrument_then_import_patches_before_copies_are_made():
    out = run_case(
        """
        GymInstrumentor().instrument()
        import nemo_gym.openai_utils  # copies `request` by name while importing
        print(json.dumps(state()))
        """
    )["out"]
    assert out == {
        "request": True,
        "copy_in_openai_utils": True,
        "run_webserver": True,
        "run_webserver_is_classmethod_like": True,
    }


def test_import_then_instrument_rebinds_the_copies_already_made():
    out = run_case(
        """
        import nemo_gym.openai_utils
        before = state()
        GymInstrumentor().instrument()
        print(json.dumps({"before": before, "after": state()}))
        """
    )["out"]
    assert not any(out["before"][k] for k in ("request", "copy_in_openai_utils", "run_webserver"))
    assert out["after"]["request"] and out["after"]["copy_in_openai_utils"] and out["after"]["run_webserver"]


def test_instrument_twice_wraps_once_and_uninstrument_restores_identity():
    out = run_case(
        """
        import importlib
        import nemo_gym.server_utils as su, nemo_gym.openai_utils as ou
        from gym_autoinstr.pointcuts import POINTCUTS

        def resolve(pointcut):
            # The object a pointcut patches, as its owner holds it (a class's own
            # __dict__ entry for a method), or None where this Gym / Ray lacks it.
            try:
                owner = importlib.import_module(pointcut.module)
            except Exception:
                return None
            *path, name = pointcut.attribute.split(".")
            for part in path:
                owner = getattr(owner, part, None)
                if owner is None:
                    return None
            holder = getattr(owner, "__dict__", {})
            return holder.get(name) if isinstance(owner, type) else getattr(owner, name, None)

        def targets():
            found = {"copy_in_openai_utils": ou.request}
            for pointcut in POINTCUTS:
                target = resolve(pointcut)
                if target is not None:
                    found[pointcut.name] = target
            return found
        originals = targets()
        instrumentor = GymInstrumentor()
        instrumentor.instrument()
        instrumentor.instrument()  # "already instrumented": no second layer
        double = isinstance(su.request.__wrapped__, wrapt.FunctionWrapper)
        wrapped_then = {k: wrapped(v) for k, v in targets().items()}
        instrumentor.uninstrument()
        current = targets()
        restored = {k: current[k] is originals[k] for k in originals}
        instrumentor.instrument()
        print(json.dumps({"double": double, "wrapped": wrapped_then, "restored": restored, "again": state()}))
        """
    )["out"]
    assert out["double"] is False
    # every pointcut row this Gym (and Ray) has, not a hand-kept list
    assert {"egress", "ingress", "copy_in_openai_utils"} <= set(out["wrapped"]) and len(out["wrapped"]) > 15
    assert out["wrapped"] == {k: True for k in out["wrapped"]}  # each target really was patched
    assert out["restored"] == {k: True for k in out["restored"]}
    assert out["again"]["request"] and out["again"]["copy_in_openai_utils"] and out["again"]["run_webserver"]


def test_a_missing_pointcut_is_skipped_alone_with_one_warning():
    result = run_case(
        """
        import nemo_gym.server_utils as su
        del su.SimpleServer.run_webserver  # Gym drift: the target is gone
        GymInstrumentor().instrument()
        import nemo_gym.openai_utils
        s = {"request": wrapped(su.request), "copy": wrapped(nemo_gym.openai_utils.request)}
        print(json.dumps(s))
        """
    )
    assert result["out"] == {"request": True, "copy": True}
    warnings = [line for line in result["err"].splitlines() if "run_webserver" in line]
    assert len(warnings) == 1 and "ingress" in warnings[0] and "skipping" in warnings[0]


def test_an_advice_error_never_reaches_gym():
    """A failing advice factory at import time: Gym's import still succeeds."""
    result = run_case(
        """
        from gym_autoinstr import patching
        def broken(pointcut, module):
            raise RuntimeError("boom")
        patching._patch = broken
        GymInstrumentor().instrument()
        import nemo_gym.server_utils, nemo_gym.openai_utils
        print(json.dumps({"imported": True, "request": wrapped(nemo_gym.server_utils.request)}))
        """
    )
    assert result["out"] == {"imported": True, "request": False}
    assert "boom" in result["err"] and "Gym runs unchanged" in result["err"]


def test_a_changed_signature_skips_that_seam_alone_with_one_warning():
    result = run_case(
        """
        import nemo_gym.server_utils as su
        async def request(target, verb="GET", **kwargs):  # Gym drift: renamed parameters
            raise AssertionError("not called")
        su.request = request
        GymInstrumentor().instrument()
        s = {"request": wrapped(su.request), "run_webserver": wrapped(su.SimpleServer.__dict__["run_webserver"])}
        print(json.dumps(s))
        """
    )
    assert result["out"] == {"request": False, "run_webserver": True}
    warnings = [line for line in result["err"].splitlines() if "signature changed" in line]
    assert len(warnings) == 1 and "egress" in warnings[0] and "method, url" in warnings[0]


def test_a_module_function_is_wrapped_through_a_twin_and_restored_by_identity():
    """wrapt asks an unbound wrapper's target for ``__self__`` on every call: the twin
    answers None (no AttributeError raised and cleared per call); Gym's function is not
    touched, the twin behaves as it, and removal puts the original back."""
    out = run_case(
        """
        import asyncio, inspect
        import nemo_gym.server_utils as su
        original = vars(su)["request"]
        kept = [original]  # late instrumentation rebinds module-level copies such as `original`
        instrumentor = GymInstrumentor()
        instrumentor.instrument()
        twin = su.request.__wrapped__
        original = kept[0]
        same = {name: getattr(twin, name) is getattr(original, name) or getattr(twin, name) == getattr(original, name)
                for name in ("__code__", "__globals__", "__defaults__", "__kwdefaults__", "__closure__",
                             "__name__", "__qualname__", "__module__", "__doc__", "__annotations__")}
        facts = {
            "twin_is_not_original": twin is not original,
            "twin_self": repr(twin.__self__),
            "original_has_no_self": not hasattr(original, "__self__"),
            "same": same,
            "signature": str(inspect.signature(su.request)) == str(inspect.signature(original)),
            "coroutine_function": inspect.iscoroutinefunction(su.request),
        }
        instrumentor.uninstrument()
        original = kept[0]
        facts["restored"] = su.request is original and not hasattr(original, "__self__")
        print(json.dumps(facts))
        """
    )["out"]
    assert out["twin_is_not_original"] and out["twin_self"] == "None" and out["original_has_no_self"]
    assert out["same"] == {k: True for k in out["same"]}
    assert out["signature"] and out["coroutine_function"] and out["restored"]
