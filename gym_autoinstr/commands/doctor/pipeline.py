"""Can a span arrive: the configured OTLP endpoint, probed live.

The exporters question says whether the exporter package imports; this one asks the
endpoint (resolved by ``endpoint.py``).  In at most ``BUDGET_SECONDS``: the host name
resolves, a TCP connection opens, and one *empty* OTLP export (an
``ExportTraceServiceRequest`` holding one empty ``ResourceSpans``: no span, nothing of
Gym; MLflow rejects a request with no ``ResourceSpans`` at all) is accepted.  Each
failure is named with its fix: DNS, refused, timeout, TLS mismatch, the wrong protocol
for the port (an HTTP/1.1 request to a gRPC port and the reverse are told apart by what
the port answers), 401/403 (the header variable to check), 404 (the path).
``--offline`` skips the probe.  Header values are never printed.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from gym_autoinstr.commands.doctor import endpoint
from gym_autoinstr.commands.doctor.endpoint import SUBJECT
from gym_autoinstr.commands.doctor.report import ERROR, WARNING, Problem

BUDGET_SECONDS = 5.0
STEP_SECONDS = 3.0
GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
EXPERIMENT_HEADER = "x-mlflow-experiment-id"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
EMPTY_EXPORT = b"\x0a\x00"  # ExportTraceServiceRequest{resource_spans: [ResourceSpans{}]}


def pipeline(
    environ: Mapping[str, str], exporter_rows: list[dict[str, Any]], *, offline: bool = False
) -> tuple[dict[str, Any], list[Problem]]:
    """The live check of every OTLP exporter the start-up would build."""
    problems = endpoint.protocol_problems(environ)
    otlp = [row for row in exporter_rows if row.get("protocol") and row.get("used") in endpoint.DEFAULT_ENDPOINTS]
    section: dict[str, Any] = {"checked": False, "skipped": None, "targets": []}
    if not otlp:
        section["skipped"] = "no OTLP exporter is configured"
        return section, problems
    if offline:
        section["skipped"] = "--offline"
        return section, problems
    deadline = time.monotonic() + BUDGET_SECONDS
    section["checked"] = True
    for protocol in dict.fromkeys(row["used"] for row in otlp):
        target = endpoint.resolve(environ, protocol)
        found = endpoint.check(target)
        if not any(p.severity == ERROR for p in found):
            found += _probe(target, deadline)
        target["accepted"] = not any(p.severity == ERROR for p in found)
        problems += found
        section["targets"].append(endpoint.public(target))
    return section, problems


def _error(problem: str, fix: str) -> Problem:
    return Problem(ERROR, SUBJECT, problem, fix)


def _refused(target: dict[str, Any], where: str, answer: str) -> Problem:
    """The receiver answered the export with a credentials error."""
    sent = ", ".join(sorted(target["headers"])) or "none"
    return _error(
        f"{where} refused the export: {answer}; headers sent: {sent}",
        f"check the credentials in {target['headers_variable']} (e.g. authorization=Bearer%20<token>, URL-encoded)",
    )


def _remaining(deadline: float) -> float:
    return max(0.05, min(STEP_SECONDS, deadline - time.monotonic()))


def _probe(target: dict[str, Any], deadline: float) -> list[Problem]:
    """Resolve, connect, export nothing: the first step that fails is the problem."""
    host, port, protocol = target["host"], target["port"], target["protocol"]
    usual = endpoint.USUAL_PORTS[protocol]
    where = endpoint.address(target)
    fix_endpoint = (
        f"check the host in {endpoint.source(target)}"
        if target["variable"]
        else endpoint.set_endpoint_fix(target, f"http://<collector host>:{usual}")
    )
    target["steps"] = steps = []
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        steps.append("resolve: failed")
        return [_error(f"the host name {host!r} does not resolve ({error.strerror or error})", fix_endpoint)]
    steps.append("resolve: ok")
    try:
        socket.create_connection((host, port), timeout=_remaining(deadline)).close()
    except ConnectionRefusedError:
        steps.append("connect: refused")
        return [
            _error(
                f"nothing listens at {where}: connection refused",
                "start the collector, or point "
                f"{target['variable'] or 'OTEL_EXPORTER_OTLP_ENDPOINT'} "
                f"at its OTLP {protocol} port (usually {usual})",
            )
        ]
    except TimeoutError:
        steps.append("connect: timeout")
        return [
            _error(
                f"no answer from {where} within the doctor's time budget (connection timed out)",
                "check that the host is reachable from here (firewall, VPN, the collector's address)",
            )
        ]
    except OSError as error:
        steps.append("connect: failed")
        return [_error(f"cannot connect to {where} ({error.strerror or type(error).__name__})", fix_endpoint)]
    steps.append("connect: ok")
    if protocol == "grpc":
        return _grpc_export(target, deadline)
    return _http_export(target, deadline)


def _tls_problem(target: dict[str, Any], text: str) -> Problem:
    where = endpoint.address(target)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
        return _error(
            f"{where}'s TLS certificate is not trusted here",
            "set OTEL_EXPORTER_OTLP_CERTIFICATE to the CA file that signed it",
        )
    plain = "http://" + where
    fix = f"use {plain} (plain text)" + (
        " or set OTEL_EXPORTER_OTLP_INSECURE=true" if target["protocol"] == "grpc" else ""
    )
    return _error(f"TLS handshake with {where} failed: the port seems to speak plain text, not TLS", fix)


def _sniff(host: str, port: int, payload: bytes, deadline: float) -> bytes:
    """The first bytes a plain-text port answers to ``payload`` (b"" if it closes or is silent)."""
    try:
        with socket.create_connection((host, port), timeout=_remaining(deadline)) as connection:
            connection.sendall(payload)
            return connection.recv(64)
    except OSError:
        return b""


def _speaks_h2(host: str, port: int, deadline: float) -> bool:
    answer = _sniff(host, port, _H2_PREFACE, deadline)
    return len(answer) >= 9 and answer[3] == 0x04 and not answer.startswith(b"HTTP/")


def _speaks_http1(host: str, port: int, deadline: float) -> bool:
    request = f"OPTIONS / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    return _sniff(host, port, request, deadline).startswith(b"HTTP/1.")


def _http_export(target: dict[str, Any], deadline: float) -> list[Problem]:
    host, port = target["host"], target["port"]
    where = endpoint.address(target)
    parts = urlsplit(target["url"])
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    headers = {"content-type": "application/x-protobuf", "user-agent": "gym-autoinstr-doctor"}
    headers.update(target["headers"])
    timeout = _remaining(deadline)
    if target["tls"]:
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context(cafile=target["ca_file"])
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", path, body=EMPTY_EXPORT, headers=headers)
        response = connection.getresponse()
        status = response.status
        location = response.getheader("location") or ""
        answer = response.read(65536)
    except ssl.SSLError as error:
        target["steps"].append("export: tls failed")
        return [_tls_problem(target, str(error))]
    except TimeoutError:
        target["steps"].append("export: timeout")
        if not target["tls"] and _speaks_h2(host, port, deadline):
            return [_wrong_protocol_http_to_grpc(target)]
        return [
            _error(
                f"{where} accepted the connection but did not answer the export in time",
                "check the collector's health and log; is this port an OTLP receiver?",
            )
        ]
    except (http.client.HTTPException, ConnectionError, OSError) as error:
        target["steps"].append("export: no HTTP answer")
        if isinstance(error, http.client.BadStatusLine) and str(error).startswith(("'\\x15\\x03", "\x15\x03")):
            return [_error(f"{where} speaks TLS, and the endpoint says http://", f"use https://{where}")]
        if not target["tls"] and _speaks_h2(host, port, deadline):
            return [_wrong_protocol_http_to_grpc(target)]
        return [
            _error(
                f"{where} closed the connection without an HTTP answer ({type(error).__name__})",
                "is this port an OTLP/HTTP receiver? check the collector's configuration",
            )
        ]
    finally:
        connection.close()
    target["steps"].append(f"export: {status}")
    target["status"] = status
    if 200 <= status < 300:
        return []
    if status in (401, 403):
        what = "unauthenticated" if status == 401 else "forbidden"
        return [_refused(target, target["url"].split("?")[0], f"{status} ({what})")]
    if status in (404, 405):
        if target["variable"] == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
            fix = (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as-is: "
                "give the full URL of the receiver, usually ending in /v1/traces"
            )
        else:
            fix = (
                "OTEL_EXPORTER_OTLP_ENDPOINT is the base URL (the exporter appends /v1/traces): "
                "give the collector's base, or the full URL in OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            )
        return [_error(f"no OTLP trace receiver at {where}{parts.path or '/'} ({status})", fix)]
    if 300 <= status < 400:
        moved = urlsplit(location)
        shown = f"{moved.scheme}://{moved.netloc.rpartition('@')[2]}{moved.path}" if moved.netloc else moved.path
        return [
            _error(
                f"{where}{parts.path} redirects ({status}) to {shown}; exporters do not follow it",
                "set the endpoint to where it redirects",
            )
        ]
    missing = _missing_headers(answer) if status in (400, 422) else []
    if missing:
        hint = (
            " (MLflow: the id of the experiment that receives the traces; 0 is its Default experiment)"
            if EXPERIMENT_HEADER in missing
            else ""
        )
        return [
            _error(
                f"{where}{parts.path} requires the header(s) {', '.join(missing)} ({status})",
                f"add {', '.join(m + '=<value>' for m in missing)} to {target['headers_variable']}{hint}",
            )
        ]
    if status == 400 and EXPERIMENT_HEADER in target["headers"]:
        return [
            _error(
                f"{where}{parts.path} rejected the export (400)",
                f"check that the MLflow experiment named by {EXPERIMENT_HEADER} in {target['headers_variable']} exists",
            )
        ]
    if status == 415:
        return [
            _error(
                f"{where}{parts.path} does not take OTLP protobuf ({status})",
                "point the endpoint at an OTLP/HTTP receiver (a collector's port 4318)",
            )
        ]
    return [
        _error(
            f"{where}{parts.path} answered the export with {status}",
            "check the receiver's log; 5xx may be an overloaded or misconfigured collector",
        )
    ]


def _missing_headers(answer: bytes) -> list[str]:
    """Header names a FastAPI receiver (MLflow's) says are missing: ``{"detail": [{"loc": ["header", name]}]}``."""
    try:
        detail = json.loads(answer.decode("utf-8", "replace")).get("detail")
    except (ValueError, AttributeError):
        return []
    names = []
    for item in detail if isinstance(detail, list) else []:
        location = item.get("loc") if isinstance(item, dict) else None
        if (
            isinstance(location, list)
            and len(location) == 2
            and location[0] == "header"
            and isinstance(location[1], str)
        ):
            if endpoint.HEADER_NAME.fullmatch(location[1]):
                names.append(location[1].lower())
    return names


def _wrong_protocol_http_to_grpc(target: dict[str, Any]) -> Problem:
    where = endpoint.address(target)
    return _error(
        f"{where} speaks HTTP/2 only, as a gRPC receiver does, and OTLP is set to http/protobuf",
        "set OTEL_EXPORTER_OTLP_PROTOCOL=grpc for this port, or point the endpoint at the collector's "
        "OTLP/HTTP port (usually 4318)",
    )


def _grpc_export(target: dict[str, Any], deadline: float) -> list[Problem]:
    try:
        import grpc
    except Exception as error:  # the exporters question already names the package
        target["steps"].append("export: grpc not importable")
        return [
            Problem(
                WARNING,
                SUBJECT,
                f"grpc cannot be imported here ({type(error).__name__}); the export was not tried",
                "pip install opentelemetry-exporter-otlp-proto-grpc",
            )
        ]
    address = endpoint.address(target)
    if target["tls"]:
        root = None
        if target["ca_file"]:
            try:
                with open(target["ca_file"], "rb") as handle:
                    root = handle.read()
            except OSError as error:
                return [
                    _error(
                        f"the CA file in OTEL_EXPORTER_OTLP_CERTIFICATE cannot be read ({error.strerror})",
                        "set OTEL_EXPORTER_OTLP_CERTIFICATE to a readable PEM file",
                    )
                ]
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root))
    else:
        channel = grpc.insecure_channel(address)
    try:
        export = channel.unary_unary(GRPC_EXPORT_METHOD)  # raw bytes in and out: b"" is an empty request
        export(EMPTY_EXPORT, timeout=_remaining(deadline), metadata=list(target["headers"].items()))
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else None
        details = (error.details() if hasattr(error, "details") else "") or ""
        target["steps"].append(f"export: {getattr(code, 'name', code)}")
        target["status"] = getattr(code, "name", str(code))
        return [_grpc_problem(target, code, details, deadline)]
    finally:
        channel.close()
    target["steps"].append("export: OK")
    target["status"] = "OK"
    return []


