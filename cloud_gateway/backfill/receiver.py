"""The gateway's end of the backfill stream: authorise, label, filter, remote-write, ack.

An agent opens the stream to the reserved pseudo-target; every batch is answered only after
Prometheus answered: ``ok`` on 2xx (the agent deletes the batch), ``retry`` otherwise (the
agent keeps it: nothing within its caps is lost while Prometheus refuses or is away). Samples
of nodes the agent's key is not authorised for, of ports with no configured job, too old
for the out-of-order window or from an edge clock running ahead are dropped here and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cloud_gateway.backfill.remote_write import RemoteWriteError, RemoteWriter, Series, encode_body
from cloud_gateway.backfill.routing import route
from cloud_gateway.backfill.scrapers import ScraperBook
from cloud_gateway.backfill.series import Converted, convert
from raven.backfill.wire import (
    BACKFILL_NODE,
    BACKFILL_PORT,
    Ack,
    Batch,
    MessageReader,
    Scrape,
    WireError,
    decode_batch,
    encode_ack,
    unpack,
)
from raven.config.backfill import GatewayBackfillConfig
from raven.protocol.codes import StreamCode
from raven.telemetry.logs import doc_link, fields
from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge, Histogram
from raven.transport.stream import StreamResetError
from raven.transport.tunnel import TunnelStream

log = logging.getLogger(__name__)

#: Remote writes in flight at once, all agents together (protects Prometheus).
MAX_CONCURRENT_WRITES = 4
#: Receivers written to (one per Prometheus replica with per-scraper receivers) kept open.
MAX_RECEIVERS = 16


def _decode(body: bytes) -> Batch:
    return decode_batch(unpack(body))


#: Drops an operator must act on: logged (with their line of docs/troubleshooting.md), not only
#: counted. Too old samples and a full buffer are the backfill working as configured.
LOGGED_DROPS = ("unauthorised", "no_job", "future", "no_scraper", "scraper_gone")


class BackfillMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.samples = Counter(
            "raven_gateway_backfill_samples_total",
            "Backfilled samples by agent and result (written, too_old, future, no_job,"
            " unauthorised).",
            ["agent", "result"],
            registry=registry,
        )
        self.writes = Counter(
            "raven_gateway_backfill_remote_writes_total",
            "Remote-write requests to the receiver by result (ok, throttled: 429,"
            " client_error: other 4xx, server_error, unreachable: no answer, TLS or a secret"
            " file unreadable).",
            ["result"],
            registry=registry,
        )
        self.deferred = Counter(
            "raven_gateway_backfill_batches_deferred_total",
            "Agents' batches answered 'retry later' without a request, while the receiver's"
            " Retry-After had not passed.",
            registry=registry,
        )
        self.duration = Histogram(
            "raven_gateway_backfill_remote_write_duration_seconds",
            "Duration of remote-write requests.",
            registry=registry,
        )
        self.buffered = Gauge(
            "raven_gateway_backfill_agent_buffered_samples",
            "Samples an agent reported buffered with its last batch.",
            ["agent"],
            registry=registry,
        )


@dataclass
class AgentBackfillStatus:
    """What the agents API shows per site."""

    batches: int = 0
    samples_written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    last_batch: float | None = None
    last_error: str = ""
    buffered: dict[str, float] = field(default_factory=dict)

    def to_json(self, now: float) -> dict[str, Any]:
        oldest_ms = self.buffered.get("oldest_ts_ms")
        return {
            "batches": self.batches,
            "samples_written": self.samples_written,
            "samples_dropped": dict(self.dropped),
            "last_batch": self.last_batch,
            "last_error": self.last_error,
            "agent_buffered_samples": self.buffered.get("samples"),
            "agent_buffered_bytes": self.buffered.get("bytes"),
            "agent_oldest_buffered_ms": oldest_ms,
            # ages for the status table and page, so that they need no clock of their own
            "last_batch_age_seconds": (None if self.last_batch is None else now - self.last_batch),
            "oldest_buffered_age_seconds": (
                None if not oldest_ms else max(0.0, now - oldest_ms / 1000)
            ),
        }


class BackfillReceiver:
    def __init__(
        self,
        config: GatewayBackfillConfig,
        registry: CollectorRegistry,
        *,
        discovery: Callable[[str, int], Mapping[str, str]],
        writer: RemoteWriter | None = None,
        clock: Callable[[], float] = time.time,
        scrapers: ScraperBook | None = None,
    ) -> None:
        self.config = config
        self.jobs = list(config.jobs)
        self.discovery = discovery
        self.clock = clock
        self.metrics = BackfillMetrics(registry)
        self.status: dict[str, AgentBackfillStatus] = {}
        self.scrapers = scrapers or ScraperBook()
        self._writes = asyncio.Semaphore(MAX_CONCURRENT_WRITES)
        #: one writer per receiver URL (a per-scraper template gives one per replica), bounded
        self._writers: dict[str, RemoteWriter] = {}
        if writer is not None:
            self._writers[config.remote_write_url] = writer
        #: per receiver URL: wall time before which it asked not to be written to (Retry-After)
        self._not_before: dict[str, float] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _writer(self, url: str) -> RemoteWriter:
        writer = self._writers.get(url)
        if writer is None:
            while len(self._writers) >= MAX_RECEIVERS:  # the oldest replica's writer goes
                gone = self._writers.pop(next(iter(self._writers)))
                closing = asyncio.get_running_loop().create_task(gone.close())
                self._closing.add(closing)  # held until done (the loop keeps weak references)
                closing.add_done_callback(self._closing.discard)
            writer = RemoteWriter(url, self.config.timeout_s, self.config.remote_write)
            self._writers[url] = writer
        return writer

    async def close(self) -> None:
        for writer in self._writers.values():
            await writer.close()
        self._writers.clear()

    async def handle(
        self,
        agent: str,
        may_serve: Callable[[str], bool],
        stream: TunnelStream,
        node: str,
        port: int,
    ) -> None:
        """Serve one agent-opened stream (only the backfill pseudo-target is served)."""
        if (node, port) != (BACKFILL_NODE, BACKFILL_PORT):
            stream.refuse(StreamCode.UNKNOWN_NODE, "the gateway serves only the backfill stream")
            return
        stream.accept()
        reader = MessageReader()
        status = self.status.setdefault(agent, AgentBackfillStatus())
        try:
            while True:
                data = await stream.read()
                if not data:
                    await stream.write_eof()
                    return
                for body in reader.feed_raw(data):
                    # decoding, labelling and encoding are CPU work: off the event loop, so
                    # live scrapes relayed by this gateway are not held up
                    batch = await asyncio.to_thread(_decode, body)
                    ack = await self._process(agent, may_serve, batch, status)
                    await stream.write(encode_ack(ack))
        except WireError as exc:
            log.warning("backfill stream refused agent=%s err=%s", agent, exc)
            stream.reset(StreamCode.PROTOCOL_ERROR, f"backfill: {exc}")
        except StreamResetError:
            pass  # the agent went away; it resends what was not acknowledged

    async def _process(
        self,
        agent: str,
        may_serve: Callable[[str], bool],
        batch: Batch,
        status: AgentBackfillStatus,
    ) -> Ack:
        status.buffered = batch.buffered
        if "samples" in batch.buffered:
            self.metrics.buffered.labels(agent).set(batch.buffered["samples"])
        status.batches += 1
        status.last_batch = self.clock()
        routes = route(batch.scrapes, self.config.receivers, self.config.remote_write_url,
                       self.scrapers)  # fmt: skip
        if routes.wait:
            error = f"scraper {routes.wait} has not scraped through this gateway yet"
            status.last_error = error
            return Ack(batch.batch_id, ok=False, retry=True, error=error)
        dropped, written = dict(routes.dropped), 0
        for url, scrapes in routes.by_url.items():
            conv = await self._convert(tuple(scrapes), may_serve)
            for reason, n in conv.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
            if conv.series:
                refused = await self.write_series(agent, conv.series, url)
                if refused is not None:  # the whole batch again later: a sample written twice
                    status.last_error = refused.error  # is stored once (same timestamp)
                    return Ack(batch.batch_id, ok=False, retry=True, error=refused.error,
                               retry_after_s=refused.retry_after_s)  # fmt: skip
            written += conv.samples
        self._count(agent, status, dropped)
        self.metrics.samples.labels(agent, "written").inc(written)
        status.samples_written += written
        status.last_error = ""
        return Ack(batch.batch_id, ok=True, written=written, dropped=dropped)

    async def _convert(
        self, scrapes: tuple[Scrape, ...], may_serve: Callable[[str], bool]
    ) -> Converted:
        discovery = {(s.node, s.port): dict(self.discovery(s.node, s.port)) for s in scrapes}
        return await asyncio.to_thread(
            convert,
            scrapes,
            jobs=self.jobs,
            may_serve=may_serve,
            discovery=lambda node, port: discovery[(node, port)],
            now_ms=int(self.clock() * 1000),
            window_ms=int(self.config.out_of_order_window_s * 1000),
            max_skew_ms=int(self.config.max_clock_skew_s * 1000),
        )

    def _count(self, agent: str, status: AgentBackfillStatus, dropped: dict[str, int]) -> None:
        for reason, n in dropped.items():
            self.metrics.samples.labels(agent, reason).inc(n)
            status.dropped[reason] = status.dropped.get(reason, 0) + n
            if reason in LOGGED_DROPS:
                log.warning("backfill samples dropped",
                            extra=fields(agent=agent, reason=reason, samples=n,
                                         doc=doc_link("backfill", reason)))  # fmt: skip

    async def write_series(self, agent: str, series: list[Series], url: str = "") -> Ack | None:
        """Write to the receiver at ``url`` (the shared one by default); None when it
        answered 2xx, else the refusal to send back (the agent keeps the batch), the
        receiver's Retry-After in it."""
        url = url or self.config.remote_write_url
        wait = self._not_before.get(url, 0.0) - self.clock()
        if wait > 0:  # the receiver asked for a pause: no request until it is over
            self.metrics.deferred.inc()
            error = f"receiver: asked to wait, {wait:.0f} s left (Retry-After)"
            return Ack(0, ok=False, retry=True, error=error, retry_after_s=wait)
        try:
            body = await asyncio.to_thread(encode_body, series)
            async with self._writes:
                started = time.monotonic()
                await self._writer(url).write(body)
                self.metrics.duration.observe(time.monotonic() - started)
        except RemoteWriteError as exc:
            result = (
                "unreachable" if exc.status == 0
                else "throttled" if exc.status == 429
                else "client_error" if exc.status < 500 else "server_error"
            )  # fmt: skip
            self.metrics.writes.labels(result).inc()
            wait = min(exc.retry_after_s or 0.0, self.config.max_retry_after_s)
            if wait > 0:
                self._not_before[url] = max(self._not_before.get(url, 0.0), self.clock() + wait)
            log.warning("backfill remote write failed agent=%s url=%s err=%s retry_after_s=%.0f",
                        agent, url, exc, wait)  # fmt: skip
            return Ack(0, ok=False, retry=True, error=f"receiver: {exc}", retry_after_s=wait)
        self.metrics.writes.labels("ok").inc()
        return None
