"""The OpenTelemetry contract: every private OpenTelemetry name is read through
``fastpath/contract.py``, every row resolves on the installed SDK, a fast part whose check
fails leaves its work to the stock SDK (once said, spans still right), and
``GYM_AUTOINSTR_FAST_PATH=off`` gives the stock SDK everywhere."""

from __future__ import annotations

import ast
import functools
import logging
import pathlib

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

import opentelemetry  # noqa: E402
from opentelemetry.sdk.trace import Tracer, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

from gym_autoinstr._log import forget_said  # noqa: E402
from gym_autoinstr.fastpath import batching, contract, histograms, lean, parts, samplers, w3c  # noqa: E402
from gym_autoinstr.setup import configurator, identity  # noqa: E402
from tests.harness.collector import OtlpSink  # noqa: E402

PACKAGE = pathlib.Path(contract.__file__).resolve().parent.parent

# -- the scan ------------------------------------------------------------------------------

# Private names of ours (or of Gym, Ray, aiohttp, asyncio) that OpenTelemetry also happens
# to define: (file under gym_autoinstr/, name) -> whose it is.
NOT_OPENTELEMETRY = {
    ("telemetry/sampling.py", "_tracer"): "our telemetry.spans module's global",
    ("setup/configurator.py", "_tracer"): "our telemetry.spans module's global",
    ("fastpath/batching.py", "_shutdown"): "our EncodingSpanProcessor's",
    ("advice/concurrency.py", "_value"): "asyncio.Semaphore's",
    ("advice/sandbox.py", "_handle"): "Gym's AsyncSandbox's",
    ("advice/sandbox.py", "_stopped"): "Gym's AsyncSandbox's",
    ("advice/pool.py", "_trace_configs"): "aiohttp.ClientSession's",
}
_IMPORTERS = {"import_module", "__import__", "find_spec", "load"}
ROW_MARK = "# contract row:"


@functools.cache
def opentelemetry_private_names() -> frozenset[str]:
    """Every private name the installed OpenTelemetry packages define (functions, classes,
    module globals, attributes they assign)."""
    names: set[str] = set()
    for root in map(pathlib.Path, opentelemetry.__path__):
        for path in root.rglob("*.py"):
            if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = node.name
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    name = node.attr
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    name = node.id
                else:
                    continue
                if name.startswith("_") and not name.startswith("__"):
                    names.add(name)
    return frozenset(names)


def _private_module(module: str) -> bool:
    parts_ = module.split(".")
    return parts_[0] == "opentelemetry" and any(p.startswith("_") for p in parts_)


def violations(source: str, where: str = "planted.py") -> list[str]:
    """Where ``source`` touches a private OpenTelemetry name itself: ``file:line: what``."""
    found = []
    private = opentelemetry_private_names()
    for number, line in enumerate(source.splitlines(), 1):
        if ROW_MARK in line:
            found.append(f"{where}:{number}: a '{ROW_MARK}' mark (route the name through contract.py)")
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "opentelemetry":
            named = [a.name for a in node.names if a.name.startswith("_")]
            if _private_module(node.module) or named:
                what = f"from {node.module} import {', '.join(named or [a.name for a in node.names])}"
        elif isinstance(node, ast.Import):
            named = [a.name for a in node.names if _private_module(a.name)]
            what = f"import {', '.join(named)}" if named else None
        elif isinstance(node, ast.Attribute) and node.attr in private:
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver not in ("self", "cls") and (where, node.attr) not in NOT_OPENTELEMETRY:
                what = f"attribute {node.attr}"
        elif isinstance(node, ast.Call) and node.args:
            function = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            first = node.args[0] if function in _IMPORTERS else node.args[1] if len(node.args) > 1 else None
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            if text is None:
                pass
            elif function in _IMPORTERS and _private_module(text):
                what = f"{function}({text!r})"
            elif function in ("getattr", "setattr", "hasattr", "delattr") and text in private:
                if (where, text) not in NOT_OPENTELEMETRY:
                    what = f"{function}(..., {text!r})"
        if what:
            found.append(f"{where}:{node.lineno}: {what}")
    return found


def test_only_the_contract_touches_private_opentelemetry_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative != "fastpath/contract.py":
            found += violations(path.read_text(encoding="utf-8"), relative)
    assert not found, "route these through gym_autoinstr/fastpath/contract.py:\n" + "\n".join(found)


