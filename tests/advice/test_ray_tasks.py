"""The Ray carrier in-process: the signature Ray checks calls against, and a wrapper that
unpickles and runs where gym-autoinstr cannot be imported.  Real Ray clusters:
``test_realgym_ray.py``."""

from __future__ import annotations

import inspect
import os
import pathlib
import subprocess
import sys

import pytest

from gym_autoinstr.advice import ray_tasks

SHADOW = pathlib.Path(__file__).resolve().parent.parent / "ray_probe" / "shadow"


def positional_only(a, /, b, *, c=0):
    return [a, b, c]


def star(*args, **kwargs):
    return [list(args), sorted(kwargs)]


def collides(x, _gym_autoinstr_ctx=None):
    return x


@pytest.mark.parametrize(
    "function, call, expected",
    [
        (positional_only, ((1, 2), {"c": 3}), "(a, /, b, *, c=0, _gym_autoinstr_ctx=None)"),
        (star, ((1,), {"k": 2}), "(*args, _gym_autoinstr_ctx=None, **kwargs)"),
    ],
)
def test_the_carrier_is_one_more_keyword_only_parameter(function, call, expected):
    signature = ray_tasks._signature_with_carrier(function)
    assert str(signature) == expected
    args, kwargs = call
    # what Ray's flatten_args does: bind the call, carrier included, against it
    signature.bind(*args, **kwargs, _gym_autoinstr_ctx={"context": {}})
    if function is positional_only:
        with pytest.raises(TypeError):  # still positional-only
            signature.bind(a=1, b=2)


def test_a_function_with_a_parameter_of_the_carriers_name_is_not_wrapped():
    assert ray_tasks._signature_with_carrier(collides) is None


def test_the_wrapper_without_a_carrier_is_the_function():
    wrapper = ray_tasks.carrier_wrapper(star)
    assert wrapper(1, 2, k=3) == [[1, 2], ["k"]]
    assert wrapper.__name__ == "star" and wrapper.__wrapped__ is star


def test_the_wrapper_unpickles_and_runs_where_gym_autoinstr_cannot_be_imported(tmp_path):
    ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
    payload = tmp_path / "task.pkl"

    def task(*args, **kwargs):  # defined here so it pickles by value, as Ray's tasks do
        return [list(args), sorted(kwargs)]

    payload.write_bytes(ray_cloudpickle.dumps(ray_tasks.carrier_wrapper(task)))
    script = (
        "import pickle,sys\n"
        "f = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "carrier = {'context': {'traceparent': '00-' + '1'*32 + '-' + '2'*16 + '-01'}, 'server': 's'}\n"
        "print(f(1, k=2, _gym_autoinstr_ctx=carrier), f(3, _gym_autoinstr_ctx=carrier))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(SHADOW)
    result = subprocess.run([sys.executable, "-c", script, str(payload)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[1], ['k']] [[3], []]"
    assert result.stderr.count("cannot import gym_autoinstr") == 1


def test_no_span_and_no_carrier_when_the_ray_group_is_off(monkeypatch):
    from gym_autoinstr.pipeline import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset())
    seen = []

    def submit(args=None, kwargs=None, **options):
        seen.append(kwargs)
        return "ref"

    assert ray_tasks.remote_function_advice(submit, object(), (), {"args": (1,), "kwargs": {"k": 2}}) == "ref"
    assert seen == [{"k": 2}]


def test_an_actor_class_unpickles_and_runs_where_gym_autoinstr_cannot_be_imported(tmp_path):
    """Ray's actor subclass with our wrappers (``__init__`` and methods), pickled as Ray
    pickles it, in a Python without our package: the actor works and says so once."""
    ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
    from ray.actor import _modify_class

    class Actor:  # defined here so it pickles by value, as a driver's actor does
        def __init__(self, x):
            self.x = x

        def get(self, y=0):
            return self.x + y

    modified = _modify_class(Actor)
    ray_tasks._install_on_class(modified)
    init = inspect.signature(inspect.unwrap(modified.__init__))
    assert str(init) == "(self, x, *, _gym_autoinstr_ctx=None)"
    payload = tmp_path / "actor.pkl"
    payload.write_bytes(ray_cloudpickle.dumps(modified))
    script = (
        "import pickle,sys\n"
        "C = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "carrier = {'context': {}, 'rootless': True, 'settings': {}}\n"
        "a = C(40, _gym_autoinstr_ctx=carrier)\n"
        "print(a.get(1, _gym_autoinstr_ctx=carrier), a.get(_gym_autoinstr_ctx=carrier), a.get(2))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(SHADOW)
    result = subprocess.run([sys.executable, "-c", script, str(payload)], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "41 40 42"
    assert result.stderr.count("cannot import gym_autoinstr") == 1
    assert "Ray actor's Python" in result.stderr
