"""Every way a proxied request can fail: HTTP status, reason phrase and metric label in one table.

The reason phrase goes on the status line (``HTTP/1.1 503 No Agent Connected``): Prometheus shows
the server's status line on its targets page, so an operator sees why a scrape failed without
reading gateway logs. The label is the ``reason`` of ``raven_proxy_errors_total``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raven.transport.stream import OpenFailure


@dataclass(frozen=True)
class _Row:
    status: int
    phrase: str
    #: seconds for a Retry-After header (load shedding: come back soon), or None
    retry_after_s: int | None = None


class ErrorKind(enum.Enum):
    """One failure; ``value`` is the metric label."""

    MALFORMED = "malformed"
    HEADER_TOO_LARGE = "header_too_large"
    HEADER_TIMEOUT = "header_timeout"
    IP_LITERAL = "ip_literal"
    BAD_TARGET = "bad_target"
    UNKNOWN_NODE = "unknown_node"
    NO_AGENT = "no_agent"
    PORT_NOT_ALLOWED = "port_not_allowed"
    TARGET_REFUSED = "target_refused"
    TARGET_UNREACHABLE = "target_unreachable"
    TARGET_TIMEOUT = "target_timeout"
    SCRAPE_TIMEOUT = "scrape_timeout"
    TARGET_RESET = "target_reset"
    BAD_RESPONSE = "bad_response"
    BUSY = "busy"
    DRAINING = "draining"
    TUNNEL_CLOSED = "tunnel_closed"
    INTERNAL = "internal"
    CLIENT_GONE = "client_gone"
    INCOMPLETE = "incomplete_response"
    BAD_CLIENT_HELLO = "bad_client_hello"
    CLIENT_LIMIT = "client_limit"
    CLIENT_NOT_ALLOWED = "client_not_allowed"
    CLIENT_PENALISED = "client_penalised"
    NODE_LIMIT = "node_limit"

    @property
    def status(self) -> int:
        return _TABLE[self].status

    @property
    def phrase(self) -> str:
        return _TABLE[self].phrase

    @property
    def retry_after_s(self) -> int | None:
        return _TABLE[self].retry_after_s

    @property
    def client_fault(self) -> bool:
        """True when the client sent something wrong (logged at INFO, not WARNING)."""
        return 400 <= self.status < 500


_TABLE: dict[ErrorKind, _Row] = {
    ErrorKind.MALFORMED: _Row(400, "Bad Request"),
    ErrorKind.HEADER_TOO_LARGE: _Row(431, "Request Header Fields Too Large"),
    ErrorKind.HEADER_TIMEOUT: _Row(408, "Request Timeout"),
    ErrorKind.IP_LITERAL: _Row(400, "IP Literal Not Allowed"),
    ErrorKind.BAD_TARGET: _Row(400, "Bad Target"),
    ErrorKind.UNKNOWN_NODE: _Row(404, "Unknown Node"),
    ErrorKind.NO_AGENT: _Row(503, "No Agent Connected"),
    ErrorKind.PORT_NOT_ALLOWED: _Row(403, "Port Not Allowed"),
    ErrorKind.TARGET_REFUSED: _Row(502, "Target Refused"),
    ErrorKind.TARGET_UNREACHABLE: _Row(502, "Target Unreachable"),
    ErrorKind.TARGET_TIMEOUT: _Row(504, "Target Timeout"),
    ErrorKind.SCRAPE_TIMEOUT: _Row(504, "Scrape Timeout"),
    ErrorKind.TARGET_RESET: _Row(502, "Target Reset"),
    ErrorKind.BAD_RESPONSE: _Row(502, "Bad Response From Target"),
    ErrorKind.BUSY: _Row(503, "Gateway Busy"),
    ErrorKind.DRAINING: _Row(503, "Draining"),
    ErrorKind.TUNNEL_CLOSED: _Row(503, "Tunnel Closed"),
    ErrorKind.INTERNAL: _Row(500, "Internal Error"),
    # No response can be sent for these two: the connection is cut (status for metrics only).
    ErrorKind.CLIENT_GONE: _Row(499, "Client Closed Request"),
    ErrorKind.INCOMPLETE: _Row(502, "Incomplete Response"),
    ErrorKind.BAD_CLIENT_HELLO: _Row(400, "Bad Client Hello"),
    ErrorKind.CLIENT_LIMIT: _Row(429, "Too Many Requests", retry_after_s=1),
    # Closed at accept without an answer (status for metrics only).
    ErrorKind.CLIENT_NOT_ALLOWED: _Row(403, "Client Not Allowed"),
    ErrorKind.CLIENT_PENALISED: _Row(429, "Too Many Requests"),
    ErrorKind.NODE_LIMIT: _Row(503, "Node Busy", retry_after_s=1),
}

#: How an opener's failure maps to a proxy error.
KIND_BY_OPEN_FAILURE: dict[OpenFailure, ErrorKind] = {
    OpenFailure.UNKNOWN_NODE: ErrorKind.UNKNOWN_NODE,
    OpenFailure.NO_AGENT: ErrorKind.NO_AGENT,
    OpenFailure.PORT_NOT_ALLOWED: ErrorKind.PORT_NOT_ALLOWED,
    OpenFailure.TARGET_REFUSED: ErrorKind.TARGET_REFUSED,
    OpenFailure.TARGET_UNREACHABLE: ErrorKind.TARGET_UNREACHABLE,
    OpenFailure.TARGET_TIMEOUT: ErrorKind.TARGET_TIMEOUT,
    OpenFailure.BUSY: ErrorKind.BUSY,
    OpenFailure.DRAINING: ErrorKind.DRAINING,
    OpenFailure.TUNNEL_CLOSED: ErrorKind.TUNNEL_CLOSED,
    OpenFailure.INTERNAL: ErrorKind.INTERNAL,
}


class ProxyError(Exception):
    """A request failed with ``kind``; ``detail`` is one human line for the body and the log."""

    def __init__(self, kind: ErrorKind, detail: str = "") -> None:
        super().__init__(f"{kind.value}: {detail}" if detail else kind.value)
        self.kind = kind
        self.detail = detail


class HttpParseError(ProxyError):
    """The peer's bytes are not acceptable HTTP/1.1 (the only error the parsers raise)."""


class ClientHelloError(ProxyError):
    """The bytes on a TLS listener are not a usable ClientHello (the SNI parser's only error)."""

    def __init__(self, detail: str) -> None:
        super().__init__(ErrorKind.BAD_CLIENT_HELLO, detail)


def error_response(kind: ErrorKind, detail: str, *, close: bool) -> bytes:
    """A complete ``text/plain`` error response: status, one-line reason body."""
    detail = "".join(ch if ch.isprintable() else " " for ch in detail[:300])
    line = f"{kind.value}: {detail}\n" if detail else f"{kind.value}\n"
    body = line.encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {kind.status} {kind.phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"X-Raven-Error: {kind.value}\r\n"
        "Cache-Control: no-store\r\n"
    )
    if kind.retry_after_s is not None:
        head += f"Retry-After: {kind.retry_after_s}\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode("ascii") + b"\r\n" + body
