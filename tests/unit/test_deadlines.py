"""Deadlines: many owners' deadlines on one loop timer (raven/transport/deadlines.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from raven.transport.deadlines import MIN_REBUILD, Deadlines


class Owner:
    def __init__(self, name: str, fired: list[str], deadlines: Deadlines | None = None) -> None:
        self.name = name
        self.fired = fired
        self.deadline_at: float | None = None
        self.again: float | None = None  # re-arm this far ahead when due
        self.deadlines = deadlines
        self.fail = False

    def deadline_due(self) -> None:
        self.fired.append(self.name)
        if self.fail:
            raise RuntimeError("owner failed")
        if self.again is not None and self.deadlines is not None:
            self.deadlines.set(self, self.deadlines._loop.time() + self.again)


async def test_owners_fire_once_in_deadline_order() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    now = loop.time()
    owners = [Owner(name, fired) for name in "abcde"]
    for owner, delay in zip(owners, (0.05, 0.01, 0.04, 0.02, 0.03), strict=True):
        deadlines.set(owner, now + delay)
    await asyncio.sleep(0.1)
    assert fired == ["b", "d", "e", "c", "a"]
    assert all(owner.deadline_at is None for owner in owners)
    assert len(deadlines) == 0


async def test_moved_and_cancelled_deadlines() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    now = loop.time()
    later, earlier, cancelled = Owner("later", fired), Owner("earlier", fired), Owner("x", fired)
    deadlines.set(later, now + 0.01)
    deadlines.set(later, now + 0.06)  # moved later: not at 0.01
    deadlines.set(earlier, now + 0.08)
    deadlines.set(earlier, now + 0.02)  # moved earlier: the loop timer follows
    deadlines.set(cancelled, now + 0.03)
    deadlines.set(cancelled, None)
    await asyncio.sleep(0.04)
    assert fired == ["earlier"]
    await asyncio.sleep(0.05)
    assert fired == ["earlier", "later"]
    await asyncio.sleep(0.01)
    assert len(deadlines) == 0  # the stale entries came up and were dropped


async def test_an_owner_sets_its_next_deadline_from_its_callback() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    ticker = Owner("tick", fired, deadlines)
    ticker.again = 0.01
    deadlines.set(ticker, loop.time() + 0.01)
    await asyncio.sleep(0.075)
    deadlines.set(ticker, None)
    assert 2 <= len(fired) <= 8
    count = len(fired)
    await asyncio.sleep(0.03)
    assert len(fired) == count


async def test_a_failing_owner_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    bad, good, later = Owner("bad", fired), Owner("good", fired), Owner("later", fired)
    bad.fail = True
    now = loop.time()
    deadlines.set(bad, now + 0.01)
    deadlines.set(good, now + 0.01)
    deadlines.set(later, now + 0.03)
    with caplog.at_level(logging.ERROR, logger="raven.transport.deadlines"):
        await asyncio.sleep(0.05)
    assert fired == ["bad", "good", "later"]
    assert "deadline callback failed" in caplog.text


async def test_stale_entries_stay_bounded_and_close_forgets_everything() -> None:
    """Owners that move their deadline all the time (a keepalive pushed back by traffic)
    leave stale entries; the heap is rebuilt before they outnumber the live ones."""
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    owners = [Owner(str(i), fired) for i in range(10)]
    now = loop.time()
    for step in range(5_000):
        for owner in owners:
            deadlines.set(owner, now + 10 + step * 0.001)
        assert len(deadlines) <= 2 * len(owners) + 2 * MIN_REBUILD + 2
    deadlines.close()
    assert len(deadlines) == 0
    await asyncio.sleep(0.01)
    assert fired == []


async def test_the_last_cancelled_deadline_releases_the_timer_and_the_owners() -> None:
    """A tunnel that closes cancels its deadline: with none live left, the heap and the
    loop timer go at once (nothing keeps the closed tunnel until its old deadline)."""
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(loop), []
    first, second = Owner("1", fired), Owner("2", fired)
    deadlines.set(first, loop.time() + 10)
    deadlines.set(second, loop.time() + 20)
    deadlines.set(first, None)
    assert len(deadlines) == 2 and deadlines._timer is not None  # the second is live
    deadlines.set(second, None)
    assert len(deadlines) == 0 and deadlines._timer is None
