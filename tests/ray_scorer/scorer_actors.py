"""Long-lived Ray actors (and a plain task) in the shapes Gym's actor-based servers use (``longmt_eval``'s and
``wmt_translation``'s scorers, ``local_vllm_model``'s engine): a plain actor (one call at a
time), a threaded one (``max_concurrency > 1``) and an async one.

Each call answers where it ran and which span was current inside it (read through the
OpenTelemetry API, as any library the actor uses would), so a test can tell whether
concurrent calls in one actor process each ran under their own context.  ``meet`` waits
until a second call is inside the actor too, so calls do overlap.
"""

import asyncio
import os
import threading

import ray


def _where() -> dict:
    current = {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
    try:
        from opentelemetry import trace

        span = trace.get_current_span().get_span_context()
        current.update(trace_id=format(span.trace_id, "032x"), span_id=format(span.span_id, "016x"))
    except ImportError:
        pass
    return current


@ray.remote(num_cpus=0)
def length(answer: str) -> dict:
    """A plain task beside the actors (as code_gen's check_correctness_remote)."""
    return {"length": len(answer), **_where()}


@ray.remote(num_cpus=0, scheduling_strategy="SPREAD")
class Scorer:
    def __init__(self) -> None:
        self.calls = 0

    def score(self, answer: str) -> dict:
        self.calls += 1
        return {"score": float(len(answer) > 0), **_where()}

    def fail(self, answer: str) -> dict:
        raise KeyError(answer)  # the answer must never reach the trace


@ray.remote(num_cpus=0, scheduling_strategy="SPREAD", max_concurrency=4)
class ThreadedScorer:
    def __init__(self) -> None:
        self.pair = threading.Barrier(2)

    def meet(self, answer: str) -> dict:
        before = _where()
        try:
            self.pair.wait(timeout=30)
            met = True
        except threading.BrokenBarrierError:
            self.pair.reset()
            met = False
        after = _where()  # after the other call attached its context in its own thread
        return {**after, "met": met, "same_inside": before == after}


@ray.remote(num_cpus=0, scheduling_strategy="SPREAD")
class AsyncScorer:
    def __init__(self) -> None:
        self.pair = None

    async def meet(self, answer: str) -> dict:
        if self.pair is None:
            self.pair = asyncio.Barrier(2)
        before = _where()
        try:
            await asyncio.wait_for(self.pair.wait(), 30)
            met = True
        except (asyncio.TimeoutError, asyncio.BrokenBarrierError):
            await self.pair.reset()
            met = False
        after = _where()  # after the other call's coroutine ran on the same event loop
        return {**after, "met": met, "same_inside": before == after}
