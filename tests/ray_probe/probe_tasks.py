"""Ray tasks in the shapes Gym's servers submit (imported by the probe and by workers)."""

import os
import sys

import ray


def _where():
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


@ray.remote
def double(x):
    return {"value": x * 2, **_where()}


# code_gen's shape: SPREAD, and a runtime_env that replaces PYTHONPATH.
@ray.remote(
    scheduling_strategy="SPREAD",
    runtime_env={"py_executable": sys.executable, "env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}},
)
def check_correctness(program, expected):
    return {"value": str(eval(program)) == expected, "pythonpath": os.environ.get("PYTHONPATH"), **_where()}


@ray.remote
def raises(kind):
    raise ValueError(kind)


@ray.remote
def positional_only(a, /, b, *, c=0):
    return {"value": [a, b, c], **_where()}


@ray.remote
def star(*args, **kwargs):
    return {"value": [list(args), sorted(kwargs)], **_where()}


@ray.remote
def collides(x, _gym_autoinstr_ctx=None):
    return {"value": [x, _gym_autoinstr_ctx], **_where()}


@ray.remote(num_returns=2)
def pair(x):
    return x, x + 1


@ray.remote
def numbers(n):
    for i in range(n):
        yield i


@ray.remote
class Counter:
    """A Gym-style actor (like longmt_eval's or wmt_translation's scorers)."""

    def __init__(self, start):
        self.total = start

    def add(self, x, *, times=1):
        self.total += x * times
        return {"value": self.total, **_where()}

    def fail(self):
        raise KeyError("secret-canary")

    @staticmethod
    def version():
        return 1


@ray.remote
class AsyncEcho:
    async def echo(self, x):
        return {"value": x, **_where()}

    async def burst(self, n):
        # Spans of the actor's own, all ended just before the call returns, the last thing
        # the actor does before the probe kills it.
        from opentelemetry import trace

        tracer = trace.get_tracer("ray_probe.actor")
        spans = [tracer.start_span("probe.burst", attributes={"probe.index": i}) for i in range(n)]
        for span in spans:
            span.end()
        return {"value": n, **_where()}
