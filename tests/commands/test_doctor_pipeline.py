"""``gym-autoinstr doctor`` checks the live pipeline: can a span arrive at the endpoint.

Against real things only: a real collector (rotel) on its OTLP/HTTP and gRPC ports (the
right and the wrong protocol for each), a refused port, a host name that cannot resolve
(``.invalid``), a small HTTP server of our own answering 401/403/404, https to a plain
port, and the endpoint spellings users write.  Most cases call the doctor's pipeline
question in-process (the network is real); the command itself runs in a fresh
interpreter for the exit code and the text.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from gym_autoinstr.commands.doctor.endpoint import resolve
from gym_autoinstr.commands.doctor.pipeline import EMPTY_EXPORT, pipeline
from tests.harness.collector import Collector, free_port
from tests.harness.gym_targets import clean_environment

HTTP_ROW = {"name": "otlp", "protocol": "http/protobuf", "used": "http/protobuf"}
GRPC_ROW = {"name": "otlp", "protocol": "grpc", "used": "grpc"}


@pytest.fixture(scope="module")
def rotel(tmp_path_factory):
    with Collector(log_dir=tmp_path_factory.mktemp("collector")) as running:
        yield running


class _Answering:
    """A real HTTP server that answers every POST with ``status`` and records what it got."""

    def __init__(self, status: int) -> None:
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def answering():
    servers = []

    def start(status: int) -> _Answering:
        servers.append(_Answering(status))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def check(env: dict, row=HTTP_ROW):
    section, problems = pipeline(env, [row])
    return section, [p for p in problems]


def errors(problems):
    return [p for p in problems if p.severity == "error"]


def the_error(problems):
    (error,) = errors(problems)
    return error


# -- spans can arrive -------------------------------------------------------------------


def test_the_collector_http_port_accepts_an_empty_export(rotel):
    before = len(rotel.sink.requests())
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint})
    assert not errors(problems), problems
    (target,) = section["targets"]
    assert target["accepted"] and target["status"] == 200
    assert target["url"] == rotel.http_endpoint + "/v1/traces" and target["variable"] == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert target["steps"] == ["resolve: ok", "connect: ok", "export: 200"]
    # nothing of the probe is forwarded as a span: it exported none
    assert not [s for s in rotel.sink.spans() if s["resource"].get("service.name", "").startswith("gym-autoinstr")]
    assert all(r["path"] == "/v1/traces" for r in rotel.sink.requests()[before:])


def test_the_collector_grpc_port_accepts_an_empty_export(rotel):
    section, problems = check(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.grpc_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, GRPC_ROW
    )
    assert not errors(problems), problems
    (target,) = section["targets"]
    assert target["accepted"] and target["status"] == "OK" and target["tls"] is False


def test_a_trailing_slash_on_the_generic_endpoint_is_harmless(rotel):
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint + "/"})
    assert not errors(problems)
    assert section["targets"][0]["url"] == rotel.http_endpoint + "/v1/traces"


def test_the_signal_specific_endpoint_is_used_as_is_and_wins(rotel):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # would be refused
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rotel.http_endpoint + "/v1/traces",
    }
    section, problems = check(env)
    assert not errors(problems), problems
    (target,) = section["targets"]
    assert (
        target["variable"] == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        and target["url"] == rotel.http_endpoint + "/v1/traces"
    )


def test_an_ipv6_literal_is_parsed_when_bracketed(rotel):
    (target,) = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://[::1]:{rotel.http_port}"})[0]["targets"]
    assert target["host"] == "::1" and target["port"] == rotel.http_port


def test_an_ipv6_literal_is_connected_to_not_misread(rotel):
    ipv6 = socket.socket(socket.AF_INET6)
    try:
        ipv6.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")  # (the parsing: the test above, run anyway)
    finally:
        ipv6.close()
    # rotel listens on 127.0.0.1 only: [::1] must be resolved and refused, not misread
    port = rotel.http_port
    problem = the_error(check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://[::1]:{port}"})[1]).problem
    assert "[::1]:" + str(port) in problem and "connection refused" in problem


HINT = " (a port is 1-65535; an IPv6 address must be in brackets: http://[::1]:4318)"


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("http://::1:4318", "Port could not be cast to integer value as ':1:4318'" + HINT),
        ("http://[::1:4318", "Invalid IPv6 URL" + HINT),
        ("http://127.0.0.1:99999", "Port out of range 0-65535" + HINT),
        ("localhost:4318", "it names no host (no scheme: http://localhost:4318?)"),
        ("http://", "it names no host"),  # not the host "v1" of http://v1/traces
    ],
)
def test_an_endpoint_that_is_no_url_is_named(endpoint, why):
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    error = the_error(problems)
    assert error.problem == f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint!r} cannot be used: {why}"
    assert error.fix == "set OTEL_EXPORTER_OTLP_ENDPOINT=http://<host>:4318" and "steps" not in section["targets"][0]


@pytest.mark.parametrize("endpoint", ["http://user:s3cret@127.0.0.1:notaport", "user:s3cret@collector:4318"])
def test_credentials_in_an_endpoint_that_is_no_url_are_not_echoed(endpoint):
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    shown = json.dumps([section, [(p.problem, p.fix) for p in problems]], default=str)
    assert "cannot be used" in the_error(problems).problem and "user" not in shown and "s3cret" not in shown


# -- spans cannot arrive: each cause named, with its fix ----------------------------------


def test_a_refused_port_is_named():
    port = free_port()
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
    error = the_error(problems)
    assert error.problem == f"nothing listens at 127.0.0.1:{port}: connection refused"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in error.fix and "4318" in error.fix
    assert section["targets"][0]["accepted"] is False and section["targets"][0]["steps"][-1] == "connect: refused"


def test_an_unresolvable_host_is_named():
    _, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.invalid:4318"})
    error = the_error(problems)
    assert "'collector.invalid' does not resolve" in error.problem
    assert error.fix == "check the host in OTEL_EXPORTER_OTLP_ENDPOINT"


def test_http_protobuf_to_the_grpc_port_names_the_protocol_and_port(rotel):
    _, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.grpc_endpoint})
    error = the_error(problems)
    assert (
        error.problem
        == f"127.0.0.1:{rotel.grpc_port} speaks HTTP/2 only, as a gRPC receiver does, and OTLP is set to http/protobuf"
    )
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in error.fix and "4318" in error.fix


def test_grpc_to_the_http_port_names_the_protocol_and_port(rotel):
    _, problems = check(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, GRPC_ROW
    )
    error = the_error(problems)
    assert (
        error.problem
        == f"127.0.0.1:{rotel.http_port} answers HTTP/1.1, as an OTLP/HTTP receiver does, and OTLP is set to grpc"
    )
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in error.fix and "4317" in error.fix


def test_https_to_a_plain_port_is_a_tls_mismatch(rotel):
    _, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rotel.http_port}"})
    error = the_error(problems)
    assert "TLS handshake" in error.problem and "plain text" in error.problem
    assert error.fix == f"use http://127.0.0.1:{rotel.http_port} (plain text)"


def test_grpc_over_tls_to_a_plain_port_is_a_tls_mismatch(rotel):
    _, problems = check(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rotel.grpc_port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        GRPC_ROW,
    )
    error = the_error(problems)
    assert "TLS handshake" in error.problem and "OTEL_EXPORTER_OTLP_INSECURE=true" in error.fix


@pytest.mark.parametrize("status,word", [(401, "unauthenticated"), (403, "forbidden")])
def test_a_refused_credential_names_the_header_variable_never_its_value(answering, status, word):
    server = answering(status)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.port}",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20canary-secret-42,x-team=rl",
    }
    section, problems = check(env)
    error = the_error(problems)
    assert f"{status} ({word})" in error.problem and "headers sent: authorization, x-team" in error.problem
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS" in error.fix
    assert "canary-secret-42" not in json.dumps(section) + repr(problems)
    # what was sent: the decoded header, and an empty export, to the traces path
    (request,) = server.requests
    assert request["path"] == "/v1/traces" and request["body"] == EMPTY_EXPORT
    assert request["headers"]["authorization"] == "Bearer canary-secret-42"
    assert request["headers"]["content-type"] == "application/x-protobuf"


def test_a_signal_specific_endpoint_without_its_path_is_named(answering):
    server = answering(404)
    _, problems = check({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{server.port}"})
    (warning,) = [p for p in problems if p.severity == "warning"]
    assert "used as-is and has no path" in warning.problem
    error = the_error(problems)
    assert "no OTLP trace receiver at" in error.problem and "ending in /v1/traces" in error.fix
    assert server.requests[0]["path"] == "/"


def test_a_generic_endpoint_ending_in_the_traces_path_is_named_before_sending(answering):
    server = answering(200)
    _, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.port}/v1/traces"})
    error = the_error(problems)
    assert "/v1/traces/v1/traces" in error.problem and "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in error.fix
    assert not server.requests


def test_a_generic_endpoint_with_a_prefix_path_keeps_it(answering):
    server = answering(200)
    section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.port}/otlp/"})
    assert not errors(problems)
    assert [r["path"] for r in server.requests] == ["/otlp/v1/traces"]


def test_a_grpc_scheme_is_named_for_http_and_means_tls_for_grpc(rotel):
    _, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"grpc://127.0.0.1:{rotel.grpc_port}"})
    error = the_error(problems)
    assert "grpc:// is no URL scheme" in error.problem and "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in error.problem
    section, problems = check(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"grpc://127.0.0.1:{rotel.grpc_port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        GRPC_ROW,
    )
    assert section["targets"][0]["tls"] is True  # as the SDK's gRPC exporter does
    assert any("connects with TLS" in p.problem for p in problems if p.severity == "info")
    assert "TLS handshake" in the_error(problems).problem
    # the same with the insecure switch: accepted
    section, problems = check(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"grpc://127.0.0.1:{rotel.grpc_port}", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        GRPC_ROW,
    )
    assert not errors(problems) and section["targets"][0]["accepted"]


def test_headers_with_odd_encodings_are_named_without_their_values(rotel):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "novalue,ok=1,tok=s%C3%A9cret-canary",
    }
    section, problems = check(env)
    (warning,) = [p for p in problems if p.severity == "warning"]
    assert "entry 1 is not name=value" in warning.problem and "'tok' is not printable ASCII" in warning.problem
    assert "canary" not in warning.problem + warning.fix
    assert section["targets"][0]["headers"] == ["ok"] and section["targets"][0]["accepted"]


def test_a_port_that_accepts_but_never_answers_ends_at_the_doctors_own_timeout():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
    try:
        section, problems = check({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"})
    finally:
        silent.close()
    assert section["targets"][0]["steps"] == ["resolve: ok", "connect: ok", "export: timeout"]
    assert "did not answer the export in time" in the_error(problems).problem


def test_resolution_matches_the_sdk_exporters(monkeypatch):
    """Our endpoint resolution against the installed SDK exporters' own (same environment)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    cases = [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c/prefix"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://d:2/x"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4317"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://c:4317"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"},
        {},
    ]
    for env in cases:
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_INSECURE",
        ):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        http = HttpExporter()
        assert resolve(env, "http/protobuf")["url"] == http._endpoint, env
        grpc_exporter = GrpcExporter()
        ours = resolve(env, "grpc")
        if hasattr(grpc_exporter, "_insecure"):
            their_tls = not grpc_exporter._insecure
        else:  # older SDKs (1.39) keep no flag: credentials are made for a secure channel only
            their_tls = hasattr(grpc_exporter, "_credentials")
        assert ours["tls"] is their_tls, env
        # the SDK hands gRPC "host[:port]"; without a port gRPC dials 443
        theirs = urlsplit("//" + grpc_exporter._endpoint)
        assert (ours["host"], ours["port"]) == (theirs.hostname, theirs.port or 443), env
        http.shutdown()
        grpc_exporter.shutdown()


