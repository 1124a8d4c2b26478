"""The process-wide patches (``pointcuts.PROCESS_PATCHES``): every row's target exists in
the installed libraries, every patch the code applies is a row, and ``uninstrument()``
puts each original back by identity.  The lifecycle cases run in fresh interpreters, as
``test_patch_lifecycle.py``'s do: these patches are process-wide."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from gym_autoinstr.patching import resolve_process_target
from gym_autoinstr.pointcuts import POINTCUTS, PROCESS_PATCHES

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "gym_autoinstr"


def test_every_row_resolves_in_the_installed_libraries():
    """The runner venv has every library the rows name (both OTLP exporters, aiohttp, Ray)."""
    found = {}
    for row in PROCESS_PATCHES:
        try:
            found[row.name] = resolve_process_target(row) is not None
        except Exception as error:
            found[row.name] = repr(error)
    assert found == {row.name: True for row in PROCESS_PATCHES}


def test_a_row_whose_target_is_gone_does_not_resolve():
    from dataclasses import replace

    row = next(r for r in PROCESS_PATCHES if r.name == "aiohttp.session_request")
    with pytest.raises(LookupError):
        resolve_process_target(replace(row, attribute="ClientSession._no_such_method"))
    with pytest.raises(LookupError):
        resolve_process_target(replace(row, attribute="NoSuchSession._request"))


def test_rows_are_well_formed():
    names = [row.name for row in PROCESS_PATCHES]
    assert len(names) == len(set(names))
    pointcut_names = {p.name for p in POINTCUTS}
    for row in PROCESS_PATCHES:
        assert row.scope in ("process", "instances"), row.name
        assert row.pointcut is None or row.pointcut in pointcut_names, row.name
        assert row.reversible or row.pointcut, f"{row.name}: an irreversible patch outside a pointcut"
        assert all((row.replaced_by, row.purpose, row.applied_by, row.when, row.restore)), row.name


def test_every_patch_the_code_applies_is_a_row_and_every_row_is_applied_somewhere():
    sources = {path: path.read_text() for path in PACKAGE.rglob("*.py") if path.name != "pointcuts.py"}
    code = "\n".join(sources.values())
    used = set(re.findall(r"_footprint\.(?:apply|record)\(\s*\"([^\"]+)\"", code))
    rows = {row.name for row in PROCESS_PATCHES}
    assert used and used <= rows, used - rows
    for row in PROCESS_PATCHES:
        if row.pointcut is None:
            assert f'"{row.name}"' in code, f"{row.name}: no code applies this row"
    # Replacing another object's attribute goes through _footprint (or a pointcut), not by hand
    # (a frozen dataclass of ours setting its own fields is not that).
    by_hand = {
        str(path.relative_to(PACKAGE)): line.strip()
        for path, text in sources.items()
        for line in text.splitlines()
        if re.search(r"object\.__setattr__\((?!self\b)|\.encode_spans = ", line) and path.name != "_footprint.py"
    }
    assert by_hand == {}


PRELUDE = textwrap.dedent(
    """
    import asyncio, json, os, sys, tempfile
    os.chdir(tempfile.mkdtemp())
    from gym_autoinstr.instrumentor import GymInstrumentor
    from gym_autoinstr import patching

    def footprint():
        return patching.applied_process_patches()
    """
)


def run_case(body: str, **env: str) -> dict:
    code = PRELUDE + textwrap.dedent(body)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))}
    environ["NEMO_GYM_CONFIG_DICT"] = "{}"
    environ.update(env)
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


GYM_SESSION = """
    import aiohttp
    import nemo_gym.server_utils as su
    from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from gym_autoinstr.telemetry import metrics

    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    assert metrics.activate()  # pool metrics are attached only where metrics are live

    def gym_session():
        async def make():
            return su.set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
        loop = asyncio.new_event_loop()
        return loop, loop.run_until_complete(make())
