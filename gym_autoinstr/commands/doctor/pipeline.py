"""Can a span arrive: the configured OTLP endpoint, probed live.

The exporters question says whether the exporter package imports; this one asks the
endpoint.  The endpoint, headers and TLS mode are resolved as the SDK's exporters resolve
them (OpenTelemetry's exporter spec): over http/protobuf the signal-specific
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is used as-is and the generic
``OTEL_EXPORTER_OTLP_ENDPOINT`` gets ``/v1/traces`` appended; over gRPC only host and port
count, and TLS is off only for ``http://`` (or ``OTEL_EXPORTER_OTLP[_TRACES]_INSECURE``).

Then, in at most ``BUDGET_SECONDS``: the host name resolves, a TCP connection opens, and
one *empty* OTLP export (an ``ExportTraceServiceRequest`` holding one empty
``ResourceSpans``: no span, nothing of Gym; MLflow rejects a request with no
``ResourceSpans`` at all) is accepted.  Each failure is named with its fix: DNS, refused, timeout, TLS
mismatch, the wrong protocol for the port (an HTTP/1.1 request to a gRPC port and the
reverse are told apart by what the port answers), 401/403 (the header variable to check),
404 (the path).  ``--offline`` skips the probe.  Header values are never printed.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import ERROR, INFO, WARNING, Problem

BUDGET_SECONDS = 5.0
STEP_SECONDS = 3.0
GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
USUAL_PORTS = {"http/protobuf": 4318, "grpc": 4317}
EXPERIMENT_HEADER = "x-mlflow-experiment-id"
KNOWN_PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http/protobuf", "http": "http/protobuf"}
_HEADER_NAME = re.compile(r"[!#-'*+\-.0-9A-Z^-z|~]+")
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
SUBJECT = "pipeline"
EMPTY_EXPORT = b"\x0a\x00"  # ExportTraceServiceRequest{resource_spans: [ResourceSpans{}]}


def _variable(
    environ: Mapping[str, str], specific: settings.Setting, generic: settings.Setting
) -> tuple[str | None, str | None]:
    """The value the SDK reads (signal-specific first) and the variable it came from."""
    for setting in (specific, generic):
        value = setting.raw(environ)
        if value:
            return value, setting.holder(environ)  # an inheriting setting names where its value is
    return None, None


def protocol_problems(environ: Mapping[str, str]) -> list[Problem]:
    """An OTLP protocol value the exporters do not know: named, with what happens instead."""
    raw, variable = _variable(environ, settings.OTLP_TRACES_PROTOCOL, settings.OTLP_PROTOCOL)
    if raw is None or raw.strip().lower() in KNOWN_PROTOCOLS:
        return []
    return [
        Problem(
            WARNING,
            "exporter",
            f"{variable}={raw!r} is not an OTLP protocol the Python exporters support"
            + (" (http/json is not implemented)" if raw.strip().lower() == "http/json" else "")
            + "; spans go over http/protobuf instead",
            f"set {variable}=http/protobuf (the collector's port 4318) or {variable}=grpc (port 4317)",
        )
    ]


def resolve(environ: Mapping[str, str], protocol: str) -> dict[str, Any]:
    """Where the SDK's ``protocol`` exporter would send spans, and how (no network)."""
    specific = settings.OTLP_TRACES_ENDPOINT.name
    raw, variable = _variable(environ, settings.OTLP_TRACES_ENDPOINT, settings.OTLP_ENDPOINT)
    target: dict[str, Any] = {"protocol": protocol, "variable": variable, "configured": raw}
    base = raw if raw is not None else DEFAULT_ENDPOINTS[protocol]
    if protocol == "http/protobuf":
        url = base if variable == specific else base.removesuffix("/") + "/v1/traces"
    else:
        url = base
    target["url"] = url
    try:  # the host and port as written (with /v1/traces added, "http://" would name the host v1)
        parts = urlsplit(base)
        target["host"], port, target["path"] = parts.hostname, parts.port, urlsplit(url).path or "/"
    except ValueError as error:  # Invalid IPv6 URL, Port out of range 0-65535, Port could not be cast...
        parts, target["host"], port, target["path"] = urlsplit(""), None, None, "/"
        target["invalid"] = f"{error} (a port is 1-65535; an IPv6 address must be in brackets: http://[::1]:4318)"
    scheme = parts.scheme.lower()
    target["scheme"] = scheme
    if protocol == "grpc":
        insecure_raw, _ = _variable(environ, settings.OTLP_TRACES_INSECURE, settings.OTLP_INSECURE)
        if scheme == "https":
            tls = True
        elif insecure_raw is not None:
            tls = insecure_raw.strip().lower() != "true"
        else:
            tls = scheme != "http"
        if not parts.netloc and "invalid" not in target:  # "host:4317", no scheme: handed to gRPC as it is
            host, _, port_text = url.rpartition(":")
            target["host"], port = host.strip("[]") or None, int(port_text) if port_text.isdigit() else None
        target["tls"] = tls
        target["port"] = port or 443
    else:
        target["tls"] = scheme == "https"
        target["port"] = port or (443 if scheme == "https" else 80)
    if not target["host"] and "invalid" not in target:
        target["invalid"] = "it names no host" + ("" if "://" in base else f" (no scheme: http://{base}?)")
    headers_raw, headers_variable = _variable(environ, settings.OTLP_TRACES_HEADERS, settings.OTLP_HEADERS)
    target["headers_variable"] = headers_variable or "OTEL_EXPORTER_OTLP_HEADERS"
    target["headers"], target["bad_headers"] = _parse_headers(headers_raw or "")
    ca_file, _ = _variable(environ, settings.OTLP_TRACES_CERTIFICATE, settings.OTLP_CERTIFICATE)
    target["ca_file"] = ca_file
    target["proxies"] = {k: v for k, v in environ.items() if k.lower() in ("http_proxy", "https_proxy") and v}
    return target


