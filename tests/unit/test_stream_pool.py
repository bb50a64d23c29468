"""StreamPool: idle streams by target, most recent first, bounded without thrashing, swept by
age, ended on close."""

from __future__ import annotations

import pytest

from cloud_gateway.proxy import stream_pool
from cloud_gateway.proxy.stream_pool import StreamPool
from raven.transport.stream import ByteStream
from tests.helpers import wait_for

IDLE_S = 90.0
PER_TARGET = 4


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


def pool_of(max_idle: int = 100, clock: Clock | None = None) -> StreamPool:
    return StreamPool(max_idle, IDLE_S, clock or Clock(), per_target=PER_TARGET)


def put(pool: StreamPool, key: tuple[str, int], stream: FakeStream) -> None:
    pool.put(key, stream)  # type: ignore[arg-type]


def take(pool: StreamPool, key: tuple[str, int]) -> ByteStream | None:
    return pool.take(key)


async def test_take_gives_the_most_recent_whole_stream_of_that_target() -> None:
    pool = pool_of()
    a, b, c = FakeStream("a"), FakeStream("b"), FakeStream("c")
    put(pool, ("n1", 9400), a)
    put(pool, ("n1", 9400), b)
    put(pool, ("n2", 9400), c)
    b.whole = False  # its target closed while idle: skipped, ended, counted as stale
    assert take(pool, ("n1", 9400)) is a and b.ended and b.closed
    assert take(pool, ("n1", 9400)) is None
    assert take(pool, ("n1", 9100)) is None  # another port is another target
    assert take(pool, ("n2", 9400)) is c and len(pool) == 0
    assert (pool.hits, pool.misses, pool.stale) == (2, 2, 1)
    pool.close()


async def test_a_stream_that_cannot_stay_is_ended_at_once() -> None:
    pool = pool_of()
    s = FakeStream("s")
    s.whole = False
    put(pool, ("n", 1), s)
    assert s.ended and s.closed and len(pool) == 0
    pool.close()
    late = FakeStream("late")
    put(pool, ("n", 1), late)
    assert late.ended and not pool.enabled  # a closed pool (drain) keeps nothing


async def test_disabled_pool_keeps_nothing() -> None:
    pool = pool_of(max_idle=0)
    s = FakeStream("s")
    put(pool, ("n", 1), s)
    assert not pool.enabled and s.ended and len(pool) == 0


async def test_per_target_cap_ends_the_oldest_of_that_target() -> None:
    pool = pool_of()
    streams = [FakeStream(str(i)) for i in range(PER_TARGET + 2)]
    for s in streams:
        put(pool, ("n", 1), s)
    assert len(pool) == PER_TARGET
    assert [s.ended for s in streams[:2]] == [True, True]
    assert not any(s.ended for s in streams[2:])
    pool.close()
    assert all(s.ended and s.closed for s in streams)


async def test_full_pool_ends_the_returning_stream_so_a_cycle_still_hits() -> None:
    """Scrapes cycle through more targets than the pool holds: keeping what is held (not
    evicting the oldest, which a cycle needs next) gives those targets a hit every cycle."""
    pool = pool_of(max_idle=3)
    targets = [(f"n{i}", 1) for i in range(5)]
    hits = 0
    for _cycle in range(4):
        for key in targets:
            stream = take(pool, key)
            hits += stream is not None
            put(pool, key, FakeStream(key[0]) if stream is None else stream)  # type: ignore[arg-type]
    assert len(pool) == 3
    assert hits == 3 * 3  # the three kept targets hit in every cycle after the first


async def test_sweep_ends_streams_idle_too_long_oldest_first() -> None:
    clock = Clock()
    pool = pool_of(clock=clock)
    old, other, fresh = FakeStream("old"), FakeStream("other"), FakeStream("fresh")
    put(pool, ("n", 1), old)
    put(pool, ("m", 1), other)
    clock.now = IDLE_S - 1
    put(pool, ("n", 1), fresh)
    clock.now = IDLE_S + 1
    pool.sweep()
    assert old.ended and other.ended and not fresh.ended and len(pool) == 1
    assert take(pool, ("m", 1)) is None
    assert take(pool, ("n", 1)) is fresh
    pool.close()


async def test_one_timer_sweeps_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_pool, "_SWEEP_EVERY_S", 0.01)
    clock = Clock()
    pool = StreamPool(10, 0.05, clock)
    s = FakeStream("s")
    put(pool, ("n", 1), s)
    clock.now = 1.0
    await wait_for(lambda: s.ended)
    assert len(pool) == 0


async def test_close_ends_everything_and_stops_the_timer() -> None:
    pool = pool_of()
    streams = [FakeStream(str(i)) for i in range(3)]
    for i, s in enumerate(streams):
        put(pool, (f"n{i}", 1), s)
    pool.close()
    assert all(s.ended and s.closed for s in streams) and len(pool) == 0
    assert take(pool, ("n0", 1)) is None
