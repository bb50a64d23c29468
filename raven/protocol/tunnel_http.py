"""The two HTTP/1.1 exchanges a tunnel may need before its handshake: an HTTP ``CONNECT``
through a forward proxy and a WebSocket ``Upgrade`` (RFC 6455 section 4).

Sans-IO: :func:`connect_request` and :func:`upgrade_request` write the agent's requests and
:class:`ResponseHead` reads what comes back; the gateway reads the upgrade with
:class:`RequestHead` and answers with :func:`upgrade_response`. Each reader says, once the
head is complete, its first line, its headers and what followed the head (the first bytes of
the next layer). Heads are bounded (``MAX_HEAD_BYTES``): a peer that sends more, or garbage,
gets :class:`HttpHeadError` and the connection is closed.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

__all__ = [
    "MAX_HEAD_BYTES",
    "WEBSOCKET_GUID",
    "HttpHeadError",
    "RequestHead",
    "ResponseHead",
    "connect_request",
    "error_response",
    "upgrade_request",
    "upgrade_response",
    "websocket_accept",
]

#: Largest response head accepted (status line and headers).
MAX_HEAD_BYTES = 16 * 1024
#: RFC 6455 section 1.3: appended to Sec-WebSocket-Key before hashing.
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: Most headers accepted in a response head.
_MAX_HEADERS = 100


class HttpHeadError(ValueError):
    """The peer's answer is not an HTTP/1.x response head we can use."""


def refusal_label(status: int) -> str:
    """The metric label of a refusal with HTTP ``status``."""
    if status == 407:
        return "auth_required"
    if status in (401, 403):
        return "forbidden"
    if status in (502, 503, 504):
        return "bad_gateway"
    return "error"


