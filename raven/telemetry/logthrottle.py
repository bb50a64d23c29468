"""Bounded logging for events a peer can trigger at will (floods of bad handshakes).

The first ``burst`` lines of a key are logged; after that at most one line per
``interval_s`` says how many were suppressed. Metrics still count every event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable


class LogThrottle:
    def __init__(
        self, *, burst: int = 10, interval_s: float = 10.0, clock: Callable[[], float]
    ) -> None:
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        self._window_start: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: str,
        msg: str,
        *args: object,
        extra: dict[str, object] | None = None,
    ) -> None:
        now = self.clock()
        start = self._window_start.get(key)
        if start is None or now - start >= self.interval_s:
            suppressed = max(0, self._count.get(key, 0) - self.burst)
            self._window_start[key] = now
            self._count[key] = 0
            if suppressed:
                logger.log(level, "%s: %d similar lines suppressed", key, suppressed)
        self._count[key] += 1
        if self._count[key] <= self.burst:
            logger.log(level, msg, *args, extra=extra)
        if len(self._window_start) > 1024:  # keys are a small fixed set; stay bounded anyway
            self._window_start.clear()
            self._count.clear()