def _parse_headers(raw: str) -> tuple[dict[str, str], list[str]]:
    """``name=value`` pairs, comma-separated, URL-decoded, as the SDK parses them
    (liberally); and a description (never the value) of each entry it would drop or
    that could not be sent."""
    headers: dict[str, str] = {}
    bad: list[str] = []
    for position, entry in enumerate(re.split(r"[ \t]*,[ \t]*", raw), start=1):
        if not entry.strip():
            continue
        name, equals, value = entry.partition("=")
        name = unquote(name).strip().lower()
        if not equals or not _HEADER_NAME.fullmatch(name):
            bad.append(f"entry {position} is not name=value with a valid header name (the exporter drops it)")
            continue
        value = unquote(value).strip()
        if not all(32 <= ord(c) < 127 for c in value):
            bad.append(
                f"the value of {name!r} is not printable ASCII after URL-decoding (HTTP and gRPC cannot send it)"
            )
            continue
        headers[name] = value
    return headers, bad


def pipeline(
    environ: Mapping[str, str], exporter_rows: list[dict[str, Any]], *, offline: bool = False
) -> tuple[dict[str, Any], list[Problem]]:
    """The live check of every OTLP exporter the start-up would build."""
    problems = protocol_problems(environ)
    otlp = [row for row in exporter_rows if row.get("protocol") and row.get("used") in DEFAULT_ENDPOINTS]
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
        target = resolve(environ, protocol)
        found = _endpoint_problems(target)
        if not any(p.severity == ERROR for p in found):
            found += _probe(target, deadline)
        target["accepted"] = not any(p.severity == ERROR for p in found)
        problems += found
        section["targets"].append(_public(target))
    return section, problems


def _public(target: dict[str, Any]) -> dict[str, Any]:
    """The target as reported: header names only, never their values."""
    shown = {k: v for k, v in target.items() if k not in ("headers", "configured", "proxies")}
    shown["proxies"] = sorted(target["proxies"])  # names only: a proxy URL may hold credentials
    shown["headers"] = sorted(target["headers"])
    try:
        parts = urlsplit(target["url"])
        shown["url"] = parts._replace(query="", fragment="", netloc=parts.netloc.rpartition("@")[2]).geturl()
    except ValueError:  # no URL ("invalid" says why): as written, less a query and credentials
        shown["url"] = re.sub(r"//[^/]*@", "//", target["url"].partition("?")[0])
    return shown