# -- the command ----------------------------------------------------------------------


def doctor(tmp_path, env, *extra):
    code = "import sys\nfrom gym_autoinstr.commands.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    workdir = tmp_path / "cwd"
    workdir.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", code, "doctor", *extra],
        cwd=workdir,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_command_exits_non_zero_when_spans_cannot_arrive_and_offline_skips(tmp_path):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"}
    result = doctor(tmp_path, env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "pipeline      http/protobuf to http://127.0.0.1:" in result.stdout
        and "spans could NOT arrive" in result.stdout
    )
    assert "WARNING: exporter: OTEL_EXPORTER_OTLP_PROTOCOL='bogus' is not an OTLP protocol" in result.stdout
    assert "ERROR: pipeline: nothing listens at" in result.stdout
    first = result.stdout.splitlines()[0]
    assert first.startswith("tracing would NOT work: ") and "WARNING" not in first
    assert result.stdout.index("ERROR: pipeline: nothing listens at") < result.stdout.index("WARNING: exporter:")
    offline = doctor(tmp_path, env, "--offline", "--json")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    report = json.loads(offline.stdout)
    assert report["pipeline"] == {"checked": False, "skipped": "--offline", "targets": []}
    assert [p["subject"] for p in report["problems"] if p["severity"] == "warning"] == ["exporter"]


def test_the_command_passes_against_a_real_collector(tmp_path, rotel):
    result = doctor(
        tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.grpc_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    (target,) = report["pipeline"]["targets"]
    assert target["accepted"] and target["protocol"] == "grpc" and target["url"] == rotel.grpc_endpoint


def test_a_proxy_the_exporter_would_use_is_named_without_its_url(rotel):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint, "HTTP_PROXY": "http://user:proxy-canary@127.0.0.1:9"}
    section, problems = check(env)
    (info,) = [p for p in problems if p.severity == "info"]
    assert info.problem.startswith("HTTP_PROXY is set: the exporter (requests) sends through that proxy")
    assert section["targets"][0]["proxies"] == ["HTTP_PROXY"] and section["targets"][0]["accepted"]
    assert "proxy-canary" not in json.dumps(section) + repr(problems)
