"""The send side of the multiplexer: which frames go into the next record payload.

Order inside a payload: control frames first (in the order queued; while any is
left no data follows), then datagrams (the first always when it fits, more only
while half the payload is left for waiting streams), then stream data by deficit round robin with a
quantum of ``max_frame_payload_bytes``: one busy stream cannot starve the others,
and a stream whose turn was cut by the end of a payload continues in the next.

Bulk streams (``Stream.bulk``: the agent's backfill) have a ring of their own, served when
no other stream has data, and at least every ``BULK_EVERY`` payloads while others do: on a
thin link a backfill yields to live scrapes without ever stopping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from raven.protocol.constants import FRAME_HEADER_BYTES, MAX_RECORD_PAYLOAD_BYTES
from raven.protocol.frames import FrameType, encode_data_header, encode_header
from raven.protocol.stats import TunnelStats
from raven.protocol.streams import Stream

__all__ = ["Scheduler"]

#: While other streams have data, a waiting bulk stream still gets every this-many-th payload.
BULK_EVERY = 8
#: A DATA frame is not started in a payload with less room than this (unless it all fits).
_MIN_DATA_CHUNK = 1024
_FRAME_LABELS = {int(t): t.label for t in FrameType}


class Scheduler:
    """Queues of control frames, datagrams and streams with data; builds payloads.

    ``on_end_sent(stream)`` is called when a stream's END frame went into a payload.
    """

    def __init__(
        self, quantum: int, stats: TunnelStats, on_end_sent: Callable[[Stream], None]
    ) -> None:
        self._quantum = max(1, min(quantum, MAX_RECORD_PAYLOAD_BYTES - FRAME_HEADER_BYTES))
        self._quantum_left = self._quantum
        self._stats = stats
        self._on_end_sent = on_end_sent
        # The queues exist from their first item on: an empty deque costs ~760 bytes, and a
        # gateway holds thousands of idle tunnels (None reads as empty, like the deque).
        self._control: deque[bytes] | None = None
        #: encoded control bytes queued and not yet put into a payload
        self.control_bytes = 0
        self._datagrams: deque[bytes] | None = None
        #: bytes of the datagrams queued (bounded by Limits.max_queued_datagram_bytes)
        self.datagram_bytes = 0
        self._ready: deque[Stream] | None = None
        #: the bulk streams' ring, and payloads since a bulk stream was last served
        self._bulk: deque[Stream] | None = None
        self._bulk_wait = 0

    @property
    def has_output(self) -> bool:
        return bool(self._control or self._datagrams or self._ready or self._bulk)

    def queue_control(self, frame: bytes) -> None:
        if self._control is None:
            self._control = deque()
        self._control.append(frame)
        self.control_bytes += len(frame)

    def queue_datagram(self, data: bytes, max_count: int, max_bytes: int) -> bool:
        """Queue a datagram; False when ``max_count`` are queued or ``max_bytes`` would pass."""
        if self._datagrams is None:
            self._datagrams = deque()
        if len(self._datagrams) >= max_count or self.datagram_bytes + len(data) > max_bytes:
            return False
        self._datagrams.append(data)
        self.datagram_bytes += len(data)
        return True

    def schedule(self, stream: Stream) -> None:
        """The stream has data or an END to send: put it in the ring (once)."""
        if not stream.scheduled:
            stream.scheduled = True
            if stream.bulk:
                if self._bulk is None:
                    self._bulk = deque()
                self._bulk.append(stream)
                return
            if self._ready is None:
                self._ready = deque()
            self._ready.append(stream)

    def clear(self) -> None:
        self._control = self._datagrams = None
        self.control_bytes = self.datagram_bytes = 0
        for stream in (*(self._ready or ()), *(self._bulk or ())):
            stream.scheduled = False
        self._ready = self._bulk = None

    def next_payload(self) -> bytes | None:
        """The frames payload of the next record, or None when nothing is waiting."""
        parts: list[bytes | memoryview] = []
        room = MAX_RECORD_PAYLOAD_BYTES
        sent = self._stats.frames_sent
        control = self._control
        while control and len(control[0]) <= room:
            frame = control.popleft()
            parts.append(frame)
            room -= len(frame)
            self.control_bytes -= len(frame)
            label = _FRAME_LABELS[frame[0]]
            sent[label] = sent.get(label, 0) + 1
        if not control:
            self._control = None  # an idle tunnel holds no deque (see __init__)
            if self._datagrams:
                room = self._add_datagrams(parts, room)
            if self._ready:
                if self._bulk and self._bulk_wait >= BULK_EVERY:
                    room = self._add_stream_data(parts, room, self._bulk)
                    self._bulk_wait = 0
                room = self._add_stream_data(parts, room, self._ready)
                self._bulk_wait += bool(self._bulk)
            if self._bulk and not self._ready:
                self._add_stream_data(parts, room, self._bulk)
                self._bulk_wait = 0
        if not parts:
            return None
        return b"".join(parts)

    def _add_datagrams(self, parts: list[bytes | memoryview], room: int) -> int:
        datagrams = self._datagrams
        floor = MAX_RECORD_PAYLOAD_BYTES // 2 if self._ready or self._bulk else 0
        count = 0
        while datagrams:
            size = len(datagrams[0]) + FRAME_HEADER_BYTES
            if size > room or (count and size > room - floor):
                break  # the first always goes when it fits; then half is kept for streams
            data = datagrams.popleft()
            self.datagram_bytes -= len(data)
            parts.append(encode_header(FrameType.DATAGRAM, 0, 0, len(data)))
            parts.append(data)
            room -= len(data) + FRAME_HEADER_BYTES
            count += 1
        if count:
            self._stats.count_datagrams_sent(count)
        return room

    def _add_stream_data(
        self, parts: list[bytes | memoryview], room: int, ready: deque[Stream]
    ) -> int:
        data_frames = end_frames = 0
        while ready:
            stream = ready[0]
            if stream.queued_bytes:
                space = room - FRAME_HEADER_BYTES
                want = min(stream.queued_bytes, self._quantum_left)
                if space < want and space < _MIN_DATA_CHUNK:
                    break  # not worth a frame: the next payload continues here
                size = min(want, space)
                parts.append(encode_data_header(stream.stream_id, size))
                parts.extend(stream.take(size))
                room -= size + FRAME_HEADER_BYTES
                self._quantum_left -= size
                data_frames += 1
            if not stream.queued_bytes and stream.end_pending and not stream.end_sent:
                if room < FRAME_HEADER_BYTES:
                    break
                parts.append(encode_header(FrameType.END, 0, stream.stream_id, 0))
                room -= FRAME_HEADER_BYTES
                stream.end_sent = True
                end_frames += 1
                self._on_end_sent(stream)
            if not stream.has_output:  # done (or reset meanwhile): leave the ring
                ready.popleft()
                stream.scheduled = False
                self._quantum_left = self._quantum
            elif self._quantum_left <= 0:
                ready.rotate(-1)
                self._quantum_left = self._quantum
        sent = self._stats.frames_sent
        if data_frames:
            sent["data"] = sent.get("data", 0) + data_frames
        if end_frames:
            sent["end"] = sent.get("end", 0) + end_frames
        return room
