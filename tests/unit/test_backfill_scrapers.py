"""Backfill per scraper (the agent's side): the gateway names each request's scraper in
X-Raven-Scraper; the two replicas of an HA pair scraping one target are two targets, each
with its own interval and phase, each filled on its own; the buffer keeps the scraper (and a
buffer written before scrapers were named still opens); the batch carries it."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.backfill.learn import RequestSeen, TargetTable, parse_request_head
from edge_agent.backfill.store import BufferStore
from raven.backfill.wire import Batch, Scrape, WireError, decode_batch, encode_batch, unpack

PROM_0, PROM_1 = "10.42.0.7", "10.42.1.9"


def head(scraper: str) -> bytes:
    return f"GET /metrics HTTP/1.1\r\nHost: edge-gpu-1:9400\r\nX-Raven-Scraper: {scraper}".encode()


def test_the_scraper_header_is_read_and_garbage_in_it_is_no_scrape() -> None:
    seen = parse_request_head("edge-gpu-1", 9400, head(PROM_0))
    assert seen is not None and seen.scraper == PROM_0
    v6 = parse_request_head("edge-gpu-1", 9400, head("fd00::7/dns"))
    assert v6 is not None and v6.scraper == "fd00::7/dns"
    for bad in ("evil\x01", "a" * 65, "10.0.0.1; drop", "10.0.0.1/DNS"):
        assert parse_request_head("edge-gpu-1", 9400, head(bad)) is None


def test_an_ha_pair_is_two_targets_each_filled_on_its_own_phase() -> None:
    table = TargetTable(max_targets=16, forget_after_s=600, keep_while_down_s=3600)
    base = RequestSeen("edge-gpu-1", 9400, "/metrics", "", None)
    for k in range(6):  # both scrape every 10 s, 3 s apart
        table.observe(replace(base, scraper=PROM_0), 1000.0 + 10 * k)
        table.observe(replace(base, scraper=PROM_1), 1003.0 + 10 * k)
    assert sorted(table.targets) == [("edge-gpu-1", 9400, "/metrics", s) for s in (PROM_0, PROM_1)]
    assert {t.interval_s for t in table.targets.values()} == {10.0}  # not 5: each its own
    # the link goes down after both scraped at 1050/1053: each is filled on its own phase
    due: dict[str, list[float]] = {t.scraper: [] for t in table.targets.values()}
    now = 1053.5
    while now < 1080:
        for t in table.due(now, tunnel_up=False):
            due[t.scraper].append(round(now))
        now += 0.5
    assert due == {PROM_0: [1060, 1070], PROM_1: [1063, 1073]}


def test_the_buffer_keeps_the_scraper_and_old_buffers_open(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    old = sqlite3.connect(path)  # a buffer as written before scrapers were named
    old.executescript("""
        CREATE TABLE targets (id INTEGER PRIMARY KEY, node TEXT NOT NULL, port INTEGER NOT NULL,
            path TEXT NOT NULL, accept TEXT NOT NULL, timeout_s REAL, interval_s REAL,
            last_seen REAL NOT NULL, UNIQUE (node, port, path));
        CREATE TABLE scrapes (id INTEGER PRIMARY KEY AUTOINCREMENT, target_id INTEGER NOT NULL,
            ts_ms INTEGER NOT NULL, nsamples INTEGER NOT NULL, nbytes INTEGER NOT NULL,
            data BLOB NOT NULL);
        INSERT INTO targets VALUES (7, 'edge-gpu-1', 9400, '/metrics', '', NULL, 10.0, 1.0);
    """)
    old.commit()
    old.close()
    store = BufferStore(path, max_bytes=1 << 20, max_age_s=3600)
    samples = (("up", (), 1.0, None),)
    store.add(Scrape("edge-gpu-1", 9400, "/metrics", 1000, samples), now_ms=1000)  # old target
    store.add(Scrape("edge-gpu-1", 9400, "/metrics", 1001, samples, PROM_0), now_ms=1001)
    store.add(Scrape("edge-gpu-1", 9400, "/metrics", 1002, samples, PROM_1), now_ms=1002)
    rows, bad = store.next_batch(max_bytes=1 << 20, ready_before_ms=10_000)
    assert bad == 0 and [r.scrape.scraper for r in rows] == ["", PROM_0, PROM_1]
    assert {t.scraper for t in store.load_targets()} == {"", PROM_0, PROM_1}
    assert store.delete_local_from(("edge-gpu-1", 9400, "/metrics", PROM_0), 0) == 1
    store.close()


def test_the_batch_carries_the_scraper() -> None:
    samples = (("up", (), 1.0, None),)
    batch = Batch(1, (Scrape("n", 1, "/m", 5, samples, PROM_0), Scrape("n", 1, "/m", 6, samples)))
    assert decode_batch(unpack(encode_batch(batch)[4:])) == batch
    raw = unpack(encode_batch(batch)[4:])
    raw["scrapes"][0]["scraper"] = "x" * 65
    with pytest.raises(WireError, match="scraper"):
        decode_batch(raw)
