"""Metrics in-process of what Gym's servers wait on and retry, with real Gym classes, Gym's real
aiohttp client and the in-memory reader (``reader``, ``conftest.py``): the client's pool waits,
retries and timeouts, semaphore limits (held, waiting, made later), sandbox durations and
create retries.
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI

from gym_autoinstr import attributes as attr
from gym_autoinstr.advice import pool
from tests.harness.servers import run_async, serve
from tests.telemetry.metric_points import counts, points

# Gym's client is observed through hooks on the session and its connector, or, on
# another aiohttp or with GYM_AUTOINSTR_AIOHTTP_HOOKS=0, through a TraceConfig: both
# must give the same numbers.
MECHANISMS = pytest.mark.parametrize("hooks", ["1", "0"], ids=["hooks", "trace-config"])


def _check_mechanism(session, hooks: str) -> None:
    from gym_autoinstr.advice import pool

    hooked = "_request" in vars(session)
    assert hooked == (hooks == "1")
    assert (pool.trace_config() in session._trace_configs) == (hooks == "0")


@MECHANISMS
def test_pool_waits_by_destination_gym_server(instrumented, reader, monkeypatch, hooks):
    """Gym's real client with a one-connection pool; three concurrent calls to a slow
    server: two wait for the slot, recorded under the server's name from Gym's config."""
    monkeypatch.setenv(pool.HOOKS_ENV, hooks)
    from nemo_gym import global_config, server_utils
    from omegaconf import OmegaConf

    app = FastAPI()

    @app.post("/slow")
    async def slow(body: dict):
        await asyncio.sleep(0.2)
        return {}

    from gym_autoinstr.advice import egress, fleet_addresses

    with serve(app) as base:
        port = int(base.rsplit(":", 1)[1])
        config = OmegaConf.create(
            {"slow_resources": {"resources_servers": {"slow": {"host": "127.0.0.1", "port": port}}}}
        )
        monkeypatch.setattr(global_config, "_GLOBAL_CONFIG_DICT", config)
        monkeypatch.setattr(fleet_addresses._state, "names", None)
        pool._attributes.clear()
        previous = server_utils._GLOBAL_AIOHTTP_CLIENT

        async def calls():
            server_utils._GLOBAL_AIOHTTP_CLIENT = None
            session = egress.global_client_advice(
                server_utils.set_global_aiohttp_client,
                None,
                (
                    server_utils.GlobalAIOHTTPAsyncClientConfig(
                        global_aiohttp_connector_limit=1, global_aiohttp_connector_limit_per_host=1
                    ),
                ),
                {},
            )
            _check_mechanism(session, hooks)
            try:

                async def one():
                    response = await server_utils.request("POST", f"{base}/slow", json={})
                    await response.read()
                    return response.status

                return await asyncio.gather(one(), one(), one())
            finally:
                await session.close()
                server_utils._GLOBAL_AIOHTTP_CLIENT = previous

        before = counts(reader, "gym.http.connection_pool.queue_duration_ms", attr.DESTINATION).get("slow_resources", 0)
        assert run_async(calls()) == [200, 200, 200]
    waits = [
        p
        for _, p in points(reader, "gym.http.connection_pool.queue_duration_ms")
        if dict(p.attributes)[attr.DESTINATION] == "slow_resources"
    ]
    assert sum(p.count for p in waits) == before + 2
    assert max(p.max for p in waits) >= 150  # the third call waited for two 200 ms calls
    assert dict(waits[0].attributes)["nemo.gym.http.connection_pool.queue_outcome"] == "acquired"


class _Flaky:
    """A raw HTTP server on the tests' loop: the first connection is dropped without an
    answer, the second stalls past the caller's timeout, every later one answers 200."""

    def __init__(self) -> None:
        self.connections = 0

    async def handle(self, reader, writer) -> None:
        self.connections += 1
        number = self.connections
        try:
            await reader.readuntil(b"\r\n\r\n")
            if number == 1:
                return  # closed without a response: ServerDisconnectedError
            if number == 2:
                await asyncio.sleep(1.0)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
            )
            await writer.drain()
        except Exception:
            pass
        finally:
            writer.close()


