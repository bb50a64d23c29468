"""StreamPool: idle streams by target, most recent first, bounded, swept, ended on close."""

from __future__ import annotations

import asyncio

import pytest

from cloud_gateway.proxy import stream_pool
from cloud_gateway.proxy.stream_pool import IDLE_S, PER_TARGET, StreamPool


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.whole = True
        self.ended = self.closed = False

    def reusable(self) -> bool:
        return self.whole and not self.ended

    def end(self) -> None:
        self.ended = True

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_take_gives_the_most_recent_whole_stream_of_that_target() -> None:
    pool = StreamPool()
    a, b, c = FakeStream("a"), FakeStream("b"), FakeStream("c")
    pool.put(("n1", 9400), a)  # type: ignore[arg-type]
    pool.put(("n1", 9400), b)  # type: ignore[arg-type]
    pool.put(("n2", 9400), c)  # type: ignore[arg-type]
    b.whole = False  # reset while idle: skipped and ended
    assert pool.take(("n1", 9400)) is a and b.ended and b.closed
    assert pool.take(("n1", 9400)) is None
    assert pool.take(("n1", 9100)) is None  # another port is another target
    assert pool.take(("n2", 9400)) is c and len(pool) == 0
    pool.close()


async def test_a_stream_that_cannot_stay_is_ended_at_once() -> None:
    pool = StreamPool()
    s = FakeStream("s")
    s.whole = False
    pool.put(("n", 1), s)  # type: ignore[arg-type]
    assert s.ended and len(pool) == 0
    pool.close()
    late = FakeStream("late")
    pool.put(("n", 1), late)  # type: ignore[arg-type]
    assert late.ended  # a closed pool (drain) keeps nothing


async def test_per_target_cap_ends_the_oldest() -> None:
    pool = StreamPool()
    streams = [FakeStream(str(i)) for i in range(PER_TARGET + 2)]
    for s in streams:
        pool.put(("n", 1), s)  # type: ignore[arg-type]
    assert len(pool) == PER_TARGET
    assert [s.ended for s in streams[:2]] == [True, True]
    assert not any(s.ended for s in streams[2:])
    pool.close()
    assert all(s.ended and s.closed for s in streams)


async def test_total_cap_ends_the_oldest_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_pool, "TOTAL", 3)
    clock = Clock()
    pool = StreamPool(clock)
    streams = []
    for i in range(4):
        clock.now = float(i)
        streams.append(FakeStream(str(i)))
        pool.put((f"n{i}", 1), streams[-1])  # type: ignore[arg-type]
    assert len(pool) == 3 and streams[0].ended and pool.take(("n0", 1)) is None
    pool.close()


async def test_sweep_ends_streams_idle_too_long() -> None:
    clock = Clock()
    pool = StreamPool(clock)
    old, fresh = FakeStream("old"), FakeStream("fresh")
    pool.put(("n", 1), old)  # type: ignore[arg-type]
    clock.now = IDLE_S - 1
    pool.put(("n", 1), fresh)  # type: ignore[arg-type]
    clock.now = IDLE_S + 1
    pool.sweep()
    assert old.ended and not fresh.ended and len(pool) == 1
    assert pool.take(("n", 1)) is fresh
    pool.close()
    await asyncio.sleep(0)
