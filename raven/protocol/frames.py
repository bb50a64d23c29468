"""Frames: what a record payload carries (byte layouts in docs/protocol.md).

Every frame starts with an 8-byte header: type u8, flags u8, stream_id u32,
length u16 (big-endian), then ``length`` payload bytes. A record payload holds
one or more whole frames; a frame never spans two records.

:func:`parse_frames` meets any byte string by returning frames or raising
:class:`RemoteProtocolError`; nothing else escapes. Encoders raise
:class:`LocalProtocolError` for values our own code should never produce.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import FRAME_HEADER_BYTES, MAX_FRAME_PAYLOAD_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.frame_fields import (
    ENTRY_NODE,
    ENTRY_PREFIX,
    check_node_name,
    check_prefix,
    decode_node,
    decode_reason,
    encode_entries,
    encode_reason,
    encode_refused,
    read_entries,
)
from raven.protocol.names import MAX_REPLICAS, replica_id_error


class FrameType(enum.IntEnum):
    """Frame type byte. Values are wire format: never renumber."""

    DATA = 0
    OPEN = 1
    OPEN_RESULT = 2
    CREDIT = 3
    END = 4
    RESET = 5
    DATAGRAM = 6
    PING = 7
    PONG = 8
    REGISTER = 9
    REGISTER_RESULT = 10
    GOAWAY = 11
    CLOSE = 12
    REPLICA = 13

    @property
    def label(self) -> str:
        """The type's name in metrics and stats (one string per type, shared by all tunnels)."""
        return _LABELS[self]


_LABELS = {t: t.name.lower() for t in FrameType}


#: REGISTER / REGISTER_RESULT: this chunk completes the set.
FLAG_FINAL = 0x01
#: OPEN: the stream's first data rides with it (node name length u8 and the data follow the port).
FLAG_OPEN_DATA = 0x02
#: Most data an OPEN may carry. It counts against the stream's receive window, and every stream
#: a peer accepts gets at least this much window (``stream_table.MIN_STREAM_WINDOW_BYTES``).
MAX_OPEN_DATA_BYTES = 16 * 1024
#: Largest stream id (u32); 0 is the connection itself.
MAX_STREAM_ID = 0xFFFFFFFF
#: PING/PONG carry this many opaque bytes.
PING_OPAQUE_BYTES = 8
#: Largest CREDIT increment (u32).
MAX_CREDIT_INCREMENT = 0xFFFFFFFF

HEADER = struct.Struct(">BBIH")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_OPEN_DATA_HEAD = struct.Struct(">HB")  # port, node name length


@dataclass(frozen=True, slots=True)
class DataFrame:
    TYPE: ClassVar[FrameType] = FrameType.DATA
    stream_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OpenFrame:
    TYPE: ClassVar[FrameType] = FrameType.OPEN
    stream_id: int
    node: str
    port: int
    #: the stream's first bytes (at most MAX_OPEN_DATA_BYTES), counted against its window
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class OpenResultFrame:
    TYPE: ClassVar[FrameType] = FrameType.OPEN_RESULT
    stream_id: int
    code: StreamCode
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CreditFrame:
    TYPE: ClassVar[FrameType] = FrameType.CREDIT
    stream_id: int
    increment: int


@dataclass(frozen=True, slots=True)
class EndFrame:
    TYPE: ClassVar[FrameType] = FrameType.END
    stream_id: int


@dataclass(frozen=True, slots=True)
class ResetFrame:
    TYPE: ClassVar[FrameType] = FrameType.RESET
    stream_id: int
    code: StreamCode
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DatagramFrame:
    TYPE: ClassVar[FrameType] = FrameType.DATAGRAM
    data: bytes


@dataclass(frozen=True, slots=True)
class PingFrame:
    TYPE: ClassVar[FrameType] = FrameType.PING
    opaque: bytes


@dataclass(frozen=True, slots=True)
class PongFrame:
    TYPE: ClassVar[FrameType] = FrameType.PONG
    opaque: bytes


@dataclass(frozen=True, slots=True)
class RegisterFrame:
    TYPE: ClassVar[FrameType] = FrameType.REGISTER
    nodes: tuple[str, ...]
    prefixes: tuple[str, ...]
    final: bool


@dataclass(frozen=True, slots=True)
class RegisterResultFrame:
    TYPE: ClassVar[FrameType] = FrameType.REGISTER_RESULT
    accepted_nodes: tuple[str, ...]
    accepted_prefixes: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    final: bool