def _where(target: dict[str, Any]) -> str:
    return (
        f"{target['variable']}"
        if target["variable"]
        else f"the default endpoint ({DEFAULT_ENDPOINTS[target['protocol']]})"
    )


def _set_endpoint_fix(target: dict[str, Any], example: str) -> str:
    return f"set {target['variable'] or 'OTEL_EXPORTER_OTLP_ENDPOINT'}={example}"


def _endpoint_problems(target: dict[str, Any]) -> list[Problem]:
    """What is wrong with the endpoint before anything is sent."""
    protocol, scheme, variable = target["protocol"], target["scheme"], target["variable"]
    port = USUAL_PORTS[protocol]
    problems: list[Problem] = []
    if target["bad_headers"]:
        problems.append(
            Problem(
                WARNING,
                SUBJECT,
                f"{target['headers_variable']}: " + "; ".join(target["bad_headers"]),
                f"write {target['headers_variable']} as name=value pairs separated by commas, values URL-encoded "
                "(e.g. authorization=Bearer%20<token>)",
            )
        )
    if "invalid" in target:
        problems.append(
            Problem(
                ERROR,
                SUBJECT,
                f"{_where(target)}={target['configured']!r} cannot be used: {target['invalid']}",
                _set_endpoint_fix(target, f"http://<host>:{port}"),
            )
        )
        return problems
    if protocol == "http/protobuf":
        if scheme not in ("http", "https"):
            hint = (
                (
                    " (grpc:// is no URL scheme an OTLP exporter knows; for gRPC set OTEL_EXPORTER_OTLP_PROTOCOL=grpc "
                    f"and use http://{target['host']}:4317)"
                )
                if scheme == "grpc"
                else ""
            )
            problems.append(
                Problem(
                    ERROR,
                    SUBJECT,
                    f"{_where(target)}={target['configured']!r}: "
                    f"the http/protobuf exporter needs an http:// or https:// URL{hint}",
                    _set_endpoint_fix(
                        target,
                        f"http://{_host_for_url(target)}:{target['port'] if target['port'] not in (80, 443) else port}",
                    ),
                )
            )
        elif variable == "OTEL_EXPORTER_OTLP_ENDPOINT" and target["path"].rstrip("/").endswith("/v1/traces/v1/traces"):
            problems.append(
                Problem(
                    ERROR,
                    SUBJECT,
                    "OTEL_EXPORTER_OTLP_ENDPOINT already ends in /v1/traces, and the exporter appends /v1/traces "
                    f"to the generic endpoint: spans would go to {target['path']}",
                    "drop /v1/traces from OTEL_EXPORTER_OTLP_ENDPOINT, or set the full URL in "
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as-is)",
                )
            )
        elif variable == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" and target["path"] in ("", "/"):
            problems.append(
                Problem(
                    WARNING,
                    SUBJECT,
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as-is and has no path, so spans are POSTed to /",
                    "end it in /v1/traces (e.g. http://<host>:4318/v1/traces), or set the base URL in "
                    "OTEL_EXPORTER_OTLP_ENDPOINT instead",
                )
            )
        proxy = next(
            (name for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY") if environ_get(target, name)), None
        )
        if proxy:
            problems.append(
                Problem(
                    INFO,
                    SUBJECT,
                    f"{proxy} is set: the exporter (requests) sends through that proxy unless NO_PROXY covers "
                    f"{target['host']}, while the doctor connects directly",
                    "if spans do not arrive but the doctor passes, "
                    f"check the proxy or add {target['host']} to NO_PROXY",
                )
            )
    else:
        if scheme not in ("http", "https") and target["tls"]:
            problems.append(
                Problem(
                    INFO,
                    SUBJECT,
                    f"{_where(target)}={target['configured']!r}: with a scheme other than http:// the gRPC exporter "
                    "connects with TLS",
                    f"use http://{_host_for_url(target)}:{target['port']} for a plain-text collector, https:// for TLS",
                )
            )
        if target["path"] not in ("", "/") and target["scheme"] in ("http", "https"):
            problems.append(
                Problem(
                    INFO,
                    SUBJECT,
                    f"{_where(target)} has a path ({target['path']}), "
                    "which the gRPC exporter ignores: only host and port count",
                    "drop the path",
                )
            )
    return problems


def environ_get(target: dict[str, Any], name: str) -> str | None:
    return target["proxies"].get(name)


def _host_for_url(target: dict[str, Any]) -> str:
    host = target["host"] or "<host>"
    return f"[{host}]" if ":" in host else host


def _remaining(deadline: float) -> float:
    return max(0.05, min(STEP_SECONDS, deadline - time.monotonic()))


def _probe(target: dict[str, Any], deadline: float) -> list[Problem]:
    """Resolve, connect, export nothing: the first step that fails is the problem."""
    host, port, protocol = target["host"], target["port"], target["protocol"]
    usual = USUAL_PORTS[protocol]
    where = f"{_host_for_url(target)}:{port}"
    fix_endpoint = (
        f"check the host in {_where(target)}"
        if target["variable"]
        else _set_endpoint_fix(target, f"http://<collector host>:{usual}")
    )
    target["steps"] = steps = []
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        steps.append("resolve: failed")
        return [
            Problem(
                ERROR, SUBJECT, f"the host name {host!r} does not resolve ({error.strerror or error})", fix_endpoint
            )
        ]
    steps.append("resolve: ok")
    try:
        socket.create_connection((host, port), timeout=_remaining(deadline)).close()
    except ConnectionRefusedError:
        steps.append("connect: refused")
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"nothing listens at {where}: connection refused",
                "start the collector, or point "
                f"{_where(target) if target['variable'] else 'OTEL_EXPORTER_OTLP_ENDPOINT'} "
                f"at its OTLP {protocol} port (usually {usual})",
            )
        ]
    except TimeoutError:
        steps.append("connect: timeout")
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"no answer from {where} within the doctor's time budget (connection timed out)",
                "check that the host is reachable from here (firewall, VPN, the collector's address)",
            )
        ]
    except OSError as error:
        steps.append("connect: failed")
        return [
            Problem(
                ERROR, SUBJECT, f"cannot connect to {where} ({error.strerror or type(error).__name__})", fix_endpoint
            )
        ]
    steps.append("connect: ok")
    if protocol == "grpc":
        return _grpc_export(target, deadline)
    return _http_export(target, deadline)


