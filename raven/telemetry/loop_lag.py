"""Event-loop lag: how late a callback runs after the moment it was due.

Each Raven process serves everything from one asyncio event loop: the gateway every site's
tunnel and every Prometheus connection. While one callback runs (a large registration, a
burst of requests, a garbage collection) everything else waits, and a scrape's latency grows
by that wait. :class:`LoopLagProbe` measures it the way a scrape meets it: a timer due every
``interval_s`` records, when it runs, how late it is, into the histogram
``raven_event_loop_lag_seconds``. Samples come at fixed moments, so the histogram is the
distribution of the delay a callback due at a random instant would see; its ``_sum`` over
``_count`` is the mean lag, and ``histogram_quantile(0.99, rate(..._bucket[5m]))`` the tail
a site's scrapes wait through on that process.

The clock is :func:`time.monotonic` (uvloop's ``loop.time()`` is cached in milliseconds);
timers on uvloop fire at millisecond granularity, so an idle process shows lags up to about
1 ms. One timer per ``interval_s`` (0.25 s): nothing an idle agent notices.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from raven.telemetry.promclient import CollectorRegistry, Histogram

__all__ = ["LAG_BUCKETS", "PROBE_INTERVAL_S", "LoopLagProbe"]

#: How often the probe's timer is due.
PROBE_INTERVAL_S = 0.25

#: From timer granularity (1 ms) to a stalled process (seconds).
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLagProbe:
    """Records the event loop's lag into ``raven_event_loop_lag_seconds`` on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._interval_s = interval_s
        self._clock = clock
        self._histogram = Histogram(
            "raven_event_loop_lag_seconds",
            "How late a callback ran after it was due on this process's event loop, sampled"
            f" every {interval_s:g} s: what a scrape waits for while the loop is busy.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Start sampling on the running loop (idempotent)."""
        if self._handle is None:
            self._loop = asyncio.get_running_loop()
            self._arm(self._clock())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self._interval_s
        self._handle = self._loop.call_later(self._interval_s, self._fire)

    def _fire(self) -> None:
        now = self._clock()
        self._histogram.observe(max(0.0, now - self._due))
        self._arm(now)
