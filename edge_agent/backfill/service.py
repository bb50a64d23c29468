"""The agent's backfill service: target learning, local scrapes, buffer, sender.

Hooks: the relay asks :meth:`BackfillService.sniffer` for a request watcher per stream; the
agent app tells :meth:`tunnel_changed`; ``tunnels()`` lists the live tunnels. All database work
runs on one worker thread, in submission order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from edge_agent.backfill.exposition import ExpositionError, parse_exposition
from edge_agent.backfill.learn import RequestSeen, RequestSniffer, Target, TargetTable
from edge_agent.backfill.metrics import BackfillMetrics
from edge_agent.backfill.scraper import ScrapeFailed, scrape
from edge_agent.backfill.sender import Sender
from edge_agent.backfill.store import BufferStore, Row, Totals
from raven.backfill.wire import Batch, Scrape, encode_batch
from raven.config.backfill import AgentBackfillConfig
from raven.protocol.names import normalize_node_name
from raven.telemetry.logthrottle import LogThrottle
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.tunnel import Tunnel

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How often due local scrapes are looked for (a local scrape is at most this late).
TICK_S = 0.1
#: Targets' last arrival times are written to the buffer this often (restart keeps the phase).
PERSIST_EVERY_S = 30.0
#: Rows younger than this plus one interval are not sent yet: Prometheus's first scrape
#: after a reconnect may still make the newest local ones redundant (deleted).
HOLD_BACK_S = 1.0
DB_FILE = "buffer.sqlite3"


class BackfillService:
    def __init__(
        self,
        config: AgentBackfillConfig,
        *,
        nodes: Callable[[], Mapping[str, str]],
        tunnels: Callable[[], list[Tunnel]],
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.nodes = nodes
        self.tunnels = tunnels
        self.clock = clock
        self.table = TargetTable(
            max_targets=config.max_targets,
            forget_after_s=config.forget_after_s,
            keep_while_down_s=config.max_age_s,
        )
        for et in config.targets:
            self.table.add_explicit(
                Target(
                    normalize_node_name(et.node), et.port, et.path, et.accept, et.timeout_s,
                    et.interval_s,
                )
            )  # fmt: skip
        self._db = ThreadPoolExecutor(1, thread_name_prefix="backfill-db")
        self.store: BufferStore | None = None
        self.metrics = BackfillMetrics(registry, self._totals, self.table, self._dropped)
        self.sender = Sender(
            tunnels=tunnels,
            next_rows=self._next_rows,
            encode=self._encode,
            delete_rows=self._delete_rows,
            metrics=self.metrics,
            bytes_per_s=config.send_bytes_per_s,
            duty_cycle=config.send_duty_cycle,
            buffered=self._buffered,
        )
        self._slots = asyncio.Semaphore(config.max_concurrent_scrapes)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._throttle = LogThrottle(clock=time.monotonic)
        self._tunnel_up = False

    # ------------------------------------------------------------ hooks
    def sniffer(self, node: str, port: int) -> RequestSniffer | None:
        return RequestSniffer(node, port, self._on_request) if self.config.learn else None

    def tunnel_changed(self) -> None:
        up = any(not t.closed.done() for t in self.tunnels())
        if up != self._tunnel_up:
            self._tunnel_up = up
            log.info("backfill: tunnel %s", "up" if up else "down: local scrapes take over")
        if up:
            self.sender.wake.set()

    def _on_request(self, seen: RequestSeen) -> None:
        served = self.table.observe(seen, self.clock())
        if served is None:
            return
        if served.new:
            log.info("backfill: learned target %s:%d%s scraper=%s",
                     seen.node, seen.port, seen.path, seen.scraper or "-")  # fmt: skip
            self._db_later(self._store().save_target, served.target)
        if served.delete_local_from is not None:
            t = served.target
            log.info("backfill: Prometheus scrapes %s:%d%s again", t.node, t.port, t.path)
            self._db_later(
                self._store().delete_local_from, t.key,
                int(served.delete_local_from * 1000),
            )  # fmt: skip
            self._db_later(self._store().save_target, t)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        path = Path(self.config.dir) / DB_FILE
        cfg = self.config
        self.store = await self._run_db(
            lambda: BufferStore(
                path, max_bytes=cfg.max_bytes, max_age_s=cfg.max_age_s,
                synchronous=cfg.synchronous,
            )
        )  # fmt: skip
        self.table.restore(await self._run_db(self.store.load_targets), self.clock())
        t = self.store.totals
        log.info(
            "backfill buffer opened path=%s targets=%d buffered_samples=%d",
            path, len(self.table.targets), t.samples,
        )  # fmt: skip
        self._session = aiohttp.ClientSession(auto_decompress=True)
        self._spawn(self._schedule_loop(), "backfill schedule")
        self._spawn(self._persist_loop(), "backfill persist")
        self._spawn(self.sender.run(), "backfill sender")

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self.store is not None:
            store = self.store
            with contextlib.suppress(Exception):
                await self._run_db(
                    functools.partial(store.save_targets, list(self.table.targets.values()))
                )
            await self._run_db(store.close)
        self._db.shutdown(wait=True)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ database thread
    def _store(self) -> BufferStore:
        assert self.store is not None, "backfill service not started"
        return self.store

    async def _run_db(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn)

    def _db_later(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.store is None:
            return
        future = self._db.submit(fn, *args)
        future.add_done_callback(self._db_done)

    def _db_done(self, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            log.error("backfill buffer write failed err=%s", exc)

    def _totals(self) -> Totals:
        return self.store.totals if self.store is not None else Totals()

    def _dropped(self) -> dict[str, int]:
        return dict(self.store.dropped) if self.store is not None else {}

    def _buffered(self) -> dict[str, float]:
        t = self._totals()
        out: dict[str, float] = {"samples": t.samples, "bytes": t.bytes}
        if t.oldest_ts_ms is not None:
            out["oldest_ts_ms"] = t.oldest_ts_ms
        return out

    async def _next_rows(self) -> list[Row]:
        intervals = [t.interval_s or 0.0 for t in self.table.targets.values()]
        hold_s = HOLD_BACK_S + min(120.0, max(intervals, default=0.0))
        now = self.clock()
        ready_before = int((now - hold_s) * 1000)
        store = self._store()
        rows, bad = await self._run_db(
            lambda: store.next_batch(self.config.batch_bytes, ready_before, int(now * 1000))
        )
        if bad:
            log.error("backfill buffer: %d unreadable rows dropped", bad)
        self.metrics.sync_dropped()
        return rows

    async def _encode(self, batch: Batch) -> bytes:
        return await self._run_db(functools.partial(encode_batch, batch))

    async def _delete_rows(self, ids: list[int]) -> None:
        store = self._store()
        await self._run_db(lambda: store.delete_rows(ids))

    # ------------------------------------------------------------ local scrapes
    async def _schedule_loop(self) -> None:
        while True:
            self.tunnel_changed()
            for t in self.table.due(self.clock(), self._tunnel_up):
                if self._slots.locked():
                    self.metrics.local_scrapes.labels("busy").inc()
                    continue
                self._spawn(self._local_scrape(t), f"backfill scrape {t.node}:{t.port}")
            for key in self.table.forgotten:
                log.info("backfill: forgot target %s:%d%s (not scraped for forget_after_s)", *key)
                self._db_later(self._store().forget_target, *key)
            self.table.forgotten.clear()
            await asyncio.sleep(TICK_S)

    async def _local_scrape(self, t: Target) -> None:
        async with self._slots:
            address = self.nodes().get(t.node)
            if address is None or self._session is None:
                self.metrics.local_scrapes.labels("unknown_node").inc()
                return
            started = self.clock()
            try:
                body, ctype = await scrape(self._session, address, t, self.config.max_scrape_bytes)
            except ScrapeFailed as exc:
                self.metrics.local_scrapes.labels(exc.result).inc()
                self._throttle.log(
                    log, logging.WARNING, f"scrape {t.key}",
                    "backfill: local scrape failed target=%s:%d%s result=%s err=%s",
                    t.node, t.port, t.path, exc.result, exc,
                )  # fmt: skip
                return
            store = self._store()
            cap = self.config.max_samples_per_scrape

            def parse_and_store() -> int:
                samples = parse_exposition(body, ctype, cap)
                ts_ms = int(started * 1000)
                store.add(Scrape(t.node, t.port, t.path, ts_ms, tuple(samples), t.scraper), ts_ms)
                return len(samples)

            try:
                await self._run_db(parse_and_store)
            except ExpositionError as exc:
                self.metrics.local_scrapes.labels("bad_exposition").inc()
                self._throttle.log(
                    log, logging.WARNING, f"parse {t.key}",
                    "backfill: target's page not parsable target=%s:%d%s err=%s",
                    t.node, t.port, t.path, exc,
                )  # fmt: skip
                return
            except Exception as exc:  # sqlite3 errors (disk full ...): counted, logged
                self.metrics.local_scrapes.labels("store_error").inc()
                self._throttle.log(
                    log, logging.ERROR, "store", "backfill: buffer write failed err=%s", exc
                )
                return
            self.metrics.local_scrapes.labels("ok").inc()
            self.metrics.sync_dropped()

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_EVERY_S)
            await self._run_db(
                functools.partial(self._store().save_targets, list(self.table.targets.values()))
            )

    # ------------------------------------------------------------ status
    def status_json(self) -> dict[str, Any]:
        t = self._totals()
        return {
            "targets": len(self.table.targets),
            "targets_local": self.table.local_count,
            "buffered_samples": t.samples,
            "buffered_bytes": t.bytes,
            "oldest_buffered_ms": t.oldest_ts_ms,
            "dropped_samples": self._dropped(),
            "last_ack": self.sender.last_ack_wall,
            "last_error": self.sender.last_error,
        }