@dataclass(frozen=True, slots=True)
class GoAwayFrame:
    TYPE: ClassVar[FrameType] = FrameType.GOAWAY
    code: CloseCode
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CloseFrame:
    TYPE: ClassVar[FrameType] = FrameType.CLOSE
    code: CloseCode
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaFrame:
    """Which gateway replica this tunnel reached, and how many replicas serve the same
    address. The agent's empty one asks (``replica_id`` ""), the gateway's answers, then again
    whenever its count changes (docs/protocol.md, "Gateway replicas")."""

    TYPE: ClassVar[FrameType] = FrameType.REPLICA
    replica_id: str = ""
    replicas: int = 0

    @property
    def is_question(self) -> bool:
        return not self.replica_id


Frame = (
    DataFrame
    | OpenFrame
    | OpenResultFrame
    | CreditFrame
    | EndFrame
    | ResetFrame
    | DatagramFrame
    | PingFrame
    | PongFrame
    | RegisterFrame
    | RegisterResultFrame
    | GoAwayFrame
    | CloseFrame
    | ReplicaFrame
)

_STREAM_TYPES = frozenset(
    {
        FrameType.DATA,
        FrameType.OPEN,
        FrameType.OPEN_RESULT,
        FrameType.CREDIT,
        FrameType.END,
        FrameType.RESET,
    }
)
#: The one flag each frame type may carry (0: none).
_TYPE_FLAG = {FrameType.REGISTER: FLAG_FINAL, FrameType.REGISTER_RESULT: FLAG_FINAL,
              FrameType.OPEN: FLAG_OPEN_DATA}  # fmt: skip


# --------------------------------------------------------------------------- text helpers


# --------------------------------------------------------------------------- encoding