def test_every_exception_to_the_scan_is_still_needed():
    for (where, name), whose in NOT_OPENTELEMETRY.items():
        source = (PACKAGE / where).read_text(encoding="utf-8")
        assert f".{name}" in source or f'"{name}"' in source, f"{where} no longer reads {name} ({whose})"
        assert name in opentelemetry_private_names(), f"{name} is no longer an OpenTelemetry name too"


@pytest.mark.parametrize(
    "planted",
    [
        "from opentelemetry.trace.propagation import _SPAN_KEY",
        "from opentelemetry.sdk._logs import LoggerProvider",
        "import opentelemetry.sdk._configuration",
        "scope = tracer._instrumentation_scope",
        "limits = getattr(tracer, '_span_limits', None)",
        "provider._resource = resource",
        "module = importlib.import_module('opentelemetry.exporter.otlp.proto.common._log_encoder')",
        "key = something  # contract row: _SUPPRESS_INSTRUMENTATION_KEY",
    ],
)
def test_the_scan_finds_a_planted_private_name(planted):
    assert violations(f"x = 1\n{planted}\n", "telemetry/spans.py") != []


def test_the_scan_lets_public_names_and_our_own_privates_be():
    clean = (
        "from opentelemetry.trace import SpanKind\n"
        "from gym_autoinstr.fastpath.contract import SPAN_KEY as _SPAN_KEY\n"
        "self._resource = 1\n"
        "getattr(provider, contract.PROVIDER_RESOURCE, None)\n"
    )
    assert violations(clean, "telemetry/spans.py") == []


# -- the rows ------------------------------------------------------------------------------


def test_every_row_resolves_on_the_installed_sdk():
    import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401 (its row is checked when loaded)

    unresolved = [
        f"{row.part}: {row.name} ({row.owner})"
        for row in contract.ROWS
        if not row.optional and not contract.row_resolves(row)  # optional: absent on some supported versions
    ]
    assert not unresolved
    assert contract.CLEAN_ATTRIBUTE_VALUE is not None or contract.CLEAN_ATTRIBUTE is not None
    # (the wire encoder reads no private name: its check is its probe alone)
    others = {contract.SETUP, contract.LOGS, contract.INSTRUMENTATION}
    assert {row.part for row in contract.ROWS} == {*contract.FAST_PARTS, *others} - {contract.WIRE}
    for part in contract.FAST_PARTS:
        assert contract.missing(part) == []


def test_a_row_whose_name_is_gone_is_reported_missing(monkeypatch):
    gone = contract.Row(
        "_gone", "opentelemetry.sdk.trace.Tracer", contract.LEAN, "attribute", lambda: hasattr(1, "_gone")
    )
    monkeypatch.setattr(contract, "ROWS", (*contract.ROWS, gone))
    assert contract.missing(contract.LEAN) == ["_gone"]
    assert contract.missing(contract.WIRE) == []


# -- the parts, through the pipeline the configurator builds ----------------------------------


@pytest.fixture
def fresh(monkeypatch):
    """Every part decided anew, every once-only message said again."""
    parts.reset()
    forget_said()
    monkeypatch.delenv("GYM_AUTOINSTR_FAST_PATH", raising=False)
    yield
    parts.reset()
    forget_said()


@pytest.fixture
def sink(monkeypatch):
    with OtlpSink() as running:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{running.url}/v1/traces")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        yield running


def _our_tracer(provider: TracerProvider):
    sdk_tracer = provider.get_tracer("gym_autoinstr", "1.0")
    return lean.lean_tracer_for(provider, sdk_tracer) or sdk_tracer


def _trace_through(provider: TracerProvider, sink: OtlpSink) -> list[dict]:
    """Two spans of ours (a parent and its child), exported; what arrived, without ids and times."""
    tracer = _our_tracer(provider)
    with tracer.start_as_current_span("gym.rollout", attributes={"nemo.gym.rollout.id": "r-1", "n": 3}) as parent:
        child = tracer.start_span("HTTP POST", kind=SpanKind.CLIENT, attributes={"http.request.method": "POST"})
        child.set_attribute("http.response.status_code", 200)
        child.end()
    assert provider.force_flush()
    assert sink.wait_for(lambda spans: len(spans) >= 2, timeout=10)
    provider.shutdown()
    got = sorted(sink.spans(), key=lambda s: s["name"])
    trace_id = f"{parent.get_span_context().trace_id:032x}"
    assert [s["trace_id"] for s in got] == [trace_id, trace_id]
    assert got[0]["parent_span_id"] == f"{parent.get_span_context().span_id:016x}"
    return [
        {k: v for k, v in s.items() if k not in ("trace_id", "span_id", "parent_span_id", "start_ns", "end_ns")}
        for s in got
    ]


