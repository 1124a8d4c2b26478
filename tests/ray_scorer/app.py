"""A Gym resources server that scores with long-lived Ray actors, written in the style of
Gym's actor-based servers (``longmt_eval``, ``wmt_translation``): the actors are created on
the first ``/verify`` and kept for the server's whole life; every ``/verify`` calls them.

Per request: one call to the plain actor, one plain task, two overlapping calls each
to the threaded and the async actor, and, when the row's ``verifier_metadata`` asks for it, a call that
raises, waited for with ``await`` or ``ray.get`` (caught here: the rollout goes on with
reward 0).  The answer it returns says
where each call ran and under which trace context.
"""

import asyncio
import threading
from typing import Any, ClassVar, Optional

import ray
from pydantic import BaseModel, PrivateAttr
from scorer_actors import AsyncScorer, Scorer, ThreadedScorer, length

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class RayScorerConfig(BaseResourcesServerConfig):
    pass


class ScorerMetadata(BaseModel):
    fail: str = ""  # "await" or "get": also call a raising method, and wait for it that way
    secret: str = ""


class RayScorerRunRequest(BaseRunRequest):
    verifier_metadata: ScorerMetadata = ScorerMetadata()


class RayScorerVerifyRequest(RayScorerRunRequest, BaseVerifyRequest):
    pass


class RayScorerVerifyResponse(BaseVerifyResponse):
    calls: dict[str, Any]
    failed: Optional[str] = None


class RayScorerResourcesServer(SimpleResourcesServer):
    config: RayScorerConfig
    ray_enabled: ClassVar[bool] = True  # Gym 0.7+: this server uses Ray

    _actors: Optional[dict] = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _ensure_actors(self) -> dict:
        with self._lock:
            if self._actors is None:
                self._actors = {"plain": Scorer.remote(), "threaded": ThreadedScorer.remote(),
                                "async": AsyncScorer.remote()}
            return self._actors

    async def verify(self, body: RayScorerVerifyRequest) -> RayScorerVerifyResponse:
        actors = self._ensure_actors()
        secret = body.verifier_metadata.secret
        calls = {"plain": await actors["plain"].score.remote(secret), "task": await length.remote(secret)}
        calls["threaded"] = await asyncio.gather(*(actors["threaded"].meet.remote(secret) for _ in range(2)))
        calls["async"] = await asyncio.gather(*(actors["async"].meet.remote(secret) for _ in range(2)))
        failed = None
        try:
            if body.verifier_metadata.fail == "await":
                await actors["plain"].fail.remote(secret)
            elif body.verifier_metadata.fail == "get":  # blocking, as wmt_translation's ray.get(futures)
                ray.get(actors["plain"].fail.remote(secret))
        except ray.exceptions.RayTaskError as error:
            failed = type(error.cause).__name__
        reward = 0.0 if failed else calls["plain"]["score"]
        return RayScorerVerifyResponse(**body.model_dump(), reward=reward, calls=calls, failed=failed)


if __name__ == "__main__":
    RayScorerResourcesServer.run_webserver()
