"""raven_l3_* counters: one integer per (direction, agent) on the hot path, split into the
packet and byte counters when the registry is collected."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from raven.l3.metrics import FROM_AGENT, TO_AGENT, L3Metrics


def test_packets_and_bytes_come_apart_exactly_at_scrape_time() -> None:
    registry = CollectorRegistry()
    metrics = L3Metrics(registry)
    down = metrics.traffic(TO_AGENT, "site-a")
    up = metrics.traffic(FROM_AGENT, "site-a")
    for size in (84, 1380, 65000):
        down.count(size)
    up.count(60)
    for _ in range(70_000):  # 70,000 super-packets: 4.5 GB, past any 32-bit field
        down.count(64_000)
    assert (down.packets, down.bytes) == (70_003, 84 + 1380 + 65000 + 70_000 * 64_000)
    sample = registry.get_sample_value
    labels = {"direction": "to_agent", "agent": "site-a"}
    assert sample("raven_l3_packets_total", labels) == 70_003
    assert sample("raven_l3_bytes_total", labels) == 84 + 1380 + 65000 + 70_000 * 64_000
    labels = {"direction": "from_agent", "agent": "site-a"}
    assert sample("raven_l3_packets_total", labels) == 1
    assert sample("raven_l3_bytes_total", labels) == 60
