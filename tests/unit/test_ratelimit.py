"""Token bucket per source address."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.ratelimit import RateLimiter


def test_burst_then_refused_then_refills() -> None:
    limiter = RateLimiter(rate_per_s=2.0, burst=3)
    assert [limiter.allow("1.2.3.4", 10.0) for _ in range(4)] == [True, True, True, False]
    assert limiter.refused == 1
    assert not limiter.allow("1.2.3.4", 10.4)  # 0.8 token
    assert limiter.allow("1.2.3.4", 10.5)  # 1.0 token
    assert not limiter.allow("1.2.3.4", 10.5)
    # a long pause refills up to the burst, never beyond it
    assert [limiter.allow("1.2.3.4", 1000.0) for _ in range(4)] == [True, True, True, False]


def test_keys_are_independent() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=1)
    assert limiter.allow("a", 0.0)
    assert not limiter.allow("a", 0.0)
    assert limiter.allow("b", 0.0)
    assert limiter.allow("a", 1.0)


def test_clock_going_backwards_gives_no_tokens() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=1)
    assert limiter.allow("a", 100.0)
    assert not limiter.allow("a", 50.0)
    assert not limiter.allow("a", 50.5)


def test_memory_bounded_and_lru_evicted() -> None:
    limiter = RateLimiter(rate_per_s=0.001, burst=1, max_keys=100)
    for i in range(10_000):
        limiter.allow(f"10.0.{i // 256}.{i % 256}", 0.0)
        assert len(limiter) <= 100
    assert len(limiter) == 100
    # the most recent keys are still tracked (and empty)
    assert not limiter.allow("10.0.39.15", 0.0)  # i = 9999
    # the oldest were evicted: they start again with a full bucket
    assert limiter.allow("10.0.0.0", 0.0)


def test_refilled_buckets_dropped_before_busy_ones() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=1, max_keys=3)
    assert limiter.allow("old", 0.0)  # refilled by t=1
    assert limiter.allow("busy1", 5.0)
    assert limiter.allow("busy2", 5.0)
    assert limiter.allow("new", 5.0)  # evicts "old" (refilled), not the busy ones
    assert not limiter.allow("busy1", 5.0)
    assert not limiter.allow("busy2", 5.0)
    assert len(limiter) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_per_s": 0.0, "burst": 1},
        {"rate_per_s": 1.0, "burst": 0},
        {"rate_per_s": 1.0, "burst": 1, "max_keys": 0},
    ],
)
def test_invalid_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RateLimiter(**kwargs)  # type: ignore[arg-type]


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0.0, 0.5)), min_size=1, max_size=60
    )
)
def test_never_more_than_burst_plus_rate_times_elapsed(steps: list[tuple[str, float]]) -> None:
    rate, burst = 2.0, 3
    limiter = RateLimiter(rate_per_s=rate, burst=burst)
    now = 0.0
    allowed: dict[str, int] = {}
    for key, dt in steps:
        now += dt
        if limiter.allow(key, now):
            allowed[key] = allowed.get(key, 0) + 1
    for count in allowed.values():
        assert count <= burst + rate * now + 1e-9
