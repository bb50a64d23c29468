"""raven.telemetry.loop_lag: the event-loop lag histogram every Raven process exposes."""

from __future__ import annotations

import asyncio
import time

import pytest

from raven.telemetry.loop_lag import LAG_BUCKETS, LoopLagProbe
from raven.telemetry.promclient import CollectorRegistry


def samples(registry: CollectorRegistry) -> dict[str, float]:
    """The histogram's series: ``count``, ``sum`` and ``le=<bound>`` bucket counts."""
    out: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name != "raven_event_loop_lag_seconds":
            continue
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                out[f"le={s.labels['le']}"] = s.value
            elif s.name.endswith("_count"):
                out["count"] = s.value
            elif s.name.endswith("_sum"):
                out["sum"] = s.value
    return out


async def test_a_blocked_loop_shows_as_lag_at_least_as_long_as_the_block() -> None:
    registry = CollectorRegistry()
    probe = LoopLagProbe(registry, interval_s=0.01)
    probe.start()
    await asyncio.sleep(0.005)
    time.sleep(0.06)  # the loop is blocked while the probe's timer comes due
    await asyncio.sleep(0.03)  # the late timer runs, then the next one on time
    probe.stop()
    got = samples(registry)
    assert got["count"] >= 2
    # the sample taken after the block waited at least the rest of the block: 0.05 s or more
    assert got["count"] - got["le=0.025"] >= 1
    assert got["sum"] >= 0.045


async def test_lag_is_measured_from_the_moment_the_timer_was_due() -> None:
    now = [100.0]
    registry = CollectorRegistry()
    probe = LoopLagProbe(registry, interval_s=0.25, clock=lambda: now[0])
    probe.start()
    now[0] = 100.25 + 0.04  # the timer ran 40 ms after it was due
    probe._fire()
    now[0] = 100.29 + 0.25  # the next one (due 0.25 s after the last ran) exactly on time
    probe._fire()
    probe.stop()
    got = samples(registry)
    assert got["count"] == 2
    assert got["sum"] == pytest.approx(0.04)
    assert got["le=0.001"] == 1  # the punctual one
    assert got["le=0.025"] == 1 and got["le=0.05"] == 2


async def test_start_is_idempotent_and_stop_cancels_the_timer() -> None:
    registry = CollectorRegistry()
    probe = LoopLagProbe(registry, interval_s=0.01)
    probe.start()
    handle = probe._handle
    probe.start()
    assert probe._handle is handle and probe.running
    probe.stop()
    assert not probe.running and handle is not None and handle.cancelled()
    await asyncio.sleep(0.03)
    assert samples(registry)["count"] == 0
    probe.stop()  # twice is fine


def test_interval_must_be_positive_and_buckets_are_sorted() -> None:
    with pytest.raises(ValueError):
        LoopLagProbe(CollectorRegistry(), interval_s=0)
    assert list(LAG_BUCKETS) == sorted(LAG_BUCKETS)
