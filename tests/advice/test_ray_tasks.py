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

from gym_autoinstr import attributes as attr
from gym_autoinstr.advice import ray_carrier, ray_tasks

SHADOW = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ray_probe" / "shadow"


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
    signature = ray_carrier.signature_with_carrier(function)
    assert str(signature) == expected
    args, kwargs = call
    # what Ray's flatten_args does: bind the call, carrier included, against it
    signature.bind(*args, **kwargs, _gym_autoinstr_ctx={"context": {}})
    if function is positional_only:
        with pytest.raises(TypeError):  # still positional-only
            signature.bind(a=1, b=2)


def test_a_function_with_a_parameter_of_the_carriers_name_is_not_wrapped():
    assert ray_carrier.signature_with_carrier(collides) is None


def test_the_wrapper_without_a_carrier_is_the_function():
    wrapper = ray_tasks.carrier_wrapper(star)
    assert wrapper(1, 2, k=3) == [[1, 2], ["k"]]
    assert wrapper.__name__ == "star" and wrapper.__wrapped__ is star


def _run_unpickled_without_us(tmp_path, pickled: bytes, script: str) -> subprocess.CompletedProcess:
    """``script`` on ``pickled`` (a file: argv[1]) in a Python that cannot import us; it succeeds."""
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(pickled)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(SHADOW)
    result = subprocess.run(
        [sys.executable, "-c", script, str(payload)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result


def test_the_wrapper_unpickles_and_runs_where_gym_autoinstr_cannot_be_imported(tmp_path):
    ray_cloudpickle = pytest.importorskip("ray.cloudpickle")

    def task(*args, **kwargs):  # defined here so it pickles by value, as Ray's tasks do
        return [list(args), sorted(kwargs)]

    script = (
        "import pickle,sys\n"
        "f = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "carrier = {'context': {'traceparent': '00-' + '1'*32 + '-' + '2'*16 + '-01'}, 'server': 's'}\n"
        "print(f(1, k=2, _gym_autoinstr_ctx=carrier), f(3, _gym_autoinstr_ctx=carrier))\n"
    )
    result = _run_unpickled_without_us(tmp_path, ray_cloudpickle.dumps(ray_tasks.carrier_wrapper(task)), script)
    assert result.stdout.strip() == "[[1], ['k']] [[3], []]"
    assert result.stderr.count("cannot import gym_autoinstr") == 1


def test_no_span_and_no_carrier_when_the_ray_group_is_off(monkeypatch):
    from gym_autoinstr.telemetry import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset())
    seen = []

    def submit(args=None, kwargs=None, **options):
        seen.append(kwargs)
        return "ref"

    assert ray_tasks.remote_function_advice(submit, object(), (), {"args": (1,), "kwargs": {"k": 2}}) == "ref"
    assert seen == [{"k": 2}]


def test_an_actor_class_unpickles_and_runs_where_gym_autoinstr_cannot_be_imported(tmp_path, monkeypatch):
    """Ray's actor subclass with our wrappers (``__init__`` and methods), pickled as Ray
    pickles it, in a Python without our package: the actor works and says so once."""
    ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
    from ray.actor import _modify_class

    from gym_autoinstr import instrumentor
    from gym_autoinstr.advice import ray_actor

    monkeypatch.setattr(ray_actor, "_init_wrapper", instrumentor.init_wrapper)  # what instrumenting hands over

    class Actor:  # defined here so it pickles by value, as a driver's actor does
        def __init__(self, x):
            self.x = x

        def get(self, y=0):
            return self.x + y

    modified = _modify_class(Actor)
    ray_tasks._install_on_class(modified)
    init = inspect.signature(inspect.unwrap(modified.__init__))
    assert str(init) == "(self, x, *, _gym_autoinstr_ctx=None)"
    script = (
        "import pickle,sys\n"
        "C = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "carrier = {'context': {}, 'rootless': True, 'settings': {}}\n"
        "a = C(40, _gym_autoinstr_ctx=carrier)\n"
        "print(a.get(1, _gym_autoinstr_ctx=carrier), a.get(_gym_autoinstr_ctx=carrier), a.get(2))\n"
    )
    result = _run_unpickled_without_us(tmp_path, ray_cloudpickle.dumps(modified), script)
    assert result.stdout.strip() == "41 40 42"
    assert result.stderr.count("cannot import gym_autoinstr") == 1
    assert "Ray actor's Python" in result.stderr


# --- a Ray gym-autoinstr does not know; Ray client stubs -------------------------------


@pytest.fixture
def ray_on(monkeypatch):
    from gym_autoinstr._log import forget_said
    from gym_autoinstr.telemetry import groups

    monkeypatch.setattr(groups, "ENABLED", frozenset({groups.RAY}))
    forget_said()
    yield pytest.importorskip("ray")
    forget_said()


def _recorder(seen: list):
    def submit(*args, **kwargs):
        seen.append((args, kwargs))
        return "ref"

    return submit


def plain(x):
    return x


def test_a_remote_function_of_an_unknown_shape_is_left_alone_and_said_once(ray_on, spans, caplog):
    # A Ray whose RemoteFunction keeps its state under other names (another release):
    # the real RemoteFunction of this Ray, one of the attributes the carrier relies on gone.
    ray = ray_on
    remote_function = ray.remote(plain)
    del remote_function.__dict__["_last_export_cluster_and_job"]
    seen: list = []
    for value in (1, 2):
        assert (
            ray_tasks.remote_function_advice(_recorder(seen), remote_function, (), {"args": (value,), "kwargs": {}})
            == "ref"
        )
    assert [kwargs for _, kwargs in seen] == [{"args": (1,), "kwargs": {}}, {"args": (2,), "kwargs": {}}]
    assert remote_function._function is plain  # what Ray pickles is untouched
    assert remote_function.__dict__[ray_tasks.INSTALLED] is False
    said = [r.getMessage() for r in caplog.records if "RemoteFunction" in r.getMessage()]
    assert len(said) == 1
    assert f"(ray {ray.__version__}) is not one gym-autoinstr knows; Ray tasks run untraced" in said[0]
    assert "gym-autoinstr doctor" in said[0]
    assert spans.get_finished_spans() == ()


def test_doctor_names_an_unknown_ray_shape_and_an_untested_ray_version(ray_on, monkeypatch):
    from ray.remote_function import RemoteFunction

    from gym_autoinstr.commands.doctor.ray import TESTED_RAY, ray_propagation

    report = [{"name": "ray.task", "resolved": True, "reason": None}]
    monkeypatch.setattr(ray_on, "__version__", "9.9.0")
    section, problems = ray_propagation({}, report, ["ray"])
    section.pop("worker_pointcuts")  # the Ray-actor rows: tests/commands/test_doctor.py
    # the shape checks out: active, and the version named as untested
    assert section == {"ray_version": "9.9.0", "active": True, "reason": None}
    assert [(p.severity, p.problem) for p in problems] == [
        ("info", f"Ray 9.9.0 is not the release tested ({TESTED_RAY}); its shape checks out")
    ]

    original = RemoteFunction.__init__

    def other_release(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self.__dict__["_function_signature"]

    monkeypatch.setattr(RemoteFunction, "__init__", other_release)
    section, problems = ray_propagation({}, report, ["ray"])
    section.pop("worker_pointcuts")
    assert section == {"ray_version": "9.9.0", "active": False, "reason": "RemoteFunction lacks _function_signature"}
    (problem,) = problems
    assert problem.severity == "warning" and "Ray tasks run untraced" in problem.problem
    assert TESTED_RAY in problem.fix


def test_a_ray_client_stub_declared_after_connecting_runs_untraced_with_one_message(ray_on, spans, caplog):
    from ray.util.client.common import ClientRemoteFunc

    seen: list = []
    stub = ClientRemoteFunc(plain)  # what `ray.util.client.ray.remote(plain)` makes
    for value in (1, 2):
        assert ray_tasks.client_call_advice(_recorder(seen), stub, (value,), {}) == "ref"
    assert seen == [((1,), {}), ((2,), {})]
    said = [r.getMessage() for r in caplog.records if "Ray client mode" in r.getMessage()]
    assert len(said) == 1 and f"remote function {__name__}.plain" in said[0]
    assert "declare remote functions and actor classes with ray.remote at import time, before ray.init" in said[0]
    assert spans.get_finished_spans() == ()


def test_a_ray_client_stub_of_a_traced_function_gets_the_carrier(ray_on, spans):
    from ray.util.client.common import ClientRemoteFunc

    wrapper = ray_tasks.carrier_wrapper(plain)
    wrapper.__signature__ = ray_carrier.signature_with_carrier(plain)
    seen: list = []
    # what Ray's client makes of a RemoteFunction that already took the carrier wrapper
    assert ray_tasks.client_call_advice(_recorder(seen), ClientRemoteFunc(wrapper), (7,), {}) == "ref"
    ((args, kwargs),) = seen
    assert args == (7,) and set(kwargs) == {ray_tasks.CARRIER}
    (span,) = spans.get_finished_spans()
    assert span.name == "ray.submit plain" and span.kind.name == "PRODUCER"
    assert span.attributes[attr.RAY_TASK_FUNCTION] == f"{__name__}.plain"
    assert kwargs[ray_tasks.CARRIER]["context"]["traceparent"].split("-")[2] == format(span.context.span_id, "016x")
    # a call that has it already (converted from a RemoteFunction, whose advice added it)
    seen.clear()
    ray_tasks.client_call_advice(_recorder(seen), ClientRemoteFunc(wrapper), (8,), {ray_tasks.CARRIER: {"x": 1}})
    assert seen == [((8,), {ray_tasks.CARRIER: {"x": 1}})] and len(spans.get_finished_spans()) == 1


def test_ray_get_in_client_mode_marks_the_callers_span_with_the_tasks_error_type(ray_on, spans):
    from opentelemetry import trace
    from ray.exceptions import GetTimeoutError, RayTaskError

    surfaced = RayTaskError("fail", "traceback", KeyError("secret-canary")).as_instanceof_cause()

    def get(*args, **kwargs):  # Ray client's Worker.get, re-raising what the client server sent
        raise kwargs["error"]

    tracer = trace.get_tracer("tests")
    for label, error in (("task", surfaced), ("timeout", GetTimeoutError("late"))):
        with tracer.start_as_current_span(f"caller.{label}"):
            with pytest.raises(type(error)) as raised:
                ray_tasks.client_get_advice(get, None, (), {"error": error})
            assert raised.value is error  # what the caller receives is untouched
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["caller.task"].status.status_code.name == "ERROR"
    assert by_name["caller.task"].attributes["error.type"] == "KeyError"
    assert "secret-canary" not in str(by_name["caller.task"].status.description or "")
    assert by_name["caller.timeout"].status.status_code.name == "UNSET"  # not a task's exception


def test_a_ray_client_refs_pending_id_is_not_waited_for():
    from concurrent.futures import Future

    class Ref:  # the shape of Ray client's ClientObjectRef before the client server answered
        def __init__(self, future):
            self._id_future = future

        def task_id(self):
            self._id_future.result()  # what Ray's own accessor does: wait for the id
            return bytes.fromhex("ab")

    pending, known = Future(), Future()
    known.set_result(b"id")
    assert ray_tasks._refs_task_id(Ref(pending)) is None and not pending.done()
    assert ray_tasks._refs_task_id([Ref(known)]) == "ab"  # answered already: read as usual