@MECHANISMS
def test_retries_by_reason_and_timeouts_on_gyms_client(instrumented, reader, monkeypatch, hooks):
    """Gym's real ``server_utils.request`` on Gym's real client: a dropped connection and a
    timed-out attempt are each retried by Gym; each retry is counted by Gym's reason, the
    timeout once, and a request that succeeds first time counts nothing."""
    monkeypatch.setenv(pool.HOOKS_ENV, hooks)
    import aiohttp
    from nemo_gym import server_utils

    from gym_autoinstr.advice import egress

    flaky = _Flaky()
    monkeypatch.setattr(server_utils, "MAX_NUM_TRIES", 5, raising=False)

    def retries() -> dict:
        return {
            (dict(p.attributes)[attr.RETRY_REASON], dict(p.attributes)[attr.HTTP_INTERNAL]): p.value
            for _, p in points(reader, "gym.http.retry_total")
        }

    def timeouts() -> dict:
        return {dict(p.attributes)[attr.HTTP_INTERNAL]: p.value for _, p in points(reader, "gym.http.timeout_total")}

    async def calls():
        server = await asyncio.start_server(flaky.handle, "127.0.0.1", 0)
        port = flaky.port = server.sockets[0].getsockname()[1]
        previous = server_utils._GLOBAL_AIOHTTP_CLIENT
        server_utils._GLOBAL_AIOHTTP_CLIENT = None
        session = egress.global_client_advice(
            server_utils.set_global_aiohttp_client, None, (server_utils.GlobalAIOHTTPAsyncClientConfig(),), {}
        )
        _check_mechanism(session, hooks)
        try:
            statuses = []
            for _ in range(2):
                response = await server_utils.request(
                    "POST", f"http://127.0.0.1:{port}/flaky", json={}, timeout=aiohttp.ClientTimeout(total=0.3)
                )
                await response.read()
                statuses.append(response.status)
            return statuses
        finally:
            await session.close()
            server_utils._GLOBAL_AIOHTTP_CLIENT = previous
            server.close()

    retries_before, timeouts_before = retries(), timeouts()
    assert run_async(calls()) == [200, 200]
    assert flaky.connections == 4  # dropped, timed out, answered; then answered first time
    gained = {k: v - retries_before.get(k, 0) for k, v in retries().items() if v - retries_before.get(k, 0)}
    assert gained == {("server_disconnected", False): 1, ("timeout", False): 1}
    assert {k: v - timeouts_before.get(k, 0) for k, v in timeouts().items()} == {False: 1}
    connects = {
        dict(p.attributes)[attr.DESTINATION]: p.value
        for _, p in points(reader, "gym.http.connection_pool.connect_total")
    }
    assert connects[f"127.0.0.1:{flaky.port}"] == 4  # one new connection per attempt (the server closes each)


