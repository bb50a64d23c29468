"""Sans-IO HTTP/1.1 heads: find where a head ends (bounded), parse request and response heads.

Pure: no asyncio, no sockets. Any input either parses or raises :class:`HttpParseError`
(with :attr:`ErrorKind.MALFORMED` / :attr:`ErrorKind.HEADER_TOO_LARGE` for requests,
:attr:`ErrorKind.BAD_RESPONSE` for responses); nothing else escapes.

Strict where lenience lets requests be smuggled past a proxy: obs-fold, whitespace before a
colon, bare CR or LF, duplicate Host, Transfer-Encoding together with Content-Length,
repeated or listed Content-Length values and transfer codings other than ``chunked`` are refused.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from cloud_gateway.proxy.errors import ErrorKind, HttpParseError

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: A header block every line of which is ``token:value`` with no control character but HTAB
#: in the value: one match instead of two per line (the lines' checks below find the error).
_HEADER_LINE = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*"
_VALID_BLOCK = re.compile(_HEADER_LINE + rb"(?:\r\n" + _HEADER_LINE + rb")*")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f-\xff]")
_DIGITS = re.compile(rb"[0-9]{1,18}\Z")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?\Z")
_VERSIONS = {b"HTTP/1.1": (1, 1), b"HTTP/1.0": (1, 0)}
#: Empty lines tolerated before a request line (RFC 9112 section 2.2).
_MAX_LEADING_CRLF = 8


class BodyKind(enum.Enum):
    """How a message body is delimited (RFC 9112 section 6.3)."""

    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"  # responses only: the body ends when the connection does


Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class RequestHead:
    """A parsed request head. ``headers`` keeps names as sent; lookups are case-insensitive."""

    method: str
    target: str
    version: tuple[int, int]
    headers: Headers
    host: str | None
    body: BodyKind
    content_length: int
    keep_alive: bool
    connection_tokens: frozenset[bytes] = field(default_factory=frozenset)
    expect_continue: bool = False

    def header(self, name: bytes) -> bytes | None:
        """First value of header ``name`` (lower-case), or None."""
        return find_header(self.headers, name)


@dataclass(slots=True)
class ResponseHead:
    """A parsed response head from a target."""

    version: tuple[int, int]
    status: int
    reason: bytes
    headers: Headers
    body: BodyKind
    content_length: int
    connection_tokens: frozenset[bytes] = field(default_factory=frozenset)
    has_transfer_encoding: bool = False


def find_header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


class HeadReader:
    """A connection's receive buffer: yields complete heads, keeps the bytes after them.

    ``next_head`` raises ``HttpParseError(too_large)`` once ``max_bytes`` arrive without the
    blank line that ends a head, so a peer can never make it buffer more than that.
    """

    def __init__(self, max_bytes: int, too_large: ErrorKind = ErrorKind.HEADER_TOO_LARGE) -> None:
        self._buf = bytearray()
        self._max = max_bytes
        self._too_large = too_large
        self._scanned = 0

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def unread(self, data: bytes) -> None:
        """Put ``data`` back in front (bytes read past the end of a body)."""
        self._buf[:0] = data
        self._scanned = 0

    def take(self, max_bytes: int | None = None) -> bytes:
        """Remove and return up to ``max_bytes`` buffered bytes (all by default)."""
        n = len(self._buf) if max_bytes is None else min(max_bytes, len(self._buf))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._scanned = 0
        return out

    def next_head(self) -> bytes | None:
        """The next complete head (ending in CRLF CRLF), or None if more bytes are needed."""
        buf = self._buf
        skipped = 0
        while buf.startswith(b"\r\n") and skipped < _MAX_LEADING_CRLF:
            del buf[:2]
            skipped += 1
            self._scanned = 0
        start = max(0, self._scanned - 3)
        end = buf.find(b"\r\n\r\n", start)
        if end < 0:
            if buf.find(b"\n\n", max(0, start - 1)) >= 0:
                raise HttpParseError(ErrorKind.MALFORMED, "bare LF line ending")
            if len(buf) > self._max:
                raise HttpParseError(self._too_large, f"head exceeds {self._max} bytes")
            self._scanned = len(buf)
            return None
        end += 4
        if end > self._max:
            raise HttpParseError(self._too_large, f"head exceeds {self._max} bytes")
        head = bytes(buf[:end])
        del buf[:end]
        self._scanned = 0
        return head


def _split_headers(block: bytes, kind: ErrorKind) -> Headers:
    """The header lines of a head (``block``: between the start line's CRLF and the blank
    line) as (name, value) pairs; HttpParseError naming the first bad line."""
    if not block:
        return []
    lines = block.split(b"\r\n")
    if _VALID_BLOCK.fullmatch(block) is None:
        return _split_header_lines(lines, kind)  # raises, naming what is wrong
    headers: Headers = []
    for line in lines:
        name, _, value = line.partition(b":")
        headers.append((name, value.strip(b" \t")))
    return headers


def _split_header_lines(lines: list[bytes], kind: ErrorKind) -> Headers:
    headers: Headers = []
    for line in lines:
        if not line or line[0] in b" \t":
            raise HttpParseError(kind, "obsolete line folding")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise HttpParseError(kind, "invalid header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise HttpParseError(kind, "control character in header value")
        headers.append((name, value))
    return headers


def _tokens(value: bytes) -> list[bytes]:
    return [t.strip(b" \t").lower() for t in value.split(b",") if t.strip(b" \t")]


def _content_length(values: list[bytes], kind: ErrorKind) -> int:
    """Exactly one Content-Length with one value: a repeated or listed one (even with equal
    values, ``4, 4``) is refused, so no hop downstream can read it another way."""
    if len(values) != 1 or b"," in values[0]:
        raise HttpParseError(kind, "duplicate or conflicting Content-Length")
    item = values[0].strip(b" \t")
    if not _DIGITS.match(item):
        raise HttpParseError(kind, "invalid Content-Length")
    return int(item)


def _start_line(head: bytes, kind: ErrorKind) -> tuple[bytes, bytes]:
    """(start line, header block) of a head."""
    if not head.endswith(b"\r\n\r\n"):
        raise HttpParseError(kind, "head does not end with a blank line")
    start, _, block = head[:-4].partition(b"\r\n")
    return start, block


def parse_request_head(head: bytes) -> RequestHead:
    """Parse one request head (as returned by :meth:`HeadReader.next_head`)."""
    bad = ErrorKind.MALFORMED
    start, block = _start_line(head, bad)
    parts = start.split(b" ")
    if len(parts) != 3:
        raise HttpParseError(bad, "invalid request line")
    method, target, version_text = parts
    version = _VERSIONS.get(version_text)
    if version is None:
        raise HttpParseError(bad, "unsupported HTTP version")
    if not _TOKEN.match(method) or not target or _BAD_TARGET.search(target):
        raise HttpParseError(bad, "invalid request line")
    headers = _split_headers(block, bad)
    f = _framing(headers, bad, request=True)
    if len(f.hosts) > 1:
        raise HttpParseError(bad, "more than one Host header")
    body, length = _request_body(method, version, f.lengths, f.codings)
    tokens = frozenset(f.connection)
    keep_alive = b"close" not in tokens if version == (1, 1) else b"keep-alive" in tokens
    return RequestHead(
        method=method.decode("ascii"),
        target=target.decode("ascii"),
        version=version,
        headers=headers,
        host=f.hosts[0].decode("ascii", "replace") if f.hosts else None,
        body=body,
        content_length=length,
        keep_alive=keep_alive,
        connection_tokens=tokens,
        expect_continue=f.expect,
    )


class _Framing(NamedTuple):
    """The headers a head's framing and connection handling read, in order of appearance."""

    hosts: list[bytes]
    lengths: list[bytes]
    #: Transfer-Encoding codings; an empty field counts as one empty coding
    codings: list[bytes]
    connection: list[bytes]
    expect: bool
    has_transfer_encoding: bool