EXPECTED = [
    {
        "name": "HTTP POST",
        "kind": "CLIENT",
        "attributes": {"http.request.method": "POST", "http.response.status_code": 200},
        "scope": "gym_autoinstr",
        "status": "UNSET",
        "status_message": "",
        "events": [],
        "event_attributes": [],
        "links": [],
    },
    {
        "name": "gym.rollout",
        "kind": "INTERNAL",
        "attributes": {"nemo.gym.rollout.id": "r-1", "n": 3},
        "scope": "gym_autoinstr",
        "status": "UNSET",
        "status_message": "",
        "events": [],
        "event_attributes": [],
        "links": [],
    },
]


def _without_resource(spans: list[dict]) -> list[dict]:
    for span in spans:
        assert span.pop("resource")["nemo.gym.server.name"] == "my_agent"
    return spans


def _build() -> TracerProvider:
    return configurator.build_tracer_provider(identity.ProcessIdentity("server", "my_agent"))


def _processors(provider: TracerProvider) -> tuple:
    return lean.processors_of(provider)


def _fast_path_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "fast path part" in r.getMessage()]


def test_every_part_is_on_and_used_on_the_installed_sdk(fresh, sink, caplog):
    provider = _build()
    assert all(status.on for status in parts.check().values()), parts.check()
    assert [type(p) for p in _processors(provider)] == [batching.EncodingSpanProcessor]
    assert type(_our_tracer(provider)) is lean.LeanTracer
    assert _without_resource(_trace_through(provider, sink)) == EXPECTED
    assert _fast_path_warnings(caplog) == []


def test_a_missing_row_gives_the_stock_processor_with_one_warning(fresh, sink, monkeypatch, caplog):
    gone = contract.Row(
        "_gone_encoder", "opentelemetry.exporter.otlp", contract.ENCODE_ON_END, "attribute", lambda: False
    )
    monkeypatch.setattr(contract, "ROWS", (*contract.ROWS, gone))
    with caplog.at_level(logging.WARNING, logger="gym_autoinstr"):
        provider = _build()
        parts.check()  # decided once: asking again says nothing more
        _build().shutdown()
    said = _fast_path_warnings(caplog)
    assert len(said) == 1
    assert "encode_on_end" in said[0] and "_gone_encoder" in said[0] and "opentelemetry-sdk " in said[0]
    assert parts.check()[contract.ENCODE_ON_END].on is False
    assert parts.check()[contract.LEAN].reason == "needs encode_on_end, which is off"
    (processor,) = _processors(provider)
    assert type(processor) is BatchSpanProcessor
    assert type(_our_tracer(provider)) is Tracer  # the SDK's spans (lean spans need our processor)
    assert _without_resource(_trace_through(provider, sink)) == EXPECTED


def test_a_failing_probe_leaves_that_part_alone_to_the_sdk(fresh, sink, monkeypatch, caplog):
    monkeypatch.setitem(parts.PROBES, contract.LEAN, lambda: "a planted difference")
    with caplog.at_level(logging.WARNING, logger="gym_autoinstr"):
        provider = _build()
    said = _fast_path_warnings(caplog)
    assert len(said) == 1 and "lean_spans" in said[0] and "a planted difference" in said[0]
    assert [type(p) for p in _processors(provider)] == [batching.EncodingSpanProcessor]  # still encoded on end
    assert type(_our_tracer(provider)) is Tracer
    assert _without_resource(_trace_through(provider, sink)) == EXPECTED


def test_a_probe_that_raises_counts_as_failed(fresh, monkeypatch, caplog):
    def broken():
        raise AttributeError("'Tracer' object has no attribute '_sampler'")

    monkeypatch.setitem(parts.PROBES, contract.SAMPLERS, broken)
    with caplog.at_level(logging.WARNING, logger="gym_autoinstr"):
        status = parts.check()
    assert status[contract.SAMPLERS].on is False and "_sampler" in status[contract.SAMPLERS].reason
    assert len(_fast_path_warnings(caplog)) == 1
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    assert samplers.root_decision(ParentBased(TraceIdRatioBased(0.5))) is None  # the sampler is asked


def test_a_failing_histogram_probe_gives_the_sdks_histograms(fresh, monkeypatch):
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    assert parts.check(everything=True)[contract.HISTOGRAMS].on
    assert histograms.qualifies(ConsoleMetricExporter()) is True
    parts.reset()
    monkeypatch.setitem(parts.PROBES, contract.HISTOGRAMS, lambda: "a planted difference")
    assert parts.check(everything=True)[contract.HISTOGRAMS].on is False
    assert histograms.qualifies(ConsoleMetricExporter()) is False  # the configurator leaves its exporter as it is


