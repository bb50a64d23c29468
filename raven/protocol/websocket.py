"""WebSocket framing (RFC 6455 section 5) for the tunnel's ``wss://`` transport, sans-IO.

The tunnel's bytes (Noise records, already encrypted end to end) ride in binary frames; the
load balancer in between sees only those. :func:`encode_frame` writes one frame (masked by
the client, as the RFC requires of it; the server's are not); :class:`FrameReader` is fed the
bytes that arrive and returns what they carry: stream bytes, pings to answer, a close. A
peer that breaks the framing rules (a text frame, reserved bits, an unmasked client frame,
an oversized frame) gets :class:`WebSocketError` and the connection is closed.

Intermediaries may re-fragment messages: every binary or continuation frame's payload is
simply the next bytes of the stream.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CLOSE",
    "MAX_FRAME_BYTES",
    "PING",
    "PONG",
    "FrameReader",
    "WebSocketError",
    "encode_frame",
    "mask_bytes",
]

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: Largest frame payload accepted: a tunnel record is at most 64 KiB plus its overhead; an
#: intermediary that merges frames stays well below this.
MAX_FRAME_BYTES = 1 << 20
#: RFC 6455 5.5: control frames carry at most 125 bytes and are never fragmented.
MAX_CONTROL_BYTES = 125
#: Close code for "going away" (a server shutting down, RFC 6455 7.4.1).
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_FIN = 0x80
_MASKED = 0x80


class WebSocketError(ValueError):
    """The peer broke the WebSocket framing rules."""


def _python_mask(mask: bytes, data: bytearray) -> None:
    """XOR ``data`` in place with the repeated 4-byte ``mask``: four strided slices, each
    through a 256-byte table (C-speed slicing and translate, no per-byte Python)."""
    for i, k in enumerate(mask):
        if k:
            data[i::4] = data[i::4].translate(_TABLES[k])


_TABLES = [bytes(b ^ k for b in range(256)) for k in range(256)]


class Masker:
    """The masking loop in use: ``_python_mask`` unless the adapter installs a compiled one
    (raven.transport.websocket_transport loads aiohttp's, about 50x faster)."""

    impl: Callable[[bytes, bytearray], None] = staticmethod(_python_mask)


MASKER = Masker()


def mask_bytes(mask: bytes, data: bytes | bytearray | memoryview) -> bytearray:
    """``data`` XOR the repeated ``mask`` (a new bytearray)."""
    out = bytearray(data)
    MASKER.impl(mask, out)
    return out


def encode_frame(
    payload: bytes | bytearray | memoryview, *, opcode: int = BINARY, mask_key: bytes | None
) -> bytes | bytearray:
    """One final frame; the client's are masked with ``mask_key`` (4 fresh random bytes per
    frame, RFC 6455 5.3: the adapter draws them), the server's are not (None)."""
    n = len(payload)
    mbit = _MASKED if mask_key is not None else 0
    if n < 126:
        head = bytes((_FIN | opcode, mbit | n))
    elif n < 1 << 16:
        head = bytes((_FIN | opcode, mbit | 126)) + _U16.pack(n)
    else:
        head = bytes((_FIN | opcode, mbit | 127)) + _U64.pack(n)
    if mask_key is None:
        return b"".join((head, payload))  # one copy of the payload
    frame = mask_bytes(mask_key, payload)  # one copy, masked in place ...
    frame[:0] = head + mask_key  # ... and the head put before it (a move, no new buffer)
    return frame


def close_payload(code: int, reason: str = "") -> bytes:
    return _U16.pack(code) + reason.encode("utf-8")[:120]


@dataclass(frozen=True, slots=True)
class Control:
    """A control frame received: PING (answer with PONG), PONG or CLOSE."""

    opcode: int
    payload: bytes


class FrameReader:
    """Reads frames from the bytes fed to it. ``masked``: the peer is a client (its frames
    must be masked); else a server (its frames must not be)."""

    def __init__(self, *, masked: bool, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._masked = masked
        self._max = max_frame_bytes
        self._buf = bytearray()
        self.closed = False

    def feed(self, data: bytes) -> tuple[list[bytes], list[Control]]:
        """The stream bytes and the control frames in what has arrived so far (a partial
        frame waits for more). WebSocketError when the framing is broken.

        A payload is read straight out of ``data`` when nothing was pending (the common
        case: a read of whole frames): one copy (two for a client's, unmasked in the first)."""
        if self.closed:
            return [], []
        buf = self._buf
        src: bytes | bytearray = data
        if buf:
            buf += data
            src = buf
        chunks: list[bytes] = []
        controls: list[Control] = []
        pos = 0
        with memoryview(src) as view:
            while (frame := self._next_frame(src, pos)) is not None:
                opcode, start, end = frame
                if self._masked:
                    payload = bytes(mask_bytes(bytes(view[start - 4 : start]), view[start:end]))
                else:
                    payload = view[start:end].tobytes()
                pos = end
                if opcode >= 0x8:
                    controls.append(Control(opcode, payload))
                    if opcode == CLOSE:
                        self.closed = True
                        break
                elif payload:
                    chunks.append(payload)
            if src is not buf and pos < len(data):
                buf += view[pos:]  # a partial frame waits for the rest
        if src is buf:
            del buf[:pos]
        return chunks, controls

    def _next_frame(self, buf: bytes | bytearray, pos: int) -> tuple[int, int, int] | None:
        """(opcode, payload start, payload end) of the whole frame at ``pos``, None while it
        is incomplete; WebSocketError for a frame that breaks the rules."""
        size = len(buf)
        if size - pos < 2:
            return None
        b0, b1 = buf[pos], buf[pos + 1]
        if b0 & 0x70:
            raise WebSocketError("reserved bits set (no extension was negotiated)")
        opcode = b0 & 0x0F
        if bool(b1 & _MASKED) != self._masked:
            raise WebSocketError(
                "unmasked frame from a client" if self._masked else "masked frame from a server"
            )
        n, head = b1 & 0x7F, 2
        if n == 126:
            if size - pos < 4:
                return None
            (n,), head = _U16.unpack_from(buf, pos + 2), 4
        elif n == 127:
            if size - pos < 10:
                return None
            (n,), head = _U64.unpack_from(buf, pos + 2), 10
        if opcode >= 0x8:
            if n > MAX_CONTROL_BYTES or not b0 & _FIN or opcode not in (CLOSE, PING, PONG):
                raise WebSocketError(f"control frame (opcode {opcode}) too long or fragmented")
        elif opcode not in (BINARY, CONTINUATION):
            raise WebSocketError(
                "text frame on a binary tunnel" if opcode == TEXT else f"opcode {opcode}"
            )
        if n > self._max:
            raise WebSocketError(f"frame of {n} bytes (at most {self._max})")
        start = pos + head + (4 if self._masked else 0)
        return (opcode, start, start + n) if start + n <= size else None