def _framing(headers: list[tuple[bytes, bytes]], bad: ErrorKind, *, request: bool) -> _Framing:
    """Sort out the framing headers of a request (Host and Expect too) or a response."""
    hosts: list[bytes] = []
    lengths: list[bytes] = []
    codings: list[bytes] = []
    connection: list[bytes] = []
    expect = has_te = False
    for name, value in headers:
        key = name.lower()
        if key == b"content-length":
            lengths.append(value)
        elif key == b"transfer-encoding":
            has_te = True
            codings.extend(_tokens(value) or [b""])
        elif key == b"connection":
            connection.extend(_tokens(value))
        elif request and key == b"host":
            hosts.append(value)
        elif request and key == b"expect":
            if value.lower() != b"100-continue":
                raise HttpParseError(bad, "unsupported Expect")
            expect = True
    return _Framing(hosts, lengths, codings, connection, expect, has_te)


def _request_body(
    method: bytes, version: tuple[int, int], lengths: list[bytes], codings: list[bytes]
) -> tuple[BodyKind, int]:
    bad = ErrorKind.MALFORMED
    if codings:
        if lengths:
            raise HttpParseError(bad, "both Transfer-Encoding and Content-Length")
        if version != (1, 1) or codings != [b"chunked"]:
            raise HttpParseError(bad, "unsupported Transfer-Encoding")
        if method == b"CONNECT":
            raise HttpParseError(bad, "CONNECT with a body")
        return BodyKind.CHUNKED, 0
    if lengths:
        length = _content_length(lengths, bad)
        if method == b"CONNECT" and length:
            raise HttpParseError(bad, "CONNECT with a body")
        return (BodyKind.LENGTH, length) if length else (BodyKind.NONE, 0)
    return BodyKind.NONE, 0


def parse_response_head(head: bytes, request_method: str) -> ResponseHead:
    """Parse a target's response head; framing follows RFC 9112 section 6.3."""
    bad = ErrorKind.BAD_RESPONSE
    start, block = _start_line(head, bad)
    match = _STATUS_LINE.match(start)
    if match is None:
        raise HttpParseError(bad, "invalid status line")
    version = (1, int(match.group(1)))
    status = int(match.group(2))
    headers = _split_headers(block, bad)
    f = _framing(headers, bad, request=False)
    has_te = f.has_transfer_encoding
    codings = [c for c in f.codings if c]  # an empty field adds no coding to a response's
    length = 0
    if request_method == "HEAD" or status < 200 or status in (204, 304):
        body = BodyKind.NONE
    elif has_te:
        body = BodyKind.CHUNKED if codings and codings[-1] == b"chunked" else BodyKind.CLOSE
    elif f.lengths:
        length = _content_length(f.lengths, bad)
        body = BodyKind.LENGTH if length else BodyKind.NONE
    else:
        body = BodyKind.CLOSE
    return ResponseHead(
        version=version,
        status=status,
        reason=match.group(3) or b"",
        headers=headers,
        body=body,
        content_length=length,
        connection_tokens=frozenset(f.connection),
        has_transfer_encoding=has_te,
    )