def test_fast_path_off_exports_the_same_trace_through_stock_sdk_classes(fresh, sink, monkeypatch, caplog):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("GYM_AUTOINSTR_FAST_PATH", "off")
    with caplog.at_level(logging.WARNING, logger="gym_autoinstr"):
        provider = _build()
    assert _fast_path_warnings(caplog) == []  # off by choice: nothing to warn about
    status = parts.check()
    assert all(not s.on and s.reason == "GYM_AUTOINSTR_FAST_PATH is off" for s in status.values())
    (processor,) = _processors(provider)
    assert type(processor) is BatchSpanProcessor
    assert type(processor.span_exporter._exporter) is OTLPSpanExporter  # (behind flush.py's WatchedExporter)
    assert type(_our_tracer(provider)) is Tracer
    assert w3c.w3c_default() is False
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    assert samplers.root_decision(ParentBased(TraceIdRatioBased(0.5))) is None
    assert _without_resource(_trace_through(provider, sink)) == EXPECTED


def test_a_bad_switch_value_is_named_and_the_default_kept(fresh, monkeypatch, caplog):
    from gym_autoinstr import settings

    monkeypatch.setenv("GYM_AUTOINSTR_FAST_PATH", "sometimes")
    with caplog.at_level(logging.WARNING, logger="gym_autoinstr"):
        assert settings.FAST_PATH.read() is True
    assert "GYM_AUTOINSTR_FAST_PATH" in caplog.text and "'sometimes'" in caplog.text and "false" in caplog.text


# -- the doctor ----------------------------------------------------------------------------


def test_the_doctor_shows_each_part_and_why_one_is_off(fresh, monkeypatch, capsys):
    import json

    from gym_autoinstr.commands import doctor
    from gym_autoinstr.commands.doctor.fast_path import fast_path

    monkeypatch.setitem(parts.PROBES, contract.WIRE, lambda: "a planted difference")
    section, problems = fast_path({})
    by_name = {row["name"]: row for row in section["parts"]}
    assert set(by_name) == set(contract.FAST_PARTS) and section["switch"] is True
    assert by_name["wire_encoder"]["on"] is False and by_name["wire_encoder"]["reason"] == "a planted difference"
    assert by_name["encode_on_end"]["reason"] == "needs wire_encoder, which is off"
    assert by_name["histograms"]["on"] is True and "_preferred_temporality" in by_name["histograms"]["rows"]
    assert [p.subject for p in problems] == ["fast path"] and "wire_encoder" in problems[0].problem

    diagnosis = {"fast_path": section}
    assert json.loads(json.dumps(diagnosis))["fast_path"]["parts"][2]["name"] == "wire_encoder"
    # the text: --verbose draws one line per part (the default, one line for the section)
    text = doctor.render({**_EMPTY_DIAGNOSIS, "fast_path": section}, verbose=True)
    assert "fast path     on  (GYM_AUTOINSTR_FAST_PATH)" in text
    assert "  wire_encoder     off: a planted difference" in text
    assert "  lean_spans       off: needs wire_encoder, encode_on_end, which are off" in text
    assert "  samplers         on" in text

    off, problems = fast_path({"GYM_AUTOINSTR_FAST_PATH": "false"})
    assert off["switch"] is False and problems == []
    assert {row["reason"] for row in off["parts"]} == {"GYM_AUTOINSTR_FAST_PATH is off"}


def test_the_doctors_json_has_the_fast_path(fresh, capsys):
    import json

    from gym_autoinstr.commands import doctor

    doctor.main(as_json=True, offline=True)
    diagnosis = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in diagnosis["fast_path"]["parts"]] == list(contract.FAST_PARTS)
    assert all(row["on"] for row in diagnosis["fast_path"]["parts"])


_EMPTY_DIAGNOSIS = {
    "gym": {"version": None, "known": False, "known_range": ""},
    "gym_autoinstr": "0",
    "python": "3",
    "pointcuts": [],
    "startup": {
        "distro": {"selected": None, "installed": []},
        "configurator": {"selected": None, "installed": []},
        "instrumentors": {"enabled": []},
    },
    "exporters": [],
    "span_groups": {"variable": None, "enabled": []},
    "native_telemetry": {"live": False, "present": False},
    "server_venvs": {"will_install": False, "requirements": []},
    "ray": {},
    "problems": [],
    "ok": True,
}
