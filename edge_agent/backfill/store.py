"""The on-disk backfill buffer: SQLite (standard library) in WAL mode.

One row per local scrape (its samples as zlib-compressed JSON), plus the learned targets so
that an agent restarted during an outage goes on scraping them. A row is stored once its
transaction committed: WAL with ``synchronous=NORMAL`` survives kill -9 of the agent (the
commit is in the OS's hands); ``synchronous=FULL`` also survives a power loss, at one fsync
per commit.

Bounded: the rows' bytes never exceed ``max_bytes`` and no row is older than ``max_age_s``;
the oldest rows go first and their samples are counted (``dropped``). Freed pages are reused,
the WAL is checkpointed and truncated to ``journal_limit_bytes``. Memory: one batch at a time.

Not thread-safe: the agent uses it from one worker thread.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path

from edge_agent.backfill.learn import Target, TargetKey
from raven.backfill.wire import Sample, Scrape, WireError, samples_from_json, samples_to_json

#: A buffer written before targets had a scraper: the table rebuilt with the column (ids
#: kept, so the scrapes keep their targets), every old target the unnamed scraper's.
_ADD_SCRAPER = """
CREATE TABLE targets_v2 (
    id INTEGER PRIMARY KEY, node TEXT NOT NULL, port INTEGER NOT NULL, path TEXT NOT NULL,
    scraper TEXT NOT NULL DEFAULT '',
    accept TEXT NOT NULL, timeout_s REAL, interval_s REAL, last_seen REAL NOT NULL,
    UNIQUE (node, port, path, scraper));
INSERT INTO targets_v2 (id, node, port, path, scraper, accept, timeout_s, interval_s, last_seen)
    SELECT id, node, port, path, '', accept, timeout_s, interval_s, last_seen FROM targets;
DROP TABLE targets;
ALTER TABLE targets_v2 RENAME TO targets;
"""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS targets (
    id INTEGER PRIMARY KEY, node TEXT NOT NULL, port INTEGER NOT NULL, path TEXT NOT NULL,
    scraper TEXT NOT NULL DEFAULT '',
    accept TEXT NOT NULL, timeout_s REAL, interval_s REAL, last_seen REAL NOT NULL,
    UNIQUE (node, port, path, scraper));
CREATE TABLE IF NOT EXISTS scrapes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, target_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL,
    nsamples INTEGER NOT NULL, nbytes INTEGER NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS scrapes_target_ts ON scrapes (target_id, ts_ms);
CREATE INDEX IF NOT EXISTS scrapes_ts ON scrapes (ts_ms);
"""
#: Row selections (constant SQL, values bound): what _remove() may delete.
_COUNT = {
    "older": "SELECT COUNT(*), TOTAL(nsamples), TOTAL(nbytes) FROM scrapes WHERE ts_ms < ?",
    "up_to_id": "SELECT COUNT(*), TOTAL(nsamples), TOTAL(nbytes) FROM scrapes"
    " WHERE id > ? AND id <= ?",
    "ids": "SELECT COUNT(*), TOTAL(nsamples), TOTAL(nbytes) FROM scrapes"
    " WHERE id IN (SELECT value FROM json_each(?))",
    "target_from": "SELECT COUNT(*), TOTAL(nsamples), TOTAL(nbytes) FROM scrapes"
    " WHERE target_id = ? AND ts_ms >= ?",
}
_DELETE = {
    "older": "DELETE FROM scrapes WHERE ts_ms < ?",
    "up_to_id": "DELETE FROM scrapes WHERE id > ? AND id <= ?",
    "ids": "DELETE FROM scrapes WHERE id IN (SELECT value FROM json_each(?))",
    "target_from": "DELETE FROM scrapes WHERE target_id = ? AND ts_ms >= ?",
}
#: How long the batch being sent is spared by the size cap (a send that never ends -- the
#: tunnel died mid-batch -- does not keep the oldest rows from being dropped for longer).
SENDING_GRACE_MS = 60_000
#: Per-row overhead counted against the cap besides the blob (row header, index entries).
ROW_OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class Row:
    row_id: int
    scrape: Scrape
    nsamples: int


@dataclass
class Totals:
    rows: int = 0
    samples: int = 0
    bytes: int = 0
    oldest_ts_ms: int | None = None


