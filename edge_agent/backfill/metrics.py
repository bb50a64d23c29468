"""The agent's backfill metrics (gauges read the live buffer and target table)."""

from __future__ import annotations

import time
from collections.abc import Callable

from edge_agent.backfill.learn import TargetTable
from edge_agent.backfill.store import Totals
from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge


class BackfillMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        totals: Callable[[], Totals],
        table: TargetTable,
        dropped: Callable[[], dict[str, int]],
    ) -> None:
        self._dropped_seen: dict[str, int] = {}
        self._dropped = dropped
        _register_gauges(registry, totals, table)
        self.dropped = Counter(
            "raven_agent_backfill_samples_dropped_total",
            "Buffered samples dropped, by reason (cap, age, corrupt, refused by the gateway).",
            ["reason"],
            registry=registry,
        )
        self.local_scrapes = Counter(
            "raven_agent_backfill_local_scrapes_total",
            "Scrapes the agent made itself, by result (ok, http_error, timeout, unreachable,"
            " too_large, bad_exposition, busy).",
            ["result"],
            registry=registry,
        )
        self.sent_samples = Counter(
            "raven_agent_backfill_sent_samples_total",
            "Samples the gateway acknowledged (written to Prometheus or dropped there).",
            registry=registry,
        )
        self.sent_bytes = Counter(
            "raven_agent_backfill_sent_bytes_total",
            "Bytes of backfill batches sent through the tunnel.",
            registry=registry,
        )
        self.batches = Counter(
            "raven_agent_backfill_batches_total",
            "Backfill batches by result (ok, retry, refused, error).",
            ["result"],
            registry=registry,
        )

    def sync_dropped(self) -> None:
        """Move the store's drop counts into the counter (deltas)."""
        for reason, n in self._dropped().items():
            delta = n - self._dropped_seen.get(reason, 0)
            if delta > 0:
                self.dropped.labels(reason).inc(delta)
            self._dropped_seen[reason] = n


def _register_gauges(
    registry: CollectorRegistry, totals: Callable[[], Totals], table: TargetTable
) -> None:
    """The gauges: each reads the buffer's totals or the target table when scraped."""
    Gauge(
        "raven_agent_backfill_buffered_samples",
        "Samples in the on-disk backfill buffer.",
        registry=registry,
    ).set_function(lambda: totals().samples)
    Gauge(
        "raven_agent_backfill_buffered_bytes",
        "Bytes of scrapes in the on-disk backfill buffer (counted against max_bytes).",
        registry=registry,
    ).set_function(lambda: totals().bytes)

    def oldest_age() -> float:
        ts = totals().oldest_ts_ms
        return 0.0 if ts is None else max(0.0, time.time() - ts / 1000)

    Gauge(
        "raven_agent_backfill_oldest_sample_age_seconds",
        "Age of the oldest buffered scrape (0 when the buffer is empty).",
        registry=registry,
    ).set_function(oldest_age)
    Gauge(
        "raven_agent_backfill_targets",
        "Targets learned from Prometheus's scrapes or configured.",
        registry=registry,
    ).set_function(lambda: len(table.targets))
    Gauge(
        "raven_agent_backfill_targets_local",
        "Targets the agent scrapes itself right now (nobody else asks).",
        registry=registry,
    ).set_function(lambda: table.local_count)