def test_a_gym_semaphore_limit_held_waiting_and_waits(instrumented, reader):
    """A real Gym model server that caps its calls with an asyncio semaphore (as Gym's
    openai_model does): the limit, the holders and waiters at collection time, and the
    waits of the calls that queued."""
    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel

    from gym_autoinstr.advice import concurrency
    from tests.advice.test_routes import Ask, _client, _config

    observed: dict = {}

    class Capped(SimpleResponsesAPIModel):
        def model_post_init(self, context):
            self._semaphore = asyncio.Semaphore(1)
            return super().model_post_init(context)

        async def responses(self, body: Ask):
            async with self._semaphore:
                await asyncio.sleep(0.1)
            return {"output": []}

        async def chat_completions(self, body: Ask):
            return {}

    server = Capped(config=_config(BaseResponsesAPIModelConfig, "capped_model"), server_client=_client())
    assert concurrency.watch_server(server, "capped_model") == 1
    site = {attr.CONCURRENCY_SITE: "Capped._semaphore", attr.SERVER_NAME: "capped_model"}

    def gauge(name: str) -> int:
        (value,) = [p.value for _, p in points(reader, name) if dict(p.attributes) == site]
        return value

    async def held_while_two_wait():
        async with server._semaphore:
            waiters = [asyncio.ensure_future(server._semaphore.acquire()) for _ in range(2)]
            await asyncio.sleep(0.05)
            observed.update(
                {
                    n: gauge(n)
                    for n in (
                        "gym.concurrency.limit",
                        "gym.concurrency.active",
                        "gym.concurrency.available",
                        "gym.concurrency.queue_depth",
                    )
                }
            )
        for waiter in waiters:
            await waiter
            server._semaphore.release()

    run_async(held_while_two_wait())
    assert observed == {
        "gym.concurrency.limit": 1,
        "gym.concurrency.active": 1,
        "gym.concurrency.available": 0,
        "gym.concurrency.queue_depth": 2,
    }
    assert isinstance(server._semaphore, asyncio.Semaphore)
    waits = [p for _, p in points(reader, "gym.concurrency.queue_wait_duration_ms") if dict(p.attributes) == site]
    assert sum(p.count for p in waits) == 2 and max(p.max for p in waits) >= 40
    assert (gauge("gym.concurrency.active"), gauge("gym.concurrency.queue_depth")) == (0, 0)
    concurrency.restore()
    assert type(server._semaphore) is asyncio.Semaphore


def test_sandbox_active_start_and_exec_durations_by_provider(instrumented, reader):
    """Gym's real AsyncSandbox over a local-process provider: one start, three execs (one
    failing, one timing out), one stop."""
    from tests.advice.test_sandbox import _session

    def by_provider(name: str) -> int:
        return sum(
            getattr(p, "count", None) if hasattr(p, "count") else p.value
            for _, p in points(reader, name)
            if dict(p.attributes).get("nemo.gym.sandbox.provider") == "local-process"
        )

    before = {n: by_provider(n) for n in ("gym.sandbox.startup_duration_ms", "gym.sandbox.exec_duration_ms")}
    run_async(_session())
    assert by_provider("gym.sandbox.startup_duration_ms") - before["gym.sandbox.startup_duration_ms"] == 1
    assert by_provider("gym.sandbox.exec_duration_ms") - before["gym.sandbox.exec_duration_ms"] == 3
    assert points(reader, "gym.sandbox.active")
    assert by_provider("gym.sandbox.active") == 0  # started once, stopped once
    (metric, _), *_ = points(reader, "gym.sandbox.exec_duration_ms")
    assert metric.unit == "ms"


def test_sandbox_create_retries_counted_by_provider_and_not_where_gym_records_them(instrumented, reader):
    """Gym's real OpenSandbox provider module's ``_log_create_retry`` (tenacity's
    ``before_sleep``; driven by a real retry loop in ``test_realgym_sandbox.py``): one count
    per call, by provider; none of the sandbox metrics where Gym's own telemetry is live."""
    from types import SimpleNamespace

    from nemo_gym.sandbox.providers.opensandbox import provider as opensandbox

    from gym_autoinstr.advice import coexistence
    from tests.advice.test_sandbox import _session

    def count(name: str, provider: str) -> int:
        return sum(
            getattr(p, "count", None) if hasattr(p, "count") else p.value
            for _, p in points(reader, name)
            if dict(p.attributes) == {"nemo.gym.sandbox.provider": provider}
        )

    retry_state = SimpleNamespace(
        outcome=None, next_action=None, attempt_number=1
    )  # tenacity's RetryCallState fields read
    before = count("gym.sandbox.create_retry_total", "opensandbox")
    opensandbox._log_create_retry(retry_state)
    opensandbox._log_create_retry(retry_state)
    assert count("gym.sandbox.create_retry_total", "opensandbox") - before == 2
    (metric, _), *_ = points(reader, "gym.sandbox.create_retry_total")
    assert metric.unit == "{retry}"

    starts = count("gym.sandbox.startup_duration_ms", "local-process")
    coexistence.set_native_live_for_tests(True)
    try:
        opensandbox._log_create_retry(retry_state)
        run_async(_session())
    finally:
        coexistence.set_native_live_for_tests(False)
    assert count("gym.sandbox.create_retry_total", "opensandbox") - before == 2
    assert count("gym.sandbox.startup_duration_ms", "local-process") == starts


