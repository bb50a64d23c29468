"""One loop timer for the deadlines of many tunnels.

Every tunnel always has a next deadline: its keepalive PING, the dead-peer limit, a handshake
or a drain timeout (``TunnelConnection.get_timer``). A loop timer of its own costs a tunnel
~0.6 KiB (uvloop's TimerHandle, its libuv timer, the bound callback); a gateway holding a
thousand sites would keep 0.6 MiB of them. A listener's tunnels share one :class:`Deadlines`
instead: a heap of ``(when, sequence, owner)`` entries with the loop's timer armed at the
earliest, as nginx and HAProxy keep one timer tree for all their connections.

An owner whose deadline moves pushes a new entry; the old one stays in the heap and is
skipped when it comes up (it no longer matches ``owner.deadline_at``). The heap is rebuilt
when such stale entries are more than half of it, so it stays within twice the number of
owners (plus a small floor).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Protocol

__all__ = ["DeadlineOwner", "Deadlines"]

log = logging.getLogger(__name__)

#: Entries come due this early (asyncio's clock resolution; an owner called before its
#: deadline finds nothing due and sets the same deadline again).
SLACK_S = 0.001
#: The heap is never rebuilt below this size.
MIN_REBUILD = 64


class DeadlineOwner(Protocol):
    #: the owner's pending deadline (loop time), None when it has none; only
    #: :meth:`Deadlines.set` changes it
    deadline_at: float | None

    def deadline_due(self) -> None:
        """The deadline passed (``deadline_at`` is None again)."""


class Deadlines:
    """The deadlines of many owners, on one timer of ``loop``."""

    __slots__ = ("_heap", "_loop", "_sequence", "_stale", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, DeadlineOwner]] = []
        self._sequence = itertools.count()
        #: entries in the heap that no longer match their owner's deadline
        self._stale = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def __len__(self) -> int:
        """Entries in the heap, stale ones included."""
        return len(self._heap)

    def set(self, owner: DeadlineOwner, when: float | None) -> None:
        """``owner.deadline_due()`` at ``when`` (loop time), replacing its pending deadline;
        None cancels it."""
        previous = owner.deadline_at
        if when == previous:
            return
        owner.deadline_at = when
        if previous is not None:
            self._stale += 1
        if when is None:
            if self._stale == len(self._heap):  # nothing live: drop the timer and the owners
                self.close()
            return
        heapq.heappush(self._heap, (when, next(self._sequence), owner))
        if self._stale > MIN_REBUILD and self._stale * 2 > len(self._heap):
            self._rebuild()
        if self._timer_at is None or when < self._timer_at:
            self._arm(when)

    def close(self) -> None:
        """Forget every deadline (the owners' ``deadline_at`` are left as they are)."""
        self._heap.clear()
        self._stale = 0
        if self._timer is not None:
            self._timer.cancel()
        self._disarmed()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _disarmed(self) -> None:
        self._timer = self._timer_at = None

    def _fire(self) -> None:
        # a call, not the assignment: after it the type checker would take self._timer for
        # None all through this method, though the owners' callbacks below arm it again (the
        # mypyc build trusts that narrowing and failed on the TimerHandle)
        self._disarmed()
        heap = self._heap
        due: list[DeadlineOwner] = []
        until = self._loop.time() + SLACK_S
        while heap and heap[0][0] <= until:
            when, _, owner = heapq.heappop(heap)
            if owner.deadline_at == when:
                owner.deadline_at = None
                due.append(owner)
            else:
                self._stale -= 1
        for owner in due:  # after the pops: an owner sets its next deadline as it runs
            try:
                owner.deadline_due()
            except Exception:  # one owner's failure must not stop the others' deadlines
                log.exception("deadline callback failed")
        if heap and self._timer is None:
            self._arm(heap[0][0])

    def _rebuild(self) -> None:
        """Drop the stale entries (and an owner's duplicates of its current deadline)."""
        seen: set[int] = set()
        live = []
        for entry in self._heap:
            when, _, owner = entry
            if owner.deadline_at == when and id(owner) not in seen:
                seen.add(id(owner))
                live.append(entry)
        heapq.heapify(live)
        self._heap = live
        self._stale = 0