"""


@pytest.mark.parametrize("hooks", ["on", "off"])
def test_uninstrument_restores_the_aiohttp_hooks_by_identity(hooks):
    pytest.importorskip("nemo_gym")
    out = run_case(
        textwrap.dedent(GYM_SESSION)
        + textwrap.dedent("""
        instrumentor = GymInstrumentor()
        instrumentor.instrument()
        loop, session = gym_session()
        connector = session.connector
        configs = session._trace_configs
        before_configs = list(configs)
        names = ("_request", "request")
        hooked = {
            "session": sorted(n for n in names if n in vars(session)),
            "connector": sorted(
                n for n in ("_wait_for_available_connection", "_create_connection") if n in vars(connector)
            ),
            "trace_configs": len(configs),
            "footprint": footprint(),
        }
        instrumentor.uninstrument()
        restored = {
            "session": sorted(n for n in names if n in vars(session)),
            "connector": sorted(
                n for n in ("_wait_for_available_connection", "_create_connection") if n in vars(connector)
            ),
            "class_methods": session._request.__func__ is aiohttp.ClientSession._request
            and session.request.__func__ is aiohttp.ClientSession.request
            and connector._create_connection.__func__ is type(connector)._create_connection
            and connector._wait_for_available_connection.__func__ is type(connector)._wait_for_available_connection,
            "trace_configs": session._trace_configs is configs and len(configs),
            "footprint": footprint(),
        }
        loop.run_until_complete(session.close())
        print(json.dumps({"hooked": hooked, "restored": restored, "before_configs": len(before_configs)}))
        """),
        **({"GYM_AUTOINSTR_AIOHTTP_HOOKS": "0"} if hooks == "off" else {}),
    )
    if hooks == "on":
        assert out["hooked"] == {
            "session": ["_request", "request"],
            "connector": ["_create_connection", "_wait_for_available_connection"],
            "trace_configs": 0,
            "footprint": {
                "aiohttp.session_attempts": 1,
                "aiohttp.session_request": 1,
                "aiohttp.connector_wait": 1,
                "aiohttp.connector_create": 1,
            },
        }
    else:
        assert out["hooked"] == {
            "session": ["request"],
            "connector": [],
            "trace_configs": 1,
            "footprint": {"aiohttp.session_attempts": 1, "aiohttp.trace_config": 1},
        }
    assert out["restored"] == {
        "session": [],
        "connector": [],
        "class_methods": True,
        "trace_configs": 0,
        "footprint": {},
    }


def test_uninstrument_restores_the_semaphore_classes_and_wrap_future():
    pytest.importorskip("ray")
    out = run_case(
        """
        from opentelemetry import metrics as otel_metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from gym_autoinstr.advice import concurrency
        from gym_autoinstr.telemetry import metrics

        otel_metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        assert metrics.activate()
        original_wrap_future = vars(asyncio)["wrap_future"]
        import ray._raylet  # noqa: F401

        class Server:
            pass

        server = Server()
        server.plain, server.bounded = asyncio.Semaphore(2), asyncio.BoundedSemaphore(3)
        instrumentor = GymInstrumentor()
        instrumentor.instrument()
        found = concurrency.watch_server(server, "a_server")
        later = asyncio.Semaphore(1)  # made after the server was found: swapped at a collection
        server.later = later
        concurrency._state.rescanned = 0.0
        concurrency._rescan()
        applied = {
            "found": found,
            "classes": [type(s) is not b for s, b in ((server.plain, asyncio.Semaphore),
                        (server.bounded, asyncio.BoundedSemaphore), (later, asyncio.Semaphore))],
            "wrap_future": vars(asyncio)["wrap_future"] is not original_wrap_future,
            "footprint": footprint(),
        }
        instrumentor.uninstrument()
        concurrency._state.rescanned = 0.0
        concurrency._rescan()  # no server is looked at any more
        third = asyncio.Semaphore(1)
        server.third = third
        concurrency._rescan()
        restored = {
            "classes": [type(server.plain) is asyncio.Semaphore, type(server.bounded) is asyncio.BoundedSemaphore,
                        type(later) is asyncio.Semaphore, type(third) is asyncio.Semaphore],
            "site_attributes": [concurrency._ATTRIBUTES in vars(s) for s in (server.plain, server.bounded, later)],
            "wrap_future": vars(asyncio)["wrap_future"] is original_wrap_future,
            "footprint": footprint(),
        }
        print(json.dumps({"applied": applied, "restored": restored}))
        """
    )
    assert out["applied"] == {
        "found": 2,
        "classes": [True, True, True],
        "wrap_future": True,
        "footprint": {"asyncio.semaphore_class": 1},
    }
    assert out["restored"] == {
        "classes": [True] * 4,
        "site_attributes": [False] * 3,
        "wrap_future": True,
        "footprint": {},
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_uninstrument_restores_encode_spans_once_our_processor_is_done(protocol):
    out = run_case(
        f"""
        import importlib
        from gym_autoinstr.fastpath import batching
        module = importlib.import_module("opentelemetry.exporter.otlp.proto.{protocol}.trace_exporter")
        original = vars(module)["encode_spans"]
        settings = dict(max_queue_size=64, schedule_delay_millis=60_000, max_export_batch_size=16)
        instrumentor = GymInstrumentor()
        instrumentor.instrument()

        def processor():
            exporter = module.OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
            made = batching.make_processor(exporter, lambda e: e, **settings)
            assert isinstance(made, batching.EncodingSpanProcessor), made
            return made

        first = processor()
        hooked = vars(module)["encode_spans"]
        second = processor()  # one hook per module, whatever the number of processors
        states = {{"hooked": hooked is not original and vars(module)["encode_spans"] is hooked,
                   "hook_wraps_original": hooked.__wrapped__ is original,
                   "footprint": footprint()}}
        first.shutdown()
        instrumentor.uninstrument()  # `second` still exports through the hook: kept until it is done
        states["while_exporting"] = vars(module)["encode_spans"] is hooked
        states["pending_footprint"] = footprint()
        second.shutdown()
        states["after_shutdown"] = vars(module)["encode_spans"] is original
        states["footprint_after"] = footprint()
        # With no processor of ours left, uninstrument restores it at once; a later pipeline hooks again.
        instrumentor.instrument()
        third = processor()
        states["hooked_again"] = vars(module)["encode_spans"] is not original
        third.shutdown()
        instrumentor.uninstrument()
        states["restored_at_once"] = vars(module)["encode_spans"] is original
        print(json.dumps(states))
        """
    )
    name = f"otlp.{protocol}.encode_spans"
    assert out == {
        "hooked": True,
        "hook_wraps_original": True,
        "footprint": {name: 1},
        "while_exporting": True,
        "pending_footprint": {name: 1},
        "after_shutdown": True,
        "footprint_after": {},
        "hooked_again": True,
        "restored_at_once": True,
    }
