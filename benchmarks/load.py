"""Closed-loop HTTP load from the benchmark process: ``concurrency`` workers, each posting
the next request as soon as its last one answered (aiohttp, one event loop), for a number
of requests or a time box."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    n: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    @property
    def per_second(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else 0.0


def traceparent(tag: bytes) -> str:
    """A sampled W3C traceparent whose trace id starts with ``tag``."""
    trace_id = tag + os.urandom(16 - len(tag))
    return f"00-{trace_id.hex()}-{os.urandom(8).hex()}-01"


async def _run(
    url: str,
    body: bytes,
    n: int,
    concurrency: int,
    tag: bytes | None,
    check,
    duration: float | None,
    result: LoadResult | None,
) -> LoadResult:
    import aiohttp

    result = LoadResult(n=0, seconds=0.0) if result is None else result
    remaining = iter(range(n))
    deadline = None
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for _ in remaining:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                headers = {"Content-Type": "application/json"}
                if tag is not None:
                    headers["traceparent"] = traceparent(tag)
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        payload = await response.read()
                        ok = response.status == 200 and (check is None or check(payload))
                except Exception as error:  # counted, reported, never fatal here
                    ok = False
                    payload = repr(error).encode()
                result.latencies.append(time.perf_counter() - started)
                result.n += 1
                if not ok:
                    result.errors += 1
                    if not result.first_error:
                        result.first_error = payload[:300].decode(errors="replace")

        started = time.perf_counter()
        if duration is not None:
            deadline = started + duration
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - started
    return result


def run_load(
    url: str,
    body: bytes,
    n: int,
    concurrency: int,
    tag: bytes | None = None,
    check=None,
    duration: float | None = None,
    result: LoadResult | None = None,
) -> LoadResult:
    """``n`` requests, or as many as are started within ``duration`` seconds (all of
    them complete; the elapsed time runs until the last one answered).  ``result``: a
    fresh ``LoadResult`` to count into, which another thread may read while the load runs
    (its ``n`` so far)."""
    return asyncio.run(_run(url, body, n, concurrency, tag, check, duration, result))
