"""Start and stop one sandbox through Gym's real OpenSandbox provider (``AsyncSandbox``),
against the OpenSandbox API at ``127.0.0.1:$SANDBOX_API_PORT``, with
``$SANDBOX_CREATE_RETRIES`` retries.  Run under ``opentelemetry-instrument`` by
``tests/advice/test_realgym_sandbox.py``; prints one JSON line with what Gym returned.
Settings come from the environment: Gym reads the command line as Hydra overrides."""

from __future__ import annotations

import asyncio
import json
import os


async def main(port: int, retries: int) -> dict:
    from nemo_gym.sandbox.api import AsyncSandbox
    from nemo_gym.sandbox.providers import SandboxSpec

    provider = {
        "opensandbox": {
            "connection": {"domain": f"127.0.0.1:{port}", "protocol": "http", "api_key": "unused"},
            "create": {"retries": retries, "retry_delay_s": 0.01, "retry_max_delay_s": 0.05,
                       "skip_health_check": True},
            "probe": {"command": None},  # no post-create command: this API runs none
        }
    }
    sandbox = AsyncSandbox(provider, spec=SandboxSpec(image="python:3.12-slim"))
    try:
        await sandbox.start()
        started = sandbox._handle.sandbox_id if sandbox._handle is not None else None
        error = None
    except Exception as failure:  # what Gym raises, reported to the test
        started, error = None, f"{type(failure).__name__}: {failure}"
    finally:
        try:
            await sandbox.stop()
        except Exception:
            pass
    return {"sandbox_id": started, "error": error}


if __name__ == "__main__":
    port, retries = int(os.environ["SANDBOX_API_PORT"]), int(os.environ["SANDBOX_CREATE_RETRIES"])
    print(json.dumps(asyncio.run(main(port, retries))), flush=True)
