"""Where the OTLP exporters would send spans, and what is wrong with that before anything is sent.

The endpoint, headers and TLS mode are resolved as the SDK's exporters resolve them
(OpenTelemetry's exporter spec): over http/protobuf the signal-specific
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is used as-is and the generic
``OTEL_EXPORTER_OTLP_ENDPOINT`` gets ``/v1/traces`` appended; over gRPC only host and port
count, and TLS is off only for ``http://`` (or ``OTEL_EXPORTER_OTLP[_TRACES]_INSECURE``).
No network: ``pipeline.py`` probes what this resolves.  Header values are never reported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from gym_autoinstr import settings
from gym_autoinstr.commands.doctor.report import ERROR, INFO, WARNING, Problem, adder

DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
USUAL_PORTS = {"http/protobuf": 4318, "grpc": 4317}
KNOWN_PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http/protobuf", "http": "http/protobuf"}
HEADER_NAME = re.compile(r"[!#-'*+\-.0-9A-Z^-z|~]+")
SUBJECT = "pipeline"


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
        target["invalid"] = "it names no host" + ("" if "://" in base else f" (no scheme: http://{hidden(base)}?)")
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
        if not equals or not HEADER_NAME.fullmatch(name):
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


def public(target: dict[str, Any]) -> dict[str, Any]:
    """The target as reported: header names only, never their values."""
    shown = {k: v for k, v in target.items() if k not in ("headers", "configured", "proxies")}
    shown["proxies"] = sorted(target["proxies"])  # names only: a proxy URL may hold credentials
    shown["headers"] = sorted(target["headers"])
    try:
        parts = urlsplit(target["url"])
        shown["url"] = hidden(parts._replace(query="", fragment="", netloc=parts.netloc.rpartition("@")[2]).geturl())
    except ValueError:  # no URL ("invalid" says why): as written, less a query and credentials
        shown["url"] = hidden(target["url"].partition("?")[0])
    if "invalid" in target:  # ("user:password@host" reads as the scheme "user" and a path)
        shown.pop("scheme", None)
        shown["path"] = hidden(target["path"])
    return shown


def hidden(text: str) -> str:
    """An endpoint as shown: credentials written into it (``user:password@``) left out."""
    return re.sub(r"(^|//)[^/?#@]*@", r"\1", text)


def source(target: dict[str, Any]) -> str:
    """The variable the endpoint came from, or the default endpoint."""
    return target["variable"] or f"the default endpoint ({DEFAULT_ENDPOINTS[target['protocol']]})"


def set_endpoint_fix(target: dict[str, Any], example: str) -> str:
    return f"set {target['variable'] or 'OTEL_EXPORTER_OTLP_ENDPOINT'}={example}"


def check(target: dict[str, Any]) -> list[Problem]:
    """What is wrong with the endpoint before anything is sent."""
    protocol, scheme, variable = target["protocol"], target["scheme"], target["variable"]
    port = USUAL_PORTS[protocol]
    problems: list[Problem] = []
    add = adder(problems, SUBJECT)
    if target["bad_headers"]:
        add(
            WARNING,
            f"{target['headers_variable']}: " + "; ".join(target["bad_headers"]),
            f"write {target['headers_variable']} as name=value pairs separated by commas, values URL-encoded "
            "(e.g. authorization=Bearer%20<token>)",
        )
    if "invalid" in target:
        add(
            ERROR,
            f"{source(target)}={hidden(target['configured'])!r} cannot be used: {target['invalid']}",
            set_endpoint_fix(target, f"http://<host>:{port}"),
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
            add(
                ERROR,
                f"{source(target)}={target['configured']!r}: "
                f"the http/protobuf exporter needs an http:// or https:// URL{hint}",
                set_endpoint_fix(
                    target,
                    f"http://{host_for_url(target)}:{target['port'] if target['port'] not in (80, 443) else port}",
                ),
            )
        elif variable == "OTEL_EXPORTER_OTLP_ENDPOINT" and target["path"].rstrip("/").endswith("/v1/traces/v1/traces"):
            add(
                ERROR,
                "OTEL_EXPORTER_OTLP_ENDPOINT already ends in /v1/traces, and the exporter appends /v1/traces "
                f"to the generic endpoint: spans would go to {target['path']}",
                "drop /v1/traces from OTEL_EXPORTER_OTLP_ENDPOINT, or set the full URL in "
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as-is)",
            )
        elif variable == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" and target["path"] in ("", "/"):
            add(
                WARNING,
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as-is and has no path, so spans are POSTed to /",
                "end it in /v1/traces (e.g. http://<host>:4318/v1/traces), or set the base URL in "
                "OTEL_EXPORTER_OTLP_ENDPOINT instead",
            )
        proxy = next(
            (name for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY") if target["proxies"].get(name)), None
        )
        if proxy:
            add(
                INFO,
                f"{proxy} is set: the exporter (requests) sends through that proxy unless NO_PROXY covers "
                f"{target['host']}, while the doctor connects directly",
                f"if spans do not arrive but the doctor passes, check the proxy or add {target['host']} to NO_PROXY",
            )
    else:
        if scheme not in ("http", "https") and target["tls"]:
            add(
                INFO,
                f"{source(target)}={target['configured']!r}: with a scheme other than http:// the gRPC exporter "
                "connects with TLS",
                f"use http://{host_for_url(target)}:{target['port']} for a plain-text collector, https:// for TLS",
            )
        if target["path"] not in ("", "/") and target["scheme"] in ("http", "https"):
            add(
                INFO,
                f"{source(target)} has a path ({target['path']}), "
                "which the gRPC exporter ignores: only host and port count",
                "drop the path",
            )
    return problems


def host_for_url(target: dict[str, Any]) -> str:
    host = target["host"] or "<host>"
    return f"[{host}]" if ":" in host else host


def address(target: dict[str, Any]) -> str:
    """``host:port`` as a URL writes it (an IPv6 host in brackets)."""
    return f"{host_for_url(target)}:{target['port']}"
