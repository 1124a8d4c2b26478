"""What may leave the process about a URL.

Query strings carry API keys and task content, fragments carry client state, and
``user:password@`` carries credentials: none of them is ever recorded.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: object) -> tuple[str, str | None, int | None]:
    """Return ``(url without userinfo/query/fragment, host, port)`` for span attributes."""
    try:
        parts = urlsplit(str(url))
    except Exception:
        return "", None, None
    netloc = parts.netloc.rpartition("@")[2]
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a malformed port
        host, port = parts.hostname, None
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")), host, port
