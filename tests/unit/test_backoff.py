"""The one retry-delay formula: exponential growth, full jitter, bounded, resettable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.runtime.backoff import Backoff, backoff_delay


@given(st.integers(min_value=-5, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_delay_stays_between_half_the_minimum_and_the_bound(attempt: int, seed: int) -> None:
    rng = random.Random(seed)
    delay = backoff_delay(attempt, 0.5, 30.0, rng)
    bound = min(30.0, 0.5 * 2 ** min(max(attempt, 0), 30))
    assert 0.25 <= delay <= max(bound, 0.25)


def test_the_bound_doubles_up_to_the_maximum() -> None:
    rng = random.Random(7)
    biggest = [max(backoff_delay(a, 1.0, 10.0, rng) for _ in range(400)) for a in range(6)]
    assert biggest[0] <= 1.0 and 1.0 < biggest[1] <= 2.0 and 2.0 < biggest[2] <= 4.0
    assert 8.0 < biggest[4] <= 10.0 and 8.0 < biggest[5] <= 10.0


def test_backoff_counts_failures_and_starts_over_after_a_success() -> None:
    backoff = Backoff(1.0, 60.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    assert backoff.attempt == 8 and all(0.5 <= d <= 60.0 for d in delays)
    backoff.reset()
    assert backoff.attempt == 0 and backoff.next_delay() <= 1.0


@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_bad_bounds_are_refused(low: float, high: float) -> None:
    with pytest.raises(ValueError, match="min_s"):
        Backoff(low, high)
