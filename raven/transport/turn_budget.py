"""The CPU one tunnel's input may take per event-loop turn: reads in slices, events deferred.

The gateway serves every site from one event loop, and what a peer sends decides what its
tunnel costs to handle: a full REGISTER is ~30 ms of name checks, 2,000 OPENs (which a gateway
refuses one by one) ~20 ms. :class:`TurnBudget` keeps that from stalling everybody else:

- a read over ``SLICE_BYTES`` reaches the connection a slice (a memoryview, no copy) at a
  time, each cut where a message ends (``boundary``: the connection's ``input_end``), so no
  record is left in two pieces for the channel to copy together; once another slice as
  costly as the last would take the turn past ``TURN_BUDGET_S``, the rest waits for the next
  turn (so a turn overruns only when one slice alone does);
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
    """Feeds reads to ``receive`` (then calls ``after``) within a turn's budget.

    What waits goes on in one callback a turn: deferred events first; slices of a read only
    in a turn that ran no deferred events (so frames acted on by a deferred resume and by a
    new slice never add up within one turn)."""

    __slots__ = ("_after", "_boundary", "_clock", "_loop", "_receive", "_rest", "_scheduled",
                 "_transport", "_works", "paused")  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        receive: Callable[[bytes | memoryview], object],
        after: Callable[[], None],
        transport: Callable[[], asyncio.Transport | None],
        clock: Callable[[], float] = time.perf_counter,
        *,
        boundary: Callable[[memoryview, int], int],
    ) -> None:
        self._loop = loop
        self._receive = receive
        self._after = after
        self._transport = transport
        self._clock = clock
        #: (the rest of a read, SLICE_BYTES) -> where its next slice ends (at SLICE_BYTES or past)
        self._boundary = boundary
        self._works: list[Callable[[], None]] = []  # deferred events, run next turn
        self._rest: tuple[memoryview, int] | None = None  # a read's slices not yet fed
        self._scheduled = False
        self.paused = False

    # ------------------------------------------------------------ reads
    def feed(self, data: bytes) -> None:
        self._slices(memoryview(data), 0)

    def _slices(self, view: memoryview, offset: int) -> None:
        start = before = self._clock()
        total = len(view)
        while offset < total and self._transport() is not None:
            end = offset + SLICE_BYTES
            if end < total:
                with view[offset:] as rest:
                    end = offset + max(self._boundary(rest, SLICE_BYTES), 1)
            self._receive(view[offset:end])
            offset = end
            now = self._clock()
            over = (now - start) + (now - before) > TURN_BUDGET_S
            if offset < total and (over or self._works):  # or its frames wait
                self._rest = (view, offset)
                self._wait()
                break
            before = now
        self._after()

    # ------------------------------------------------------------ events
    def defer(self, work: Callable[[], None]) -> None:
        """The turn's budget is spent: pause reading and run ``work`` next turn."""
        if work not in self._works:
            self._works.append(work)
        self._wait()

    # ------------------------------------------------------------ next turn
    def _wait(self) -> None:
        """Something waits: reading paused, one callback next turn."""
        transport = self._transport()
        if transport is not None and not self.paused:
            self.paused = True
            transport.pause_reading()
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._scheduled = False
        if self._transport() is None:  # the tunnel closed: the rest is moot
            self._works.clear()
            self._rest = None
            return
        if self._works:
            works, self._works = self._works, []
            for work in works:
                work()  # may defer again
        elif self._rest is not None:
            (view, offset), self._rest = self._rest, None
            self._slices(view, offset)
        transport = self._transport()
        if transport is None:
            return
        if self._works or self._rest is not None:
            self._wait()
        elif self.paused:
            self.paused = False
            transport.resume_reading()