def encode_header(ftype: FrameType, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(ftype, flags, stream_id, length)


def encode_data_header(stream_id: int, length: int) -> bytes:
    """Header of a DATA frame whose ``length`` payload bytes follow (the hot path)."""
    return HEADER.pack(FrameType.DATA, 0, stream_id, length)


def _frame(ftype: FrameType, stream_id: int, body: bytes, flags: int = 0) -> bytes:
    if len(body) > MAX_FRAME_PAYLOAD_BYTES:
        raise LocalProtocolError(f"{ftype.label} frame payload of {len(body)} bytes is too big")
    return HEADER.pack(ftype, flags, stream_id, len(body)) + body


def _check_stream_id(stream_id: int) -> None:
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise LocalProtocolError(f"stream id {stream_id} out of range")


def encode_frame(frame: Frame) -> bytes:
    """Encode one frame (header + payload)."""
    if isinstance(frame, DataFrame):
        _check_stream_id(frame.stream_id)
        return _frame(FrameType.DATA, frame.stream_id, bytes(frame.data))
    if isinstance(frame, OpenFrame):
        _check_stream_id(frame.stream_id)
        if not 0 < frame.port <= 0xFFFF:
            raise LocalProtocolError(f"port {frame.port} out of range")
        node = check_node_name(frame.node).encode("ascii")
        if not frame.data:
            return _frame(FrameType.OPEN, frame.stream_id, _U16.pack(frame.port) + node)
        if len(frame.data) > MAX_OPEN_DATA_BYTES:
            raise LocalProtocolError(f"OPEN data of {len(frame.data)} bytes is too big")
        body = _OPEN_DATA_HEAD.pack(frame.port, len(node)) + node + bytes(frame.data)
        return _frame(FrameType.OPEN, frame.stream_id, body, FLAG_OPEN_DATA)
    if isinstance(frame, OpenResultFrame | ResetFrame):
        _check_stream_id(frame.stream_id)
        body = _U8.pack(frame.code) + encode_reason(frame.reason)
        return _frame(frame.TYPE, frame.stream_id, body)
    if isinstance(frame, CreditFrame):
        _check_stream_id(frame.stream_id)
        if not 0 < frame.increment <= MAX_CREDIT_INCREMENT:
            raise LocalProtocolError(f"credit increment {frame.increment} out of range")
        return _frame(FrameType.CREDIT, frame.stream_id, _U32.pack(frame.increment))
    if isinstance(frame, EndFrame):
        _check_stream_id(frame.stream_id)
        return _frame(FrameType.END, frame.stream_id, b"")
    if isinstance(frame, DatagramFrame):
        if not frame.data:
            raise LocalProtocolError("empty datagram")
        return _frame(FrameType.DATAGRAM, 0, bytes(frame.data))
    if isinstance(frame, PingFrame | PongFrame):
        if len(frame.opaque) != PING_OPAQUE_BYTES:
            raise LocalProtocolError("ping opaque data must be 8 bytes")
        return _frame(frame.TYPE, 0, bytes(frame.opaque))
    if isinstance(frame, GoAwayFrame | CloseFrame):
        return _frame(frame.TYPE, 0, _U8.pack(frame.code) + encode_reason(frame.reason))
    if isinstance(frame, RegisterFrame):
        body = encode_entries(ENTRY_NODE, frame.nodes, check_node_name)
        body += encode_entries(ENTRY_PREFIX, frame.prefixes, check_prefix)
        return _frame(FrameType.REGISTER, 0, body, FLAG_FINAL if frame.final else 0)
    if isinstance(frame, RegisterResultFrame):
        body = encode_entries(ENTRY_NODE, frame.accepted_nodes, check_node_name)
        body += encode_entries(ENTRY_PREFIX, frame.accepted_prefixes, check_prefix)
        body += b"".join(encode_refused(entry, reason) for entry, reason in frame.refused)
        return _frame(FrameType.REGISTER_RESULT, 0, body, FLAG_FINAL if frame.final else 0)
    if isinstance(frame, ReplicaFrame):
        if frame.is_question:
            return _frame(FrameType.REPLICA, 0, b"")
        if replica_id_error(frame.replica_id) is not None or not 0 < frame.replicas <= MAX_REPLICAS:
            raise LocalProtocolError(f"bad replica announcement {frame!r}")
        body = _U16.pack(frame.replicas) + frame.replica_id.encode("ascii")
        return _frame(FrameType.REPLICA, 0, body)
    raise LocalProtocolError(f"not a frame: {frame!r}")  # pragma: no cover


# --------------------------------------------------------------------------- parsing


def parse_frames(payload: bytes) -> list[Frame]:
    """Parse a record payload into frames, or raise RemoteProtocolError."""
    frames: list[Frame] = []
    total = len(payload)
    offset = 0
    unpack = HEADER.unpack_from
    while offset < total:
        if total - offset < FRAME_HEADER_BYTES:
            raise RemoteProtocolError("truncated frame header")
        ftype, flags, stream_id, length = unpack(payload, offset)
        offset += FRAME_HEADER_BYTES
        end = offset + length
        if end > total:
            raise RemoteProtocolError("frame runs past the end of its record")
        if ftype == FrameType.DATA:  # hot path
            if flags or not stream_id:
                raise RemoteProtocolError("bad DATA frame header")
            frames.append(DataFrame(stream_id, payload[offset:end]))
        else:
            frames.append(_decode(ftype, flags, stream_id, payload[offset:end]))
        offset = end
    return frames


_DATA_VALUE = int(FrameType.DATA)


def lone_data(payload: bytes) -> tuple[int, bytes] | None:
    """(stream id, data) of a record payload that is exactly one well-formed DATA frame (what
    :func:`parse_frames` makes one DataFrame of); None for anything else, which
    :func:`parse_frames` then takes (and refuses, if malformed). A stream's bulk arrives so,
    a record at a time: no Frame object, no list, no backlog for it."""
    if len(payload) < FRAME_HEADER_BYTES or payload[0] != _DATA_VALUE:
        return None
    _, flags, stream_id, length = HEADER.unpack_from(payload, 0)
    if flags or not stream_id or length != len(payload) - FRAME_HEADER_BYTES:
        return None
    return stream_id, payload[FRAME_HEADER_BYTES:]


def _decode(ftype_value: int, flags: int, stream_id: int, body: bytes) -> Frame:
    try:
        ftype = FrameType(ftype_value)
    except ValueError:
        raise RemoteProtocolError(f"unknown frame type {ftype_value}") from None
    allowed = _TYPE_FLAG.get(ftype, 0)
    if flags & ~allowed:
        raise RemoteProtocolError(f"unknown flags {flags:#x} on {ftype.label} frame")
    if (ftype in _STREAM_TYPES) != (stream_id != 0):
        raise RemoteProtocolError(f"bad stream id {stream_id} on {ftype.label} frame")
    return _DECODERS[ftype](stream_id, body, bool(flags & allowed))


def _stream_code(value: int) -> StreamCode:
    try:
        return StreamCode(value)
    except ValueError:
        raise RemoteProtocolError(f"unknown stream code {value}") from None


def _close_code(value: int) -> CloseCode:
    try:
        return CloseCode(value)
    except ValueError:
        raise RemoteProtocolError(f"unknown close code {value}") from None


def _need(body: bytes, size: int, what: str) -> None:
    if len(body) < size:
        raise RemoteProtocolError(f"{what} frame too short")


def _d_open(stream_id: int, body: bytes, with_data: bool) -> Frame:
    _need(body, 3, "OPEN")
    (port,) = _U16.unpack_from(body)
    if port == 0:
        raise RemoteProtocolError("OPEN to port 0")
    if not with_data:
        return OpenFrame(stream_id, decode_node(body[2:]), port)
    _need(body, 4, "OPEN")
    end = 3 + body[2]
    data = body[end:]
    if not body[2] or not data or len(data) > MAX_OPEN_DATA_BYTES:
        raise RemoteProtocolError("OPEN data (or its node name) empty or too big")
    return OpenFrame(stream_id, decode_node(body[3:end]), port, data)


def _d_open_result(stream_id: int, body: bytes, _final: bool) -> Frame:
    _need(body, 1, "OPEN_RESULT")
    return OpenResultFrame(stream_id, _stream_code(body[0]), decode_reason(body[1:]))


def _d_credit(stream_id: int, body: bytes, _final: bool) -> Frame:
    if len(body) != 4:
        raise RemoteProtocolError("CREDIT frame must carry 4 bytes")
    (increment,) = _U32.unpack(body)
    if increment == 0:
        raise RemoteProtocolError("CREDIT of zero bytes")
    return CreditFrame(stream_id, increment)


def _d_end(stream_id: int, body: bytes, _final: bool) -> Frame:
    if body:
        raise RemoteProtocolError("END frame with a payload")
    return EndFrame(stream_id)


def _d_reset(stream_id: int, body: bytes, _final: bool) -> Frame:
    _need(body, 1, "RESET")
    return ResetFrame(stream_id, _stream_code(body[0]), decode_reason(body[1:]))


def _d_datagram(_stream_id: int, body: bytes, _final: bool) -> Frame:
    if not body:
        raise RemoteProtocolError("empty DATAGRAM frame")
    return DatagramFrame(body)


def _opaque(body: bytes, what: str) -> bytes:
    if len(body) != PING_OPAQUE_BYTES:
        raise RemoteProtocolError(f"{what} frame must carry 8 bytes")
    return body


def _close_body(body: bytes, what: str) -> tuple[CloseCode, str]:
    _need(body, 1, what)
    return _close_code(body[0]), decode_reason(body[1:])


def _d_replica(_stream_id: int, body: bytes, _final: bool) -> Frame:
    if not body:
        return ReplicaFrame()
    _need(body, 3, "REPLICA")
    (replicas,) = _U16.unpack_from(body)
    replica_id = body[2:].decode("ascii", "replace")
    if replicas == 0 or replica_id_error(replica_id) is not None:
        raise RemoteProtocolError("REPLICA frame with no replicas or a bad replica id")
    return ReplicaFrame(replica_id, replicas)


def _d_register(_stream_id: int, body: bytes, final: bool) -> Frame:
    nodes, prefixes, _ = read_entries(body, result=False)
    return RegisterFrame(tuple(nodes), tuple(prefixes), final)


def _d_register_result(_stream_id: int, body: bytes, final: bool) -> Frame:
    nodes, prefixes, refused = read_entries(body, result=True)
    return RegisterResultFrame(tuple(nodes), tuple(prefixes), tuple(refused), final)


_DECODERS: dict[FrameType, Callable[[int, bytes, bool], Frame]] = {
    FrameType.OPEN: _d_open,
    FrameType.OPEN_RESULT: _d_open_result,
    FrameType.CREDIT: _d_credit,
    FrameType.END: _d_end,
    FrameType.RESET: _d_reset,
    FrameType.DATAGRAM: _d_datagram,
    FrameType.PING: lambda _s, body, _f: PingFrame(_opaque(body, "PING")),
    FrameType.PONG: lambda _s, body, _f: PongFrame(_opaque(body, "PONG")),
    FrameType.REGISTER: _d_register,
    FrameType.REPLICA: _d_replica,
    FrameType.REGISTER_RESULT: _d_register_result,
    FrameType.GOAWAY: lambda _s, body, _f: GoAwayFrame(*_close_body(body, "GOAWAY")),
    FrameType.CLOSE: lambda _s, body, _f: CloseFrame(*_close_body(body, "CLOSE")),
}
