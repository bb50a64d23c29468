"""The multiplexer's stream bookkeeping: live streams, stream ids, windows, buffered bytes.

Sans-IO and frame-free: :class:`StreamTable` knows which streams exist, which ids
each side may still use, how much receive window a new stream may get, and how many
received bytes wait for the application. The multiplexer decides what goes on the
wire; this table only answers and counts.
"""

from __future__ import annotations

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.frames import MAX_STREAM_ID
from raven.protocol.limits import Limits
from raven.protocol.streams import Stream

__all__ = ["MIN_STREAM_WINDOW_BYTES", "StreamTable"]

#: Smallest receive window a stream is given when the tunnel's windows are nearly all
#: committed; every stream up to ``max_streams`` is guaranteed at least this much.
MIN_STREAM_WINDOW_BYTES = 16 * 1024


class StreamTable:
    """The live streams of one tunnel. ``initiator`` decides the id parity (initiator
    odd, responder even)."""

    __slots__ = (
        "_initiator",
        "_last_peer_id",
        "_limits",
        "_next_local_id",
        "buffered",
        "reserved",
        "streams",
    )

    def __init__(self, *, initiator: bool, limits: Limits) -> None:
        self._limits = limits
        self._initiator = initiator
        self.streams: dict[int, Stream] = {}
        self._next_local_id = 1 if initiator else 2
        self._last_peer_id = 0
        #: bytes received on streams and not yet consumed by the application
        self.buffered = 0
        #: receive windows of the live streams, summed: the most the peer can make us
        #: buffer (held under max_tunnel_buffered_bytes, for streams either side opened)
        self.reserved = 0

    def __len__(self) -> int:
        return len(self.streams)

    def local(self, stream_id: int) -> Stream:
        """A stream our own call names; LocalProtocolError for one that is not live."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"no stream {stream_id}")
        return stream

    def peer(self, stream_id: int) -> Stream | None:
        """The stream a peer frame names; None for one that finished (late frames are
        ignored); RemoteProtocolError for one that never existed."""
        stream = self.streams.get(stream_id)
        if stream is not None:
            return stream
        ours = (stream_id & 1) == (1 if self._initiator else 0)
        known = stream_id < self._next_local_id if ours else stream_id <= self._last_peer_id
        if not known:
            raise RemoteProtocolError(f"frame for stream {stream_id}, which was never opened")
        return None

    def next_local_id(self) -> int:
        """The id of the next stream we open (taken by :meth:`take_local_id`);
        LocalProtocolError once the ids are exhausted."""
        if self._next_local_id > MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted on this tunnel")
        return self._next_local_id

    def take_local_id(self) -> int:
        stream_id = self.next_local_id()
        self._next_local_id += 2
        return stream_id

    def take_peer_id(self, stream_id: int) -> None:
        """The peer opens ``stream_id``: RemoteProtocolError for a wrong parity or a reuse."""
        if (stream_id & 1) != (0 if self._initiator else 1):
            raise RemoteProtocolError(f"peer opened stream {stream_id} of the wrong parity")
        if stream_id <= self._last_peer_id:
            raise RemoteProtocolError(f"peer reused stream id {stream_id}")
        self._last_peer_id = stream_id

    def window_for_new_stream(self) -> tuple[int, str]:
        """(receive window, "") for a new stream, or (0, reason) when it must be refused.
        Windows shrink as the tunnel's total nears max_tunnel_buffered_bytes, keeping
        MIN_STREAM_WINDOW_BYTES for each stream still allowed under max_streams."""
        live = len(self.streams) + 1  # with the new one
        if live > self._limits.max_streams:
            return 0, "too many streams"
        window = min(self._limits.stream_window_bytes, self._room(live))
        if window < self._floor():
            return 0, "too much data buffered on the tunnel"
        return window, ""

    def _floor(self) -> int:
        """The window every stream max_streams allows is guaranteed."""
        return min(MIN_STREAM_WINDOW_BYTES, self._limits.stream_window_bytes)

    def _kept_back(self, live: int) -> int:
        """The budget held for the streams not opened yet, at the floor each."""
        return (self._limits.max_streams - live) * self._floor()

    def _room(self, live: int) -> int:
        """Budget not yet in a window nor kept back, with ``live`` streams."""
        return self._limits.max_tunnel_buffered_bytes - self.reserved - self._kept_back(live)

    def fair_window(self) -> int:
        """The receive window each live stream should have now: the tunnel's budget, less the
        floor kept for every stream max_streams still allows, shared by the live streams;
        between MIN_STREAM_WINDOW_BYTES and stream_window_bytes."""
        limits = self._limits
        live = len(self.streams)
        shared = limits.max_tunnel_buffered_bytes - self._kept_back(live)
        return max(self._floor(), min(limits.stream_window_bytes, shared // max(live, 1)))

    def retarget(self, stream: Stream, credit: int) -> int:
        """A credit of ``credit`` bytes (just consumed) is due on ``stream``: move its window
        toward :meth:`fair_window` with it, and return the credit to send (0: none). Above
        its share the window shrinks by granting back less; below it, it grows by granting
        more, as far as the budget has room. Windows opened first-come (1 MiB each until
        the budget runs short, then the floor) so even out as streams come and go; the
        stream's received-but-unread bytes plus the credit the peer holds stay equal to its
        window, and ``reserved`` the sum of the windows."""
        target = self.fair_window()
        window = stream.window
        if target < window:
            change = -min(window - target, credit)
        elif target > window:
            change = max(0, min(target - window, self._room(len(self.streams))))
        else:
            return credit
        stream.window = window + change
        stream.recv_granted += change
        self.reserved += change
        return credit + change

    def add(self, stream_id: int, window: int, *, received: int = 0) -> Stream:
        """A new stream; ``received``: bytes its peer's OPEN carried (within ``window``)."""
        stream = Stream(stream_id, window)
        self.streams[stream_id] = stream
        self.reserved += window
        if received:
            stream.on_open_data(received)
            self.buffered += received
        return stream

    def forget(self, stream: Stream) -> None:
        """Drop a stream; its window and its unread bytes are released."""
        if self.streams.pop(stream.stream_id, None) is not None:
            self.buffered -= stream.buffered
            self.reserved -= stream.window
            stream.buffered = 0

    def clear(self) -> list[Stream]:
        """Drop every stream (the tunnel is over); returns them in opening order."""
        streams = list(self.streams.values())
        self.streams.clear()
        self.buffered = 0
        self.reserved = 0
        return streams
