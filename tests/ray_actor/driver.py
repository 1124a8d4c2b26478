"""A driver that does with Gym what NeMo RL's ``NemoGym`` Ray actor does, on Gym's real API.

Run under ``opentelemetry-instrument`` against a running Ray cluster:

    driver.py <ray address> <spec.json>

For each shard in the spec, one actor (pinned to a node by a custom resource) starts the
whole Gym fleet from inside itself (``RunHelper().start(GlobalConfigDictParserConfig(
initial_global_config_dict=..., skip_load_from_cli=True))``, with ``ray_head_node_address``
set to this cluster) and collects rollouts with ``RolloutCollectionHelper().run_examples``.
A run may call the actor inside a span the driver opened (``span``), and may hand the
actor that span's context in an explicit carrier as well, the way NeMo RL's decorator does
(``carrier``); a shard may give its actor a ``runtime_env`` (one that replaces
``PYTHONPATH``: no ``opentelemetry-instrument`` sitecustomize in the actor); an ``embedder`` shard sets up its own tracer provider and the
contrib aiohttp-client instrumentor in the actor before Gym starts, and opens its own span
around each batch (NeMo RL's ``rl.gym.run_rollouts``).  Prints one ``DRIVER-RESULT`` JSON
line.  Test scaffolding only: nothing here is gym-autoinstr.
"""

from __future__ import annotations

import json
import os
import sys

import ray
from opentelemetry import propagate, trace


@ray.remote(num_cpus=0)
class GymActor:
    def __init__(self, workdir: str, config: dict, embedder: bool, aiohttp: bool) -> None:
        os.chdir(workdir)
        loaded = sys.modules.get("sitecustomize")
        self.sitecustomize = getattr(loaded, "__file__", None)  # None: the runtime_env replaced PYTHONPATH
        self.embedder = embedder
        self.aiohttp_instrumented = False
        if embedder:
            # The embedder's own OpenTelemetry set-up, made before Gym starts.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=Resource.create({"service.name": "embedder-trainer"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500))
            trace.set_tracer_provider(provider)
            if aiohttp:
                from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

                AioHttpClientInstrumentor().instrument()
                self.aiohttp_instrumented = AioHttpClientInstrumentor().is_instrumented_by_opentelemetry
        from omegaconf import OmegaConf

        from nemo_gym.cli.env import RunHelper
        from nemo_gym.global_config import GlobalConfigDictParserConfig

        self.head = config["head_server"]
        self.run_helper = RunHelper()
        self.run_helper.start(GlobalConfigDictParserConfig(
            initial_global_config_dict=OmegaConf.create(config), skip_load_from_cli=True))
        self.run_helper.wait_for_spinup()

    def where(self) -> dict:
        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node": context.get_node_id(), "actor": context.get_actor_id(),
                "servers": [p.pid for p in self.run_helper._processes.values()],
                "provider": type(trace.get_tracer_provider()).__module__,
                "sitecustomize": self.sitecustomize, "pythonpath": os.environ.get("PYTHONPATH", ""),
                "aiohttp_instrumented": self.aiohttp_instrumented}

    async def run_rollouts(self, rows: list, carrier: "dict | None") -> list:
        from opentelemetry import context as otel_context

        from nemo_gym.config_types import BaseServerConfig
        from nemo_gym.rollout_collection import RolloutCollectionHelper

        token = otel_context.attach(propagate.extract(carrier)) if carrier else None
        try:
            if self.embedder:
                with trace.get_tracer("embedder").start_as_current_span("rl.gym.run_rollouts"):
                    return await self._collect(rows, BaseServerConfig, RolloutCollectionHelper)
            return await self._collect(rows, BaseServerConfig, RolloutCollectionHelper)
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _collect(self, rows, BaseServerConfig, RolloutCollectionHelper) -> list:
        head = BaseServerConfig(host=self.head["host"], port=self.head["port"])
        rewards = []
        for future in RolloutCollectionHelper().run_examples(rows, head_server_config=head):
            _row, result = await future
            rewards.append(result.get("reward"))
        return rewards

    def flush(self) -> bool:
        provider = trace.get_tracer_provider()
        return bool(getattr(provider, "force_flush", lambda: False)())

    def shutdown(self) -> None:
        self.run_helper.shutdown()


def main() -> None:
    address, spec_path = sys.argv[1], sys.argv[2]
    spec = json.loads(open(spec_path).read())
    ray.init(address=address, log_to_driver=False)
    tracer = trace.get_tracer("driver")
    out: dict = {"driver_pid": os.getpid(), "shards": {}}
    actors = {}
    for shard in spec["shards"]:
        options = {"name": shard["name"], "resources": {shard["node"]: 0.01}}
        if shard.get("runtime_env"):
            options["runtime_env"] = shard["runtime_env"]
        actors[shard["name"]] = GymActor.options(**options).remote(
            shard["workdir"], shard["config"], shard.get("embedder", False), shard.get("aiohttp", False))
    for shard in spec["shards"]:
        actor = actors[shard["name"]]
        result = {"where": ray.get(actor.where.remote(), timeout=600), "runs": []}
        for run in shard["runs"]:
            if run["carrier"] or run.get("span"):
                with tracer.start_as_current_span("driver.step") as span:
                    carrier: "dict | None" = None
                    if run["carrier"]:
                        carrier = {}
                        propagate.inject(carrier)
                    rewards = ray.get(actor.run_rollouts.remote(shard["rows"][: run["n"]], carrier), timeout=600)
                    ids = (format(span.get_span_context().trace_id, "032x"), format(span.get_span_context().span_id, "016x"))
            else:
                rewards = ray.get(actor.run_rollouts.remote(shard["rows"][: run["n"]], None), timeout=600)
                ids = None
            result["runs"].append({"rewards": rewards, "driver_span": ids})
        ray.get(actor.flush.remote(), timeout=60)
        out["shards"][shard["name"]] = result
    for actor in actors.values():
        try:
            ray.get(actor.shutdown.remote(), timeout=120)
        except Exception as error:  # the test kills what is left
            out.setdefault("shutdown_errors", []).append(repr(error))
    print("DRIVER-RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