def _tls_context(target: dict[str, Any]) -> ssl.SSLContext:
    context = (
        ssl.create_default_context(cafile=target["ca_file"]) if target["ca_file"] else ssl.create_default_context()
    )
    return context


def _tls_problem(target: dict[str, Any], error: BaseException) -> Problem:
    text = str(error)
    where = f"{_host_for_url(target)}:{target['port']}"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
        return Problem(
            ERROR,
            SUBJECT,
            f"{where}'s TLS certificate is not trusted here",
            "set OTEL_EXPORTER_OTLP_CERTIFICATE to the CA file that signed it",
        )
    plain = "http://" + where
    fix = f"use {plain} (plain text)" + (
        " or set OTEL_EXPORTER_OTLP_INSECURE=true" if target["protocol"] == "grpc" else ""
    )
    return Problem(
        ERROR, SUBJECT, f"TLS handshake with {where} failed: the port seems to speak plain text, not TLS", fix
    )


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
    where = f"{_host_for_url(target)}:{port}"
    parts = urlsplit(target["url"])
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    headers = {"content-type": "application/x-protobuf", "user-agent": "gym-autoinstr-doctor"}
    headers.update(target["headers"])
    timeout = _remaining(deadline)
    if target["tls"]:
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=_tls_context(target)
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
        return [_tls_problem(target, error)]
    except TimeoutError:
        target["steps"].append("export: timeout")
        if not target["tls"] and _speaks_h2(host, port, deadline):
            return [_wrong_protocol_http_to_grpc(target)]
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"{where} accepted the connection but did not answer the export in time",
                "check the collector's health and log; is this port an OTLP receiver?",
            )
        ]
    except (http.client.HTTPException, ConnectionError, OSError) as error:
        target["steps"].append("export: no HTTP answer")
        if isinstance(error, http.client.BadStatusLine) and str(error).startswith(("'\\x15\\x03", "\x15\x03")):
            return [
                Problem(ERROR, SUBJECT, f"{where} speaks TLS, and the endpoint says http://", f"use https://{where}")
            ]
        if not target["tls"] and _speaks_h2(host, port, deadline):
            return [_wrong_protocol_http_to_grpc(target)]
        return [
            Problem(
                ERROR,
                SUBJECT,
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
        sent = ", ".join(sorted(target["headers"])) or "none"
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"{target['url'].split('?')[0]} refused the export: {status} ({what}); headers sent: {sent}",
                f"check the credentials in {target['headers_variable']} "
                "(e.g. authorization=Bearer%20<token>, URL-encoded)",
            )
        ]
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
        return [Problem(ERROR, SUBJECT, f"no OTLP trace receiver at {where}{parts.path or '/'} ({status})", fix)]
    if 300 <= status < 400:
        moved = urlsplit(location)
        shown = f"{moved.scheme}://{moved.netloc.rpartition('@')[2]}{moved.path}" if moved.netloc else moved.path
        return [
            Problem(
                ERROR,
                SUBJECT,
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
            Problem(
                ERROR,
                SUBJECT,
                f"{where}{parts.path} requires the header(s) {', '.join(missing)} ({status})",
                f"add {', '.join(m + '=<value>' for m in missing)} to {target['headers_variable']}{hint}",
            )
        ]
    if status == 400 and EXPERIMENT_HEADER in target["headers"]:
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"{where}{parts.path} rejected the export (400)",
                f"check that the MLflow experiment named by {EXPERIMENT_HEADER} in {target['headers_variable']} exists",
            )
        ]
    if status == 415:
        return [
            Problem(
                ERROR,
                SUBJECT,
                f"{where}{parts.path} does not take OTLP protobuf ({status})",
                "point the endpoint at an OTLP/HTTP receiver (a collector's port 4318)",
            )
        ]
    return [
        Problem(
            ERROR,
            SUBJECT,
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
            if _HEADER_NAME.fullmatch(location[1]):
                names.append(location[1].lower())
    return names


def _wrong_protocol_http_to_grpc(target: dict[str, Any]) -> Problem:
    where = f"{_host_for_url(target)}:{target['port']}"
    return Problem(
        ERROR,
        SUBJECT,
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
    address = f"{_host_for_url(target)}:{target['port']}"
    if target["tls"]:
        root = None
        if target["ca_file"]:
            try:
                with open(target["ca_file"], "rb") as handle:
                    root = handle.read()
            except OSError as error:
                return [
                    Problem(
                        ERROR,
                        SUBJECT,
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
    where = f"{_host_for_url(target)}:{port}"
    lowered = details.lower()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        sent = ", ".join(sorted(target["headers"])) or "none"
        return Problem(
            ERROR,
            SUBJECT,
            f"{where} refused the export: {code.name}; headers sent: {sent}",
            f"check the credentials in {target['headers_variable']} (e.g. authorization=Bearer%20<token>, URL-encoded)",
        )
    if target["tls"] and ("ssl" in lowered or "handshake" in lowered or "tls" in lowered):
        return _tls_problem(target, Exception(details))
    # An HTTP/1.1 answer means an OTLP/HTTP receiver (some also take HTTP/2 and answer a
    # gRPC call with 404, which gRPC reports as UNIMPLEMENTED).
    if "http1" in lowered or "http/1" in lowered or (not target["tls"] and _speaks_http1(host, port, deadline)):
        return Problem(
            ERROR,
            SUBJECT,
            f"{where} answers HTTP/1.1, as an OTLP/HTTP receiver does, and OTLP is set to grpc",
            "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf for this port, or point the endpoint at the collector's "
            "OTLP gRPC port (usually 4317)",
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return Problem(
            ERROR,
            SUBJECT,
            f"{where} speaks gRPC but has no OTLP trace service",
            "point the endpoint at a collector's OTLP gRPC port (usually 4317)",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Problem(
            ERROR,
            SUBJECT,
            f"{where} did not answer the gRPC export in time",
            "check the collector's health; "
            "with TLS on a plain-text port use http:// or OTEL_EXPORTER_OTLP_INSECURE=true",
        )
    return Problem(
        ERROR,
        SUBJECT,
        f"the gRPC export to {where} failed: {getattr(code, 'name', code)}",
        "check the collector's log and that this port is its OTLP gRPC receiver",
    )