def _clean(text: str) -> str:
    """A header value or authority must not break the head (no CR, LF or NUL)."""
    if any(c in text for c in "\r\n\0"):
        raise ValueError(f"{text[:40]!r}: control characters in an HTTP head")
    return text


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect_request(host: str, port: int, proxy_authorization: str | None = None) -> bytes:
    """``CONNECT host:port`` (RFC 9110 section 9.3.6) with an optional Basic credential
    (``user:password``): what goes to the proxy before the tunnel's own bytes."""
    authority = _clean(_authority(host, port))
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy_authorization is not None:
        token = base64.b64encode(_clean(proxy_authorization).encode("utf-8")).decode("ascii")
        lines.append(f"Proxy-Authorization: Basic {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


def websocket_accept(key: str) -> str:
    """The Sec-WebSocket-Accept value a server answers ``key`` with."""
    import hashlib  # here: a plain agent never loads OpenSSL's hashes (its RSS)

    digest = hashlib.sha1((key + WEBSOCKET_GUID).encode("ascii")).digest()  # noqa: S324 (RFC 6455)
    return base64.b64encode(digest).decode("ascii")


def upgrade_request(
    host: str, path: str, key: str, *, subprotocol: str, extra_headers: dict[str, str]
) -> bytes:
    """The WebSocket opening handshake (``GET path``, ``Upgrade: websocket``); ``key`` is 16
    random bytes, base64."""
    lines = [
        f"GET {_clean(path)} HTTP/1.1",
        f"Host: {_clean(host)}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"Sec-WebSocket-Protocol: {subprotocol}",
        "User-Agent: raven-agent",
    ]
    lines += [f"{_clean(k)}: {_clean(v)}" for k, v in extra_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


@dataclass
class ResponseHead:
    """Reads one HTTP/1.x response head from the bytes fed to it."""

    #: what the head must start with (a request's method, a response's version)
    START = (b"HTTP/",)
    buf: bytearray = field(default_factory=bytearray)
    status: int = 0
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: bytes that arrived after the head (the next layer's)
    rest: bytes = b""
    done: bool = False

    def feed(self, data: bytes) -> bool:
        """Add bytes; True once the head is complete. HttpHeadError for garbage or a head
        over MAX_HEAD_BYTES."""
        if self.done:
            self.rest += data
            return True
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise HttpHeadError(f"response head over {MAX_HEAD_BYTES} bytes")
            if len(self.buf) >= 5 and not self.buf.startswith(self.START):
                raise HttpHeadError("not HTTP")
            return False
        if end > MAX_HEAD_BYTES:
            raise HttpHeadError(f"response head over {MAX_HEAD_BYTES} bytes")
        head, self.rest = bytes(self.buf[:end]), bytes(self.buf[end + 4 :])
        self.buf.clear()
        self._parse(head.decode("latin-1"))
        self.done = True
        return True

    def _parse(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        self._start_line(status_line)
        self._headers(lines)

    def _start_line(self, status_line: str) -> None:
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.0", "HTTP/1.1") or not parts[1].isdigit():
            raise HttpHeadError(f"bad status line {status_line[:80]!r}")
        self.status = int(parts[1])
        if not 100 <= self.status <= 599:
            raise HttpHeadError(f"bad status {self.status}")
        self.reason = (
            "".join(c if c.isprintable() else "?" for c in parts[2][:80]) if len(parts) > 2 else ""
        )

    def _headers(self, lines: list[str]) -> None:
        if len(lines) > _MAX_HEADERS:
            raise HttpHeadError(f"more than {_MAX_HEADERS} headers")
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpHeadError(f"bad header line {line[:80]!r}")
            self.headers[name.lower()] = value.strip()

    def header_has(self, name: str, token: str) -> bool:
        """Does header ``name`` list ``token`` (comma-separated, case-insensitive)?"""
        value = self.headers.get(name.lower(), "")
        return token.lower() in (t.strip().lower() for t in value.split(","))

    def what(self) -> str:
        """``407 Proxy Authentication Required``, for logs."""
        return f"{self.status} {self.reason}".strip()


@dataclass
class RequestHead(ResponseHead):
    """Reads one HTTP/1.1 request head (the gateway's side of a WebSocket upgrade)."""

    START = (b"GET ",)
    method: str = ""
    target: str = ""

    def _start_line(self, line: str) -> None:
        parts = line.split(" ")
        if len(parts) != 3 or parts[2] != "HTTP/1.1" or not parts[1].startswith("/"):
            raise HttpHeadError(f"bad request line {line[:80]!r}")
        self.method, self.target = parts[0], parts[1]

    def upgrade_error(self, path: str, subprotocol: str) -> tuple[int, str] | None:
        """Why this is not a tunnel's WebSocket upgrade to ``path``: (HTTP status, reason),
        or None when it is."""
        if self.target.split("?", 1)[0] != path:
            return 404, f"no WebSocket endpoint at {self.target[:80]}"
        if not self.header_has("upgrade", "websocket") or not self.header_has(
            "connection", "upgrade"
        ):
            return 426, "a WebSocket upgrade is required"
        if self.headers.get("sec-websocket-version") != "13":
            return 426, "WebSocket version 13 is required"
        key = self.headers.get("sec-websocket-key", "")
        try:
            if len(base64.b64decode(key, validate=True)) != 16:
                raise ValueError
        except ValueError:
            return 400, "bad Sec-WebSocket-Key"
        if not self.header_has("sec-websocket-protocol", subprotocol):
            return 400, f"the {subprotocol} subprotocol is required"
        return None


def upgrade_response(key: str, subprotocol: str) -> bytes:
    """``101 Switching Protocols`` for a valid upgrade with ``key``."""
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {websocket_accept(key)}\r\n"
        f"Sec-WebSocket-Protocol: {subprotocol}\r\n\r\n"
    ).encode("ascii")


def error_response(status: int, reason: str) -> bytes:
    """A short plain-text refusal that closes the connection."""
    body = (reason + "\n").encode("utf-8")
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + body


_REASONS = {400: "Bad Request", 404: "Not Found", 426: "Upgrade Required", 503: "Unavailable"}