class BufferStore:
    """Bounded buffer of local scrapes. ``dropped`` counts samples lost at the caps by
    reason (``cap``: size, ``age``: too old)."""

    def __init__(
        self, path: Path, *, max_bytes: int, max_age_s: float, synchronous: str = "normal"
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_age_ms = int(max_age_s * 1000)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self.journal_limit_bytes = max(256 * 1024, min(8 * 1024 * 1024, max_bytes // 8))
        self.db.execute(f"PRAGMA journal_size_limit={self.journal_limit_bytes}")
        page = self.db.execute("PRAGMA page_size").fetchone()[0]
        self.db.execute(f"PRAGMA wal_autocheckpoint={max(16, self.journal_limit_bytes // page)}")
        self._migrate()
        self.db.executescript(_SCHEMA)
        self.dropped: dict[str, int] = {"cap": 0, "age": 0, "corrupt": 0}
        self._target_ids: dict[TargetKey, int] = {}
        rows = self.db.execute("SELECT id, node, port, path, scraper FROM targets")
        for tid, node, port, tpath, scraper in rows:
            self._target_ids[(node, port, tpath, scraper)] = tid
        self.totals = self._load_totals()
        #: (last row id, when taken in ms) of the batch being sent: the size cap drops rows
        #: after it, so a row is never both delivered and counted as dropped
        self._sending: tuple[int, int] | None = None

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        columns = [row[1] for row in self.db.execute("PRAGMA table_info(targets)")]
        if columns and "scraper" not in columns:
            self.db.executescript(f"BEGIN;{_ADD_SCRAPER}COMMIT;")

    def _load_totals(self) -> Totals:
        n, samples, nbytes, oldest = self.db.execute(
            "SELECT COUNT(*), TOTAL(nsamples), TOTAL(nbytes), MIN(ts_ms) FROM scrapes"
        ).fetchone()
        return Totals(n, int(samples), int(nbytes) + n * ROW_OVERHEAD_BYTES, oldest)

    # ------------------------------------------------------------ targets
    def save_target(self, t: Target) -> None:
        self.db.execute(
            "INSERT INTO targets"
            " (node, port, path, scraper, accept, timeout_s, interval_s, last_seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node, port, path, scraper) DO UPDATE"
            " SET accept=excluded.accept, timeout_s=excluded.timeout_s,"
            " interval_s=excluded.interval_s, last_seen=excluded.last_seen",
            (*t.key, t.accept, t.timeout_s, t.interval_s, t.last_seen),
        )

    def save_targets(self, targets: list[Target]) -> None:
        self.db.execute("BEGIN")
        try:
            for t in targets:
                self.save_target(t)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def forget_target(self, node: str, port: int, path: str, scraper: str = "") -> None:
        """A target no longer scraped: its row goes once no buffered scrape refers to it (the
        table stays bounded; a target with buffered scrapes is kept until they are sent)."""
        key = (node, port, path, scraper)
        self.db.execute(
            "DELETE FROM targets WHERE node=? AND port=? AND path=? AND scraper=?"
            " AND NOT EXISTS (SELECT 1 FROM scrapes WHERE scrapes.target_id = targets.id)",
            key,
        )
        if not self.db.execute(
            "SELECT 1 FROM targets WHERE node=? AND port=? AND path=? AND scraper=?", key
        ).fetchone():
            self._target_ids.pop(key, None)

    def load_targets(self) -> list[Target]:
        rows = self.db.execute(
            "SELECT node, port, path, accept, timeout_s, interval_s, last_seen, scraper"
            " FROM targets"
        ).fetchall()
        return [Target(n, p, pa, a, to, iv, ls, scraper=sc)
                for n, p, pa, a, to, iv, ls, sc in rows]  # fmt: skip

    def _target_id(self, key: TargetKey) -> int:
        tid = self._target_ids.get(key)
        if tid is None:
            self.db.execute(
                "INSERT OR IGNORE INTO targets (node, port, path, scraper, accept, last_seen)"
                " VALUES (?, ?, ?, ?, '', 0)",
                key,
            )
            tid = self.db.execute(
                "SELECT id FROM targets WHERE node=? AND port=? AND path=? AND scraper=?", key
            ).fetchone()[0]
            self._target_ids[key] = tid
        return tid

    # ------------------------------------------------------------ scrapes
    def add(self, scrape: Scrape, now_ms: int) -> None:
        """Store one scrape (committed when this returns), then enforce the caps."""
        data = zlib.compress(json.dumps(samples_to_json(scrape.samples)).encode(), 6)
        nbytes = len(data)
        if nbytes + ROW_OVERHEAD_BYTES > self.max_bytes:
            self.dropped["cap"] += len(scrape.samples)
            return
        tid = self._target_id((scrape.node, scrape.port, scrape.path, scrape.scraper))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute(
                "INSERT INTO scrapes (target_id, ts_ms, nsamples, nbytes, data)"
                " VALUES (?, ?, ?, ?, ?)",
                (tid, scrape.ts_ms, len(scrape.samples), nbytes, data),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        t = self.totals
        t.rows += 1
        t.samples += len(scrape.samples)
        t.bytes += nbytes + ROW_OVERHEAD_BYTES
        if t.oldest_ts_ms is None or scrape.ts_ms < t.oldest_ts_ms:
            t.oldest_ts_ms = scrape.ts_ms
        self.enforce_caps(now_ms)

    def enforce_caps(self, now_ms: int) -> None:
        cutoff = now_ms - self.max_age_ms
        if self.totals.oldest_ts_ms is not None and self.totals.oldest_ts_ms < cutoff:
            self._drop("older", (cutoff,), "age")
        if self.totals.bytes <= self.max_bytes:
            return
        # drop the oldest rows (insertion order) down to 95% of the cap: a drop now and
        # then rather than one at every insert
        excess = self.totals.bytes - int(self.max_bytes * 0.95)
        run = 0
        last_id = None
        sending = self._sending
        floor = sending[0] if sending and now_ms - sending[1] < SENDING_GRACE_MS else 0
        cur = self.db.execute("SELECT id, nbytes FROM scrapes WHERE id > ? ORDER BY id", (floor,))
        for rid, nbytes in cur:
            run += nbytes + ROW_OVERHEAD_BYTES
            last_id = rid
            if run >= excess:
                break
        cur.close()
        if last_id is not None:
            self._drop("up_to_id", (floor, last_id), "cap")

    def _remove(self, where: str, args: tuple[int | str, ...]) -> tuple[int, int]:
        """Delete the rows selected by ``_WHERE[where]``: (rows, samples) removed."""
        n, samples, nbytes = self.db.execute(_COUNT[where], args).fetchone()
        if not n:
            return 0, 0
        self.db.execute(_DELETE[where], args)
        self._forget(n, int(samples), int(nbytes))
        return int(n), int(samples)

    def _drop(self, where: str, args: tuple[int | str, ...], reason: str) -> None:
        self.dropped[reason] += self._remove(where, args)[1]

    def _forget(self, rows: int, samples: int, nbytes: int) -> None:
        t = self.totals
        t.rows -= rows
        t.samples -= samples
        t.bytes -= nbytes + rows * ROW_OVERHEAD_BYTES
        if t.rows <= 0:
            self.totals = Totals()
        else:
            t.oldest_ts_ms = self.db.execute("SELECT MIN(ts_ms) FROM scrapes").fetchone()[0]

    def delete_local_from(self, key: TargetKey, from_ms: int) -> int:
        """Delete the target's local scrapes at or after ``from_ms`` (Prometheus has them)."""
        tid = self._target_ids.get(key)
        if tid is None:
            return 0
        return self._remove("target_from", (tid, from_ms))[0]

    def next_batch(
        self, max_bytes: int, ready_before_ms: int, now_ms: int | None = None
    ) -> tuple[list[Row], int]:
        """The oldest rows older than ``ready_before_ms`` (at least one, else up to about
        ``max_bytes`` of stored data), in order; and how many rows were unreadable (deleted,
        counted as ``corrupt``)."""
        rows: list[Row] = []
        bad: list[int] = []
        size = 0
        cur = self.db.execute(
            "SELECT s.id, t.node, t.port, t.path, t.scraper, s.ts_ms, s.nsamples, s.nbytes,"
            " s.data FROM scrapes s JOIN targets t ON t.id = s.target_id"
            " WHERE s.ts_ms < ? ORDER BY s.id",
            (ready_before_ms,),
        )
        for rid, node, port, path, scraper, ts_ms, nsamples, nbytes, data in cur:
            if rows and size + nbytes > max_bytes:
                break
            try:
                samples: tuple[Sample, ...] = samples_from_json(json.loads(zlib.decompress(data)))
            except (zlib.error, ValueError, WireError):
                bad.append(rid)
                continue
            rows.append(Row(rid, Scrape(node, port, path, ts_ms, samples, scraper), nsamples))
            size += nbytes
        cur.close()
        for rid in bad:
            self._drop("ids", (json.dumps([rid]),), "corrupt")
        taken = ready_before_ms if now_ms is None else now_ms
        self._sending = (rows[-1].row_id, taken) if rows else None
        return rows, len(bad)

    def delete_rows(self, row_ids: list[int]) -> None:
        """Rows acknowledged by the gateway (or refused for good)."""
        if row_ids:
            self._remove("ids", (json.dumps(row_ids),))
            if self._sending is not None and max(row_ids) >= self._sending[0]:
                self._sending = None

    def file_bytes(self) -> int:
        """The database file and its WAL, on disk."""
        total = 0
        for suffix in ("", "-wal"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                total += p.stat().st_size
        return total
