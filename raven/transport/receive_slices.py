"""One read from a tunnel's socket, handed to its connection in slices with a time budget.

A read may be 256 KiB, and what it carries is the peer's choice: a full REGISTER costs ~30 ms
of parsing (16,384 names checked), a burst of OPENs as much. The gateway serves every site
from one event loop, so :class:`ReceiveSlices` feeds a large read ``SLICE_BYTES`` at a time
and, once the slices of one turn took ``TURN_BUDGET_S``, pauses reading and leaves the rest
for the next loop turn: the other tunnels and proxy clients run in between. The cost for the
common case is nil (a read under ``SLICE_BYTES``, or cheap slices, goes through at once; the
slices are memoryviews, not copies).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["SLICE_BYTES", "TURN_BUDGET_S", "ReceiveSlices"]

#: Largest piece of a read given to the connection at once.
SLICE_BYTES = 65536
#: CPU seconds one tunnel's reads may take in one loop turn before the rest waits.
TURN_BUDGET_S = 0.002


class ReceiveSlices:
    """Feeds reads to ``receive`` (then calls ``after``), a turn's budget at a time."""

    __slots__ = ("_after", "_clock", "_loop", "_receive", "_transport", "paused")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        receive: Callable[[bytes | memoryview], None],
        after: Callable[[], None],
        transport: Callable[[], asyncio.Transport | None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._receive = receive
        self._after = after
        self._transport = transport
        self.paused = False

    def feed(self, data: bytes) -> None:
        if len(data) <= SLICE_BYTES:
            self._receive(data)
            self._after()
        else:
            self._slices(memoryview(data), 0)

    def _slices(self, view: memoryview, offset: int) -> bool:
        """Feed from ``offset``; False when the budget ran out and the rest is scheduled."""
        start = self._clock()
        total = len(view)
        done = True
        while offset < total and self._transport() is not None:
            end = offset + SLICE_BYTES
            self._receive(view[offset:end])
            offset = end
            if offset < total and self._clock() - start > TURN_BUDGET_S:
                self._pause()
                self._loop.call_soon(self._resume, view, offset)
                done = False
                break
        self._after()
        return done

    def _pause(self) -> None:
        transport = self._transport()
        if transport is not None and not self.paused:
            self.paused = True
            transport.pause_reading()

    def _resume(self, view: memoryview, offset: int) -> None:
        if self._transport() is None:  # the tunnel closed meanwhile: the rest is moot
            return
        if self._slices(view, offset):
            transport = self._transport()
            self.paused = False
            if transport is not None:
                transport.resume_reading()
