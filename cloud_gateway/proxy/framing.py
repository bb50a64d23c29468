"""Sans-IO body framing: where does a message body end?

The proxy forwards body bytes unchanged (chunked stays chunked, gzip stays gzip); a framer only
counts, so that the proxy knows when a response is complete (keep-alive) or was cut short
(the client must see it incomplete). ``feed(data)`` returns how many leading bytes of ``data``
belong to the body; the rest, if any, follows the body. Only :class:`HttpParseError` escapes.
There are no per-byte loops: chunk data is skipped by arithmetic, lines are found with ``find``.
"""

from __future__ import annotations

import enum
import re

from cloud_gateway.proxy.errors import ErrorKind, HttpParseError
from cloud_gateway.proxy.heads import BodyKind

#: Longest chunk-size line (size + extensions) accepted.
MAX_CHUNK_LINE_BYTES = 4096
#: Most trailer bytes accepted after the last chunk.
MAX_TRAILER_BYTES = 16384
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\Z")


class BodyFramer:
    """Base: a body that has already ended (no body)."""

    done = True

    def feed(self, data: bytes) -> int:
        return 0

    def finish(self) -> bool:
        """The connection ended here: True if that completes the body (close-delimited)."""
        return self.done


class LengthFramer(BodyFramer):
    """``Content-Length: n``."""

    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes) -> int:
        take = min(self.remaining, len(data))
        self.remaining -= take
        self.done = self.remaining == 0
        return take


class CloseFramer(BodyFramer):
    """The body runs until the connection closes; every byte belongs to it."""

    def __init__(self) -> None:
        self.done = False

    def feed(self, data: bytes) -> int:
        return len(data)

    def finish(self) -> bool:
        self.done = True
        return True


class _Chunk(enum.Enum):
    SIZE = 1
    DATA = 2
    DATA_END = 3
    TRAILER = 4
    DONE = 5


class ChunkedFramer(BodyFramer):
    """``Transfer-Encoding: chunked`` (RFC 9112 section 7.1), counted, not decoded."""

    def __init__(self, error: ErrorKind = ErrorKind.MALFORMED) -> None:
        self.done = False
        self._state = _Chunk.SIZE
        self._line = bytearray()
        self._remaining = 0
        self._crlf = 0
        self._trailer_bytes = 0
        self._error = error

    def feed(self, data: bytes) -> int:
        pos, end = 0, len(data)
        while pos < end and self._state is not _Chunk.DONE:
            state = self._state
            if state is _Chunk.DATA:
                take = min(self._remaining, end - pos)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state, self._crlf = _Chunk.DATA_END, 0
            elif state is _Chunk.DATA_END:
                while self._crlf < 2 and pos < end:
                    if data[pos] != b"\r\n"[self._crlf]:
                        raise HttpParseError(self._error, "chunk data not followed by CRLF")
                    pos += 1
                    self._crlf += 1
                if self._crlf == 2:
                    self._state = _Chunk.SIZE
            else:
                pos = self._feed_line(data, pos)
        self.done = self._state is _Chunk.DONE
        return pos

    def _feed_line(self, data: bytes, pos: int) -> int:
        limit = MAX_CHUNK_LINE_BYTES if self._state is _Chunk.SIZE else MAX_TRAILER_BYTES
        nl = data.find(b"\n", pos)
        stop = len(data) if nl < 0 else nl + 1
        self._line += data[pos:stop]
        if len(self._line) > limit:
            raise HttpParseError(self._error, "chunk line too long")
        if nl < 0:
            return stop
        line = bytes(self._line)
        self._line.clear()
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            raise HttpParseError(self._error, "bad line ending in chunked body")
        line = line[:-2]
        if self._state is _Chunk.SIZE:
            match = _CHUNK_SIZE.match(line)
            if match is None:
                raise HttpParseError(self._error, "invalid chunk size")
            size = int(match.group(1), 16)
            self._state = _Chunk.DATA if size else _Chunk.TRAILER
            self._remaining = size
        elif not line:
            self._state = _Chunk.DONE
        else:
            self._trailer_bytes += len(line) + 2
            if self._trailer_bytes > MAX_TRAILER_BYTES or b":" not in line:
                raise HttpParseError(self._error, "invalid chunked trailer")
        return stop


def framer_for(kind: BodyKind, length: int, error: ErrorKind) -> BodyFramer:
    """The framer for a parsed head's body."""
    if kind is BodyKind.LENGTH:
        return LengthFramer(length)
    if kind is BodyKind.CHUNKED:
        return ChunkedFramer(error)
    if kind is BodyKind.CLOSE:
        return CloseFramer()
    return BodyFramer()


def chunk(data: bytes) -> list[bytes]:
    """``data`` as one chunk of a chunked body (for re-framing close-delimited responses)."""
    return [b"%x\r\n" % len(data), data, b"\r\n"]


#: The last chunk of a chunked body with no trailers.
LAST_CHUNK = b"0\r\n\r\n"
