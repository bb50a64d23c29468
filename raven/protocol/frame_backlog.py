"""Received frames waiting to be acted on: a bounded number of control frames per call.

A record holds up to 64 KiB of frames and one read many records: 1,024 OPENs arrive in
one read, and acting on them all at once (a stream, an event, a refusal each) held a
gateway's event loop 30-100 ms, every other site's traffic with it. The multiplexer puts
each record's frames here, in order, and acts on them at most ``CONTROL_FRAMES_PER_CALL``
control frames per call (data frames are cheap and not counted); the adapter calls again
next event-loop turn while frames are :attr:`FrameBacklog.pending`, with its reading paused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from raven.protocol.frames import DataFrame, Frame

__all__ = ["CONTROL_FRAMES_PER_CALL", "FrameBacklog"]

#: Control frames acted on per call (about 1-4 ms of a gateway's loop for OPENs it refuses).
CONTROL_FRAMES_PER_CALL = 128


class FrameBacklog:
    """Frames received and not yet acted on, oldest first."""

    __slots__ = ("_on_control", "_on_data", "_received", "pending")

    def __init__(
        self,
        on_data: Callable[[int, bytes], None],
        on_control: Callable[[Frame, float], None],
        received: dict[str, int],
    ) -> None:
        #: the frames waiting, oldest first: made by the first frames, dropped once empty (an
        #: idle tunnel holds no deque, ~760 B); read it, never change it (falsy: none waits)
        self.pending: deque[Frame] | None = None
        self._on_data = on_data
        self._on_control = on_control
        self._received = received  # frames acted on, by type (TunnelStats.frames_received)

    def extend(self, frames: Iterable[Frame]) -> None:
        if self.pending is None:
            self.pending = deque(frames)
        else:
            self.pending.extend(frames)

    def clear(self) -> None:
        if self.pending is not None:
            self.pending.clear()  # the same deque: an act() running on it stops

    def act_on_data(self, stream_id: int, data: bytes) -> None:
        """Act on one DATA frame: counted, then handed on. The multiplexer calls it directly for
        a record of one DATA frame when nothing is :attr:`pending` (acting now keeps the order)."""
        received = self._received
        received["data"] = received.get("data", 0) + 1
        self._on_data(stream_id, data)

    def act(self, now: float) -> None:
        """Act on frames in order, up to CONTROL_FRAMES_PER_CALL control ones. A handler
        that closes the tunnel clears the backlog, which ends the loop."""
        frames, received, acted = self.pending, self._received, 0
        if frames is None:
            return
        while frames and acted < CONTROL_FRAMES_PER_CALL:
            frame = frames.popleft()
            if type(frame) is DataFrame:
                self.act_on_data(frame.stream_id, frame.data)
                continue
            label = frame.TYPE.label
            received[label] = received.get(label, 0) + 1
            acted += 1
            self._on_control(frame, now)
        if not frames and self.pending is frames:
            self.pending = None