def _site_points(reader, name: str, site: dict) -> list:
    return [p for _, p in points(reader, name) if dict(p.attributes) == site]


def test_semaphores_a_server_makes_later_are_observed_from_the_next_collection(instrumented, reader, monkeypatch):
    """A real Gym resources server watched with no semaphore; it makes one after it
    started serving (held at that moment), and replaces it later: each is observed from
    the next collection, the in-use one with the limit it shows once seen idle."""
    from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer

    from gym_autoinstr.advice import concurrency
    from tests.advice.test_routes import _client, _config

    monkeypatch.setattr(concurrency, "RESCAN_SECONDS", 0.0)

    class Lazy(SimpleResourcesServer):
        async def verify(self, body):
            return {}

    server = Lazy(config=_config(BaseResourcesServerConfig, "lazy_resources"), server_client=_client())
    assert concurrency.watch_server(server, "lazy_resources") == 0
    site = {attr.CONCURRENCY_SITE: "Lazy._judges", attr.SERVER_NAME: "lazy_resources"}
    assert not _site_points(reader, "gym.concurrency.limit", site)

    async def made_while_serving():
        server._judges = asyncio.Semaphore(3)
        await server._judges.acquire()  # one judge call already running when it is found
        first = {n: _site_points(reader, n, site)[0].value for n in ("gym.concurrency.limit", "gym.concurrency.active")}
        server._judges.release()
        waited = []
        async with server._judges:
            async with server._judges:
                async with server._judges:
                    waiter = asyncio.ensure_future(server._judges.acquire())
                    await asyncio.sleep(0.02)
                    waited.append(_site_points(reader, "gym.concurrency.queue_depth", site)[0].value)
            await waiter
            server._judges.release()
        return first, waited

    first, waited = run_async(made_while_serving())
    assert first == {"gym.concurrency.limit": 2, "gym.concurrency.active": 0}  # found in use: a lower bound
    assert waited == [1]
    assert _site_points(reader, "gym.concurrency.limit", site)[0].value == 3  # seen idle: the real limit
    (wait,) = _site_points(reader, "gym.concurrency.queue_wait_duration_ms", site)
    assert wait.count == 1 and wait.max >= 15
    replaced = server._judges
    server._judges = asyncio.BoundedSemaphore(5)  # replaced: the new one takes the site, limit its bound
    assert [p.value for p in _site_points(reader, "gym.concurrency.limit", site)] == [5]
    assert type(replaced).__mro__[1] is asyncio.Semaphore  # the old one, still referenced, still observed class
    concurrency.restore()
    assert type(server._judges) is asyncio.BoundedSemaphore


