"""No model content, task content or credential leaves a Gym process in telemetry.

Unique canaries are planted everywhere a secret or content lives in a real rollout:
the model server's API key (config, and the ``Authorization`` header it sends
upstream), a query string on the inbound ``/run``, the prompt, the tool arguments and
tool result and the completion (the policy model asks the weather tool about a canary
city and quotes the answer), an environment variable, a command-line override, a config
value, and a request body that fails validation.  Then every exported byte is searched:
what the collector received (traces and metrics) with every span group on, and the local
files of the embedded default with the default preset.  Presets only switch whole sites
on or off and a site records the same attributes under any preset, so ``all`` covers
``per_rollout`` and ``default``.  (``user:password@`` in a URL cannot travel through
Gym's model server, whose client refuses it beside the ``Authorization`` header; its
redaction is tested on Gym's real ``request`` in test_egress.py.)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from gym_autoinstr.setup.files import segment_lines
from tests.harness.collector import Collector
from tests.harness.trio import AGENT, MODEL, GymTrio, PolicyModel

pytestmark = pytest.mark.realgym

CANARIES = {
    "api_key": "sk-canary-apikey-7f3a91",
    "query": "canary-query-8812",
    "prompt": "canary-prompt-3390",
    "tool": "Canaryville-4471",
    "env": "canary-env-6062",
    "argv": "canary-argv-1177",
    "config": "canary-config-2290",
    "bad_body": "canary-badbody-9931",
}


def _leaks(blobs: list[bytes]) -> dict[str, int]:
    lowered = [b.lower() for b in blobs]
    return {
        name: sum(c.lower().encode() in b for b in lowered)
        for name, c in CANARIES.items()
        if any(c.lower().encode() in b for b in lowered)
    }


def _post(url: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _run_with_canaries(tmp_path, name: str, env: dict[str, str]) -> GymTrio:
    version = "0.4.0"
    with PolicyModel(args=("--city", CANARIES["tool"])) as model:
        trio = GymTrio.for_version(
            version,
            tmp_path / name,
            policy_url=model.url,
            instrument=True,
            env={**env, "MY_SECRET_TOKEN": CANARIES["env"]},
            extra_config={MODEL: {"openai_api_key": CANARIES["api_key"]}, "canary_config": CANARIES["config"]},
        )
        command = trio.command
        trio.command = lambda: command() + [f"+canary_argv={CANARIES['argv']}"]  # type: ignore[method-assign]
        with trio:
            row = trio.default_row()
            row["responses_create_params"]["input"][-1]["content"] += f" {CANARIES['prompt']}"
            status, raw = _post(f"{trio.run_url}?api_key={CANARIES['query']}", row)
            assert status == 200, raw[:500]
            result = json.loads(raw)
            assert result["reward"] == 1.0
            # the canaries really travelled: tool arguments, tool result and completion carry the city
            assert CANARIES["tool"] in json.dumps(result["response"]["output"])
            status, _ = _post(trio.url(MODEL) + "/v1/responses", {"input": 12345, "note": CANARIES["bad_body"]})
            assert status >= 400
            status, _ = _post(trio.url(AGENT) + "/run", {"responses_create_params": CANARIES["bad_body"]})
            assert status >= 400
    return trio


def test_no_canary_reaches_the_collector_with_every_group_on(tmp_path):
    with Collector(log_dir=tmp_path / "collector") as collector:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "GYM_AUTOINSTR_SPAN_GROUPS": "all",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        }
        _run_with_canaries(tmp_path, "gym", env)
        spans = collector.sink.spans()
        bodies = collector.sink.raw_bodies()
    assert {s["name"] for s in spans} >= {"POST /run", "POST", "POST /v1/responses", "POST /verify"}
    assert len(bodies) > 0 and collector.sink.metric_names()
    assert _leaks(bodies) == {}


def test_no_canary_reaches_the_local_files_of_the_embedded_default(tmp_path):
    trio = _run_with_canaries(tmp_path, "gym", {})
    runs = tmp_path / "gym" / "gym-autoinstr-runs"
    files = [f for f in runs.rglob("*") if f.is_file()]

    # spans and metrics of the three servers and the orchestrator (its start-up spans), each
    # process's note beside them; the segments gzipped at exit, read back as text
    def processes(suffix: str) -> set[str]:
        return {f.name.rsplit("-", 1)[0] for f in files if f.name.endswith(suffix)}

    assert len(processes(".metrics.jsonl.gz")) == 4 and processes(".jsonl.gz") == processes(".metrics.jsonl.gz")
    # (the facts files beside the segments too: gzipped with theirs, read back as text)
    blobs = [
        ("".join(segment_lines(f)) if f.suffix in (".jsonl", ".gz", ".facts") else f.read_text()).encode()
        for f in files
    ]
    assert sum(b.count(b"\n") for b in blobs) > 0
    assert _leaks(blobs) == {}
    assert trio.returncode == 0
