"""The DATAGRAM fast path on receive: L3 packets out of a record without the generic decoder.

A record payload made only of DATAGRAM frames (what an L3 flow sends) is split by
:func:`split_datagrams` into its packets, with no Frame objects, no FrameType lookups and
no per-frame dispatch; anything else (another frame type, a malformed header, a frame
running past the record) returns None and the payload takes the generic path
(:func:`raven.protocol.frames.parse_frames`), which raises the same errors as always. A
valid DATAGRAM-only payload decodes to the same packets both ways (tested by fuzzing).

:class:`DatagramInbox` hands received packets on: to a ``sink`` callable when the I/O layer
set one (the tunnel's ``on_datagram``: one call per packet, no event object), else as
:class:`~raven.protocol.events.DatagramReceived` events. Counters are bumped once per
record, not once per packet.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from raven.protocol.constants import FRAME_HEADER_BYTES
from raven.protocol.event_queue import EventQueue
from raven.protocol.events import DatagramReceived
from raven.protocol.frames import HEADER, FrameType
from raven.protocol.stats import TunnelStats

__all__ = ["DatagramInbox", "DatagramSink", "datagram_header", "lone_datagram", "split_datagrams"]

DatagramSink = Callable[[bytes], None]

_DATAGRAM = int(FrameType.DATAGRAM)
_HEADER_UNPACK = HEADER.unpack_from
_HEADER_PACK = HEADER.pack


#: ``datagram_header(size)``: the header of a DATAGRAM frame carrying ``size`` bytes (1 to
#: MAX_FRAME_PAYLOAD_BYTES); a partial of the frame header's pack (a C call, no Python frame)
datagram_header: Callable[[int], bytes] = partial(_HEADER_PACK, _DATAGRAM, 0, 0)


def lone_datagram(payload: bytes) -> bytes | None:
    """The packet of a payload that is exactly one well-formed DATAGRAM frame, else None
    (the same verdict as :func:`split_datagrams` for a payload of one frame)."""
    if len(payload) <= FRAME_HEADER_BYTES or payload[0] != _DATAGRAM:
        return None
    _, flags, stream_id, length = _HEADER_UNPACK(payload, 0)
    if flags or stream_id or length != len(payload) - FRAME_HEADER_BYTES:
        return None
    return payload[FRAME_HEADER_BYTES:]


def split_datagrams(payload: bytes) -> list[bytes] | None:
    """The packets of a payload made only of well-formed DATAGRAM frames, else None."""
    total = len(payload)
    if total <= FRAME_HEADER_BYTES or payload[0] != _DATAGRAM:
        return None  # the common non-L3 record is rejected at its first byte
    packets: list[bytes] = []
    offset = 0
    while offset < total:
        if total - offset < FRAME_HEADER_BYTES:
            return None
        ftype, flags, stream_id, length = _HEADER_UNPACK(payload, offset)
        if ftype != _DATAGRAM or flags or stream_id or not length:
            return None
        offset += FRAME_HEADER_BYTES
        end = offset + length
        if end > total:
            return None
        packets.append(payload[offset:end])
        offset = end
    return packets


class DatagramInbox:
    """Delivers received DATAGRAM packets (see the module docstring)."""

    __slots__ = ("_events", "_max_bytes", "_stats", "sink")

    def __init__(self, events: EventQueue, stats: TunnelStats, max_bytes: int) -> None:
        self._events = events
        self._stats = stats
        self._max_bytes = max_bytes
        #: receives each packet instead of a DatagramReceived event when set
        self.sink: DatagramSink | None = None

    def receive(self, data: bytes) -> None:
        """One DATAGRAM frame's packet from the generic path."""
        self.receive_all([data], count_frames=False)

    def receive_all(self, packets: list[bytes], *, count_frames: bool = True) -> None:
        """The packets of one DATAGRAM-only record (counted as frames received too)."""
        stats = self._stats
        if count_frames:
            received = stats.frames_received
            received["datagram"] = received.get("datagram", 0) + len(packets)
        stats.datagrams_received += len(packets)
        limit = self._max_bytes
        sink = self.sink
        for packet in packets:
            if len(packet) > limit:
                stats.datagrams_received -= 1
                stats.count_drop("oversize_received")
            elif sink is None:
                self._events.append(DatagramReceived(packet))
            else:
                sink(packet)