def test_an_observed_semaphore_behaves_as_its_own_class(instrumented, reader):
    """The class swap keeps what code can see of a semaphore: subclasses and their own
    acquire, BoundedSemaphore's over-release error, locked(), a semaphore reached through
    two attributes (one site, one wait per acquisition), a coroutine-function acquire,
    copies and pickles of the original class without our attributes, and an acquisition
    that only passes cancelled waiters is not a wait."""
    import copy
    import inspect
    import pickle

    from gym_autoinstr.advice import concurrency

    class Counting(asyncio.Semaphore):
        acquired = 0

        async def acquire(self):
            Counting.acquired += 1
            return await super().acquire()

    class Holder:
        def __init__(self):
            self.shared = asyncio.Semaphore(1)
            self.alias = self.shared
            self.bounded = asyncio.BoundedSemaphore(2)
            self.counting = Counting(1)

    holder = Holder()
    assert concurrency.watch_server(holder, "holder") == 3
    shared_site = {attr.CONCURRENCY_SITE: "Holder.shared", attr.SERVER_NAME: "holder"}
    assert not _site_points(reader, "gym.concurrency.limit", {**shared_site, attr.CONCURRENCY_SITE: "Holder.alias"})
    assert type(holder.counting).__mro__[1] is Counting and isinstance(holder.bounded, asyncio.BoundedSemaphore)
    assert inspect.iscoroutinefunction(holder.shared.acquire) and asyncio.iscoroutinefunction(holder.shared.acquire)

    async def exercise():
        async with holder.counting:
            pass
        await holder.bounded.acquire()
        holder.bounded.release()
        try:
            holder.bounded.release()
            raise AssertionError("over-release accepted")
        except ValueError:
            pass
        async with holder.shared:
            assert holder.alias.locked()
            waiter = asyncio.ensure_future(holder.alias.acquire())
            await asyncio.sleep(0.01)
        await waiter
        holder.shared.release()
        # a waiter cancelled (its wait is recorded), still queued when the slot frees:
        # the next acquisition passes it without waiting, and is not recorded
        async with holder.shared:
            cancelled = asyncio.ensure_future(holder.shared.acquire())
            await asyncio.sleep(0)
            cancelled.cancel()
        assert holder.shared._waiters and not holder.shared.locked()
        await holder.shared.acquire()
        holder.shared.release()
        await asyncio.gather(cancelled, return_exceptions=True)

    run_async(exercise())
    assert Counting.acquired == 1
    (wait,) = _site_points(reader, "gym.concurrency.queue_wait_duration_ms", shared_site)
    assert wait.count == 2  # the alias's wait and the cancelled one
    for clone in (copy.copy(holder.shared), copy.deepcopy(holder.bounded), pickle.loads(pickle.dumps(holder.bounded))):
        assert type(clone) in (asyncio.Semaphore, asyncio.BoundedSemaphore)
        assert not hasattr(clone, "_gym_autoinstr_concurrency")
    assert type(copy.copy(holder.counting)) is Counting  # a local class: copied, not pickled
    concurrency.restore()
    assert (type(holder.shared), type(holder.bounded), type(holder.counting)) == (
        asyncio.Semaphore,
        asyncio.BoundedSemaphore,
        Counting,
    )
    assert not hasattr(holder.shared, "_gym_autoinstr_concurrency")


def test_only_the_processes_that_serve_watch_a_servers_limits(instrumented, reader, monkeypatch):
    """``set_ulimit`` runs in run_webserver in every process: the main process of a
    ``num_workers: 2`` server only supervises, each worker serves."""
    from types import SimpleNamespace

    from gym_autoinstr.advice import concurrency, ingress

    def limits_of(workers: int) -> list:
        server = SimpleNamespace(config=SimpleNamespace(num_workers=workers), limit=asyncio.Semaphore(4))
        ingress.server_limits_advice(lambda: None, server, (), {})
        site = {attr.CONCURRENCY_SITE: "SimpleNamespace.limit", attr.SERVER_NAME: "pool_server"}
        found = [p.value for p in _site_points(reader, "gym.concurrency.limit", site)]
        concurrency.restore()
        return found

    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "pool_server")
    monkeypatch.delenv("IS_NEMO_GYM_FASTAPI_WORKER", raising=False)
    assert limits_of(1) == [4]
    assert limits_of(2) == []  # the supervising main process
    monkeypatch.setenv("IS_NEMO_GYM_FASTAPI_WORKER", "1")
    assert limits_of(2) == [4]  # a worker
