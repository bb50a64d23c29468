"""The CPU one tunnel's input may take per event-loop turn: reads in slices, events deferred.

The gateway serves every site from one event loop, and what a peer sends decides what its
tunnel costs to handle: a full REGISTER is ~30 ms of name checks, 2,000 OPENs (which a gateway
refuses one by one) ~20 ms. :class:`TurnBudget` keeps that from stalling everybody else:

- a read over ``SLICE_BYTES`` reaches the connection a slice (a memoryview, no copy) at a
  time; once another slice as costly as the last would take the turn past ``TURN_BUDGET_S``,
  the rest waits for the next turn (so a turn overruns only when one slice alone does);
- the tunnel's loop over the connection's events checks the time after each event and, past
  the budget, hands the rest to :meth:`TurnBudget.defer` (next turn).

While input waits, reading from the socket is paused (the peer's bytes stay in the kernel and
TCP's window, not in memory); it resumes once nothing waits. The common case costs nothing: a
small read, cheap slices and a few events go through at once, and a tunnel makes its
TurnBudget only when it first needs one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["SLICE_BYTES", "TURN_BUDGET_S", "TurnBudget"]

#: Largest piece of a read given to the connection at once.
SLICE_BYTES = 65536
#: Seconds of one tunnel's input handling per loop turn before the rest waits a turn.
TURN_BUDGET_S = 0.002


class TurnBudget:
    """Feeds reads to ``receive`` (then calls ``after``) within a turn's budget."""

    __slots__ = ("_after", "_clock", "_events_wait", "_loop", "_receive", "_slices_wait",
                 "_transport", "paused")  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        receive: Callable[[bytes | memoryview], object],
        after: Callable[[], None],
        transport: Callable[[], asyncio.Transport | None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self._receive = receive
        self._after = after
        self._transport = transport
        self._clock = clock
        self._slices_wait = self._events_wait = False
        self.paused = False

    # ------------------------------------------------------------ reads
    def feed(self, data: bytes) -> None:
        self._slices(memoryview(data), 0)

    def _slices(self, view: memoryview, offset: int) -> None:
        start = before = self._clock()
        total = len(view)
        self._slices_wait = False
        while offset < total and self._transport() is not None:
            end = offset + SLICE_BYTES
            self._receive(view[offset:end])
            offset = end
            now = self._clock()
            over = (now - start) + (now - before) > TURN_BUDGET_S
            if offset < total and (over or self._events_wait):  # or its frames wait
                self._slices_wait = True
                self._pause()
                self._loop.call_soon(self._next_slices, view, offset)
                break
            before = now
        self._after()

    def _next_slices(self, view: memoryview, offset: int) -> None:
        if self._transport() is not None:  # else the tunnel closed: the rest is moot
            self._slices(view, offset)
            self._maybe_resume()

    # ------------------------------------------------------------ events
    def defer(self, work: Callable[[], None]) -> None:
        """The turn's budget is spent: pause reading and run ``work`` next turn."""
        self._events_wait = True
        self._pause()
        self._loop.call_soon(self._deferred, work)

    def _deferred(self, work: Callable[[], None]) -> None:
        self._events_wait = False
        if self._transport() is not None:
            work()  # may defer again
            self._maybe_resume()

    # ------------------------------------------------------------ reading paused
    def _pause(self) -> None:
        transport = self._transport()
        if transport is not None and not self.paused:
            self.paused = True
            transport.pause_reading()

    def _maybe_resume(self) -> None:
        transport = self._transport()
        if self.paused and not (self._slices_wait or self._events_wait) and transport:
            self.paused = False
            transport.resume_reading()
