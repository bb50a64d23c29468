"""The agent's on-disk backfill buffer as its tests open it, and scrapes to fill it with (also
imported by the kill -9 test's child process)."""

from __future__ import annotations

from pathlib import Path

from edge_agent.backfill.store import BufferStore
from raven.backfill.wire import Sample, Scrape

MIB = 1024 * 1024


def scrape(ts_ms: int, n: int = 3, node: str = "edge-gpu-1", salt: int = 0) -> Scrape:
    samples: list[Sample] = [
        (f"metric_{i}", (("gpu", str(i)), ("salt", str(salt))), float(ts_ms + i), None)
        for i in range(n)
    ]
    return Scrape(node, 9400, "/metrics", ts_ms, tuple(samples))


def open_store(path: Path, max_bytes: int = 8 * MIB, max_age_s: float = 3600.0) -> BufferStore:
    return BufferStore(path / "b.sqlite3", max_bytes=max_bytes, max_age_s=max_age_s)
