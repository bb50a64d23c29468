"""The on-disk backfill buffer: order, caps, age, restart, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from edge_agent.backfill.learn import Target
from raven.backfill.wire import Sample, Scrape
from tests.helpers.backfill_store import MIB, open_store, scrape


def test_rows_come_back_in_order_and_are_deleted_on_ack(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for ts in (1000, 2000, 3000):
        store.add(scrape(ts), now_ms=3000)
    assert store.totals.rows == 3 and store.totals.samples == 9
    assert store.totals.oldest_ts_ms == 1000
    rows, bad = store.next_batch(max_bytes=1, ready_before_ms=10_000)
    assert bad == 0 and [r.scrape.ts_ms for r in rows] == [1000]  # at least one row
    rows, _ = store.next_batch(max_bytes=MIB, ready_before_ms=2500)
    assert [r.scrape.ts_ms for r in rows] == [1000, 2000]
    assert rows[0].scrape == scrape(1000)
    store.delete_rows([r.row_id for r in rows])
    assert store.totals.rows == 1 and store.totals.oldest_ts_ms == 3000
    store.close()


def test_restart_keeps_rows_and_targets(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.add(scrape(1000), now_ms=1000)
    store.save_target(Target("edge-gpu-1", 9400, "/metrics", "text/plain", 1.0, 2.0, 999.5))
    store.close()
    again = open_store(tmp_path)
    assert again.totals.rows == 1 and again.totals.samples == 3
    (t,) = again.load_targets()
    assert (t.node, t.interval_s, t.last_seen, t.accept) == ("edge-gpu-1", 2.0, 999.5, "text/plain")
    again.close()


def test_local_scrapes_prometheus_also_has_are_deleted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for ts in (1000, 2000, 3000):
        store.add(scrape(ts), now_ms=3000)
    store.add(scrape(2500, node="edge-gpu-2"), now_ms=3000)
    assert store.delete_local_from(("edge-gpu-1", 9400, "/metrics", ""), 2000) == 2
    rows, _ = store.next_batch(MIB, 10_000)
    assert [(r.scrape.node, r.scrape.ts_ms) for r in rows] == [
        ("edge-gpu-1", 1000),
        ("edge-gpu-2", 2500),
    ]
    store.close()


def test_size_cap_drops_the_oldest_and_counts(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_bytes=1 * MIB)
    n = 0
    while store.dropped["cap"] == 0:
        n += 1
        store.add(scrape(n * 1000, n=200, salt=n), now_ms=n * 1000)
    for _ in range(200):
        n += 1
        store.add(scrape(n * 1000, n=200, salt=n), now_ms=n * 1000)
    assert store.totals.bytes <= 1 * MIB
    assert store.dropped["cap"] % 200 == 0 and store.dropped["cap"] > 0
    rows, _ = store.next_batch(16 * MIB, 10**12)
    kept = [r.scrape.ts_ms for r in rows]
    assert kept == sorted(kept) and kept[-1] == n * 1000  # the newest are kept
    assert len(kept) + store.dropped["cap"] // 200 == n  # every scrape kept or counted
    # the file stays within the cap plus the bounded WAL
    assert store.file_bytes() <= 1 * MIB * 1.5 + store.journal_limit_bytes
    store.close()


def test_age_cap(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_age_s=10.0)
    store.add(scrape(1_000), now_ms=1_000)
    store.add(scrape(5_000), now_ms=5_000)
    store.add(scrape(12_000), now_ms=12_000)  # 1_000 is now older than 10 s
    assert store.dropped["age"] == 3 and store.totals.oldest_ts_ms == 5_000
    store.close()


def test_too_large_single_scrape_is_counted(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_bytes=1 * MIB)
    big: list[Sample] = [
        (f"m{i}", (("x", os.urandom(16).hex()),), float(i), None) for i in range(60000)
    ]
    store.add(Scrape("n", 1, "/", 1, tuple(big)), now_ms=1)
    assert store.totals.rows == 0 and store.dropped["cap"] == 60000
    store.close()


def test_corrupt_rows_are_dropped_not_sent(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.add(scrape(1000), now_ms=1000)
    store.add(scrape(2000), now_ms=2000)
    store.db.execute("UPDATE scrapes SET data = x'00ff' WHERE ts_ms = 1000")
    rows, bad = store.next_batch(MIB, 10_000)
    assert bad == 1 and [r.scrape.ts_ms for r in rows] == [2000]
    assert store.dropped["corrupt"] == 3 and store.totals.rows == 1
    store.close()


def test_what_was_stored_survives_kill_9(tmp_path: Path) -> None:
    """A writer process prints each ts once add() returned; SIGKILL it mid-stream: every
    acknowledged row is there after reopening, and the database is intact."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = {[str(Path.cwd())]!r}
        from pathlib import Path
        from tests.helpers.backfill_store import open_store, scrape
        store = open_store(Path({str(tmp_path)!r}))
        ts = 0
        while True:
            ts += 1
            store.add(scrape(ts, n=50), now_ms=ts)
            print(ts, flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = 0
    for line in proc.stdout:
        acked = int(line)
        if acked >= 300:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = open_store(tmp_path)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows, bad = store.next_batch(64 * MIB, 10**12)
    stored = [r.scrape.ts_ms for r in rows]
    assert bad == 0 and stored[:acked] == list(range(1, acked + 1))
    store.close()


def test_forgotten_targets_leave_the_table_once_their_scrapes_are_sent(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.add(scrape(1000), now_ms=1000)
    store.save_target(Target("edge-gpu-2", 9400, "/metrics", "", 1.0, 2.0, 5.0))
    store.forget_target("edge-gpu-2", 9400, "/metrics")
    store.forget_target("edge-gpu-1", 9400, "/metrics")  # still has a buffered scrape: kept
    assert [t.node for t in store.load_targets()] == ["edge-gpu-1"]
    rows, _ = store.next_batch(MIB, 10_000)
    store.delete_rows([r.row_id for r in rows])
    store.forget_target("edge-gpu-1", 9400, "/metrics")
    assert store.load_targets() == []
    store.add(scrape(2000), now_ms=2000)  # learned again later: a new row, sent as usual
    assert [r.scrape.ts_ms for r in store.next_batch(MIB, 10_000)[0]] == [2000]
    store.close()


def test_the_batch_being_sent_is_not_dropped_by_the_cap(tmp_path: Path) -> None:
    """A row the sender has taken is delivered, not also counted as dropped: the size cap
    drops the rows after the batch in flight (for SENDING_GRACE_MS at most)."""
    from edge_agent.backfill.store import SENDING_GRACE_MS

    store = open_store(tmp_path, max_bytes=16 * 1024)  # ~10 rows of ~1.6 KB
    t0 = 1_000_000
    for i in range(3):
        store.add(scrape(t0 + i, n=200, salt=i), t0 + i)
    rows, _ = store.next_batch(1, t0 + 10, now_ms=t0 + 10)
    assert [r.scrape.ts_ms for r in rows] == [t0]
    for i in range(3, 40):  # over the cap while the first row is in flight
        store.add(scrape(t0 + i, n=200, salt=i), t0 + 10)
    kept = [ts for (ts,) in store.db.execute("SELECT ts_ms FROM scrapes ORDER BY id")]
    assert kept[0] == t0 and store.dropped["cap"] > 0  # the in-flight row stayed
    store.delete_rows([rows[0].row_id])
    # a send that never ends stops sparing its rows after the grace period
    rows, _ = store.next_batch(1, t0 + 100, now_ms=t0 + 100)
    for i in range(40, 80):
        store.add(scrape(t0 + i, n=200, salt=i), t0 + 100 + SENDING_GRACE_MS + 1)
    kept = [ts for (ts,) in store.db.execute("SELECT ts_ms FROM scrapes ORDER BY id")]
    assert rows[0].scrape.ts_ms not in kept
