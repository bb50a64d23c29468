"""RefusalPenalty: clients that retry a refused request at once, ignoring Retry-After."""

from __future__ import annotations

import pytest

from cloud_gateway.proxy.penalty import RefusalPenalty


def test_a_client_over_its_refusals_a_second_is_penalised_until_the_penalty_ends() -> None:
    p = RefusalPenalty(max_per_s=3, penalty_s=2.0)
    assert [p.refused("10.0.0.1", 100.0 + i * 0.1) for i in range(3)] == [False] * 3
    assert not p.penalised("10.0.0.1", 100.3)
    assert p.refused("10.0.0.1", 100.3)  # the 4th within the second
    assert p.penalised("10.0.0.1", 100.3)
    assert p.penalised("10.0.0.1", 102.29)
    assert not p.penalised("10.0.0.1", 102.3)
    assert not p.penalised("10.0.0.2", 100.3)  # per address


def test_refusals_spread_over_seconds_are_never_penalised() -> None:
    p = RefusalPenalty(max_per_s=3, penalty_s=2.0)
    for second in range(20):
        for k in range(3):
            assert not p.refused("10.0.0.1", second + k * 0.3)
    assert not p.penalised("10.0.0.1", 20.0)


def test_a_penalty_outlives_the_window_it_started_in() -> None:
    p = RefusalPenalty(max_per_s=1, penalty_s=5.0)
    p.refused("c", 0.0)
    assert p.refused("c", 0.5)
    assert p.refused("c", 1.6)  # a new window keeps the penalty it started under
    assert p.penalised("c", 4.9)
    assert not p.penalised("c", 5.6)


def test_zero_turns_it_off() -> None:
    p = RefusalPenalty(max_per_s=0, penalty_s=1.0)
    assert not any(p.refused("c", 0.0) for _ in range(1000))
    assert not p.penalised("c", 0.0)
    assert len(p) == 0


def test_memory_is_bounded_and_the_stalest_client_goes_first() -> None:
    p = RefusalPenalty(max_per_s=1, penalty_s=10.0, max_clients=100)
    p.refused("first", 0.0)
    p.refused("first", 0.0)
    assert p.penalised("first", 0.0)
    for i in range(99):
        p.refused(f"c{i}", 1.0)
    p.refused("first", 1.0)  # recently refused again: kept
    for i in range(99, 150):
        p.refused(f"c{i}", 2.0)
    assert len(p) == 100
    assert p.penalised("first", 2.0)
    assert not p.penalised("c0", 2.0) and len(p) == 100


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RefusalPenalty(max_per_s=-1, penalty_s=1.0)
    with pytest.raises(ValueError):
        RefusalPenalty(max_per_s=1, penalty_s=-1.0)