def _grpc_problem(target: dict[str, Any], code: Any, details: str, deadline: float) -> Problem:
    import grpc

    host, port = target["host"], target["port"]
    where = endpoint.address(target)
    lowered = details.lower()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return _refused(target, where, code.name)
    if target["tls"] and ("ssl" in lowered or "handshake" in lowered or "tls" in lowered):
        return _tls_problem(target, details)
    # An HTTP/1.1 answer means an OTLP/HTTP receiver (some also take HTTP/2 and answer a
    # gRPC call with 404, which gRPC reports as UNIMPLEMENTED).
    if "http1" in lowered or "http/1" in lowered or (not target["tls"] and _speaks_http1(host, port, deadline)):
        return _error(
            f"{where} answers HTTP/1.1, as an OTLP/HTTP receiver does, and OTLP is set to grpc",
            "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf for this port, or point the endpoint at the collector's "
            "OTLP gRPC port (usually 4317)",
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return _error(
            f"{where} speaks gRPC but has no OTLP trace service",
            "point the endpoint at a collector's OTLP gRPC port (usually 4317)",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return _error(
            f"{where} did not answer the gRPC export in time",
            "check the collector's health; "
            "with TLS on a plain-text port use http:// or OTEL_EXPORTER_OTLP_INSECURE=true",
        )
    return _error(
        f"the gRPC export to {where} failed: {getattr(code, 'name', code)}",
        "check the collector's log and that this port is its OTLP gRPC receiver",
    )
