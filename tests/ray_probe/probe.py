"""A Gym-style process submitting Ray tasks; prints what came back as one JSON line.

Run under ``opentelemetry-instrument`` with ``NEMO_GYM_CONFIG_PATH`` set (so it is a Gym
server to gym-autoinstr), the cluster's address as argv[1] and a directory holding a
``gym_autoinstr`` that cannot be imported as argv[2].
"""

import asyncio
import json
import os
import sys

import ray
from opentelemetry import trace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_tasks as t  # noqa: E402

ray.init(address=sys.argv[1], log_to_driver=True)
shadow = sys.argv[2]
out = {}
BURST = 5000  # spans one actor call ends just before it is killed
out["driver_pid"] = os.getpid()
# A task's exception surfacing in the caller inside the caller's own span (as in a Gym
# server's /verify), at ray.get here and at `await ref` below, beside calls that succeed,
# whose spans stay unmarked; no task more than before (a worker start each, here).
tracer = trace.get_tracer("ray_probe")
caught = {}
with tracer.start_as_current_span("probe.get_ok"):
    out["double"] = ray.get(t.double.remote(21))
out["spread"] = ray.get([t.check_correctness.remote("1 + 1", "2") for _ in range(4)])
with tracer.start_as_current_span("probe.get"):
    try:
        ray.get(t.raises.remote("secret-canary"))
        out["raises"] = "no error"
    except ray.exceptions.RayTaskError as error:
        out["raises"] = type(error.cause).__name__
        caught["get"] = isinstance(error, ValueError)  # Ray's RayTaskError(ValueError), unchanged
out["positional_only"] = ray.get(t.positional_only.remote(1, 2, c=3))
out["star"] = ray.get(t.star.options(name="renamed", num_cpus=0.5).remote(1, 2, k=3))
out["collides"] = ray.get(t.collides.remote(5))
out["pair"] = ray.get(list(t.pair.remote(7)))
out["numbers"] = list(ray.get(list(t.numbers.options(num_returns=3).remote(3))))
counter = t.Counter.remote(10)
out["actor"] = [ray.get(counter.add.remote(1)), ray.get(counter.add.options(name="add-twice").remote(2, times=2))]
with tracer.start_as_current_span("probe.actor_get"):
    try:
        ray.get(counter.fail.remote())
        out["actor_raises"] = "no error"
    except ray.exceptions.RayTaskError as error:
        out["actor_raises"] = type(error.cause).__name__
out["actor_static"] = ray.get(counter.version.remote())
echo = t.AsyncEcho.remote()
out["async_actor"] = ray.get(echo.echo.remote("hi"))


async def awaiting():
    with tracer.start_as_current_span("probe.await"):
        try:
            await counter.fail.remote()
        except ray.exceptions.RayTaskError as error:
            caught["await"] = [type(error.cause).__name__, isinstance(error, KeyError)]
    with tracer.start_as_current_span("probe.await_ok"):
        caught["await_ok"] = (await echo.echo.remote("again"))["value"]


asyncio.run(awaiting())
out["caller_errors"] = caught
out["burst"] = ray.get(echo.burst.remote(BURST))
# killed as Gym's shutdown kills actors, right after their last call: ray.kill has them
# export their spans first
ray.kill(echo)
ray.kill(counter)
missing = t.double.options(runtime_env={"env_vars": {"PYTHONPATH": shadow + os.pathsep + os.path.dirname(os.path.abspath(__file__))}})
out["missing"] = ray.get([missing.remote(4), missing.remote(5)])
print("PROBE-RESULT " + json.dumps(out), flush=True)
ray.shutdown()
