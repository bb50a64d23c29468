"""raven_proxy_request_duration_seconds{node}: NodeLatency writes byte for byte what
prometheus-client's Histogram wrote, answers get_sample_value, forgets nodes, and its text
is written from a snapshot (off the event loop)."""

from __future__ import annotations

import asyncio

from cloud_gateway.proxy.metrics import DURATION_BUCKETS, ProxyMetrics
from cloud_gateway.proxy.node_latency import HELP, NAME, NodeLatency
from raven.telemetry.promclient import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_text,
    generate_text_off_loop,
)

OBSERVED = [
    ("edge-gpu-1", 0.0005),  # on a bound: counted in le="0.0005"
    ("edge-gpu-1", 0.003),
    ("edge-gpu-2", 7.0),
    ('odd"name\\with\nescapes', 100.0),  # past the last bound: +Inf only
    ("edge-gpu-1", 0.0004999),
]


def family_text(text: str, name: str) -> str:
    start = text.index(f"# HELP {name} ")
    end = text.find("# HELP", start + 1)
    return text[start : end if end >= 0 else None]


def test_text_is_what_prometheus_client_wrote() -> None:
    disable_created_metrics()  # as every Raven process does (raven.telemetry.process_metrics)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    latency = NodeLatency(ours, DURATION_BUCKETS)
    reference = Histogram(NAME, HELP, ["node"], buckets=DURATION_BUCKETS, registry=theirs)
    for node, seconds in OBSERVED:
        latency.observe(node, seconds)
        reference.labels(node).observe(seconds)
    assert generate_text(ours) == generate_text(theirs)


def test_samples_answer_get_sample_value() -> None:
    registry = CollectorRegistry()
    latency = NodeLatency(registry, DURATION_BUCKETS)
    for node, seconds in OBSERVED:
        latency.observe(node, seconds)
    value = registry.get_sample_value
    assert value(f"{NAME}_count", {"node": "edge-gpu-1"}) == 3
    assert value(f"{NAME}_bucket", {"node": "edge-gpu-1", "le": "0.0005"}) == 2
    assert value(f"{NAME}_bucket", {"node": "edge-gpu-2", "le": "5.0"}) == 0
    assert value(f"{NAME}_bucket", {"node": "edge-gpu-2", "le": "+Inf"}) == 1
    assert value(f"{NAME}_sum", {"node": "edge-gpu-2"}) == 7.0


def test_forgotten_nodes_leave_the_exposition() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry)
    for i in range(3):
        metrics.observe(f"n{i}", 0.01)
    metrics.forget_nodes(["n0", "n2", "never-seen"])
    text = generate_text(registry).decode()
    assert 'node="n1"' in text and 'node="n0"' not in text and 'node="n2"' not in text
    assert len(metrics.latency) == 1


async def test_text_comes_from_the_snapshot_taken_at_collection() -> None:
    """Collected on the loop, written in a thread: what the loop observes meanwhile is not
    half in one scrape's text."""
    registry = CollectorRegistry()
    latency = NodeLatency(registry, DURATION_BUCKETS)
    latency.observe("edge-gpu-1", 0.01)
    families = list(registry.collect())
    latency.observe("edge-gpu-1", 0.01)  # after the snapshot
    latency.observe("edge-gpu-9", 0.01)
    (family,) = families
    assert family.render().count('_count{node="edge-gpu-1"} 1.0') == 1  # type: ignore[attr-defined]
    assert "edge-gpu-9" not in family.render()  # type: ignore[attr-defined]
    text = (await generate_text_off_loop(registry)).decode()
    assert f'{NAME}_count{{node="edge-gpu-1"}} 2.0' in text and "edge-gpu-9" in text


async def test_the_loop_keeps_running_while_a_large_text_is_written() -> None:
    """10,000 nodes: the loop runs other callbacks while the thread writes the text."""
    registry = CollectorRegistry()
    latency = NodeLatency(registry, DURATION_BUCKETS)
    for i in range(10_000):
        latency.observe(f"edge-{i}", 0.005)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    text = await generate_text_off_loop(registry)
    ticker.cancel()
    assert text.count(b"\n") > 190_000
    assert ticks > 1  # the loop ran while the text was being written
