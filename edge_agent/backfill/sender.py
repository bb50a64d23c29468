"""Sends the buffer to the gateway through a tunnel, one batch at a time, within a budget.

A batch is deleted from the buffer only when the gateway acknowledged it (Prometheus answered
2xx, or the gateway dropped samples that Prometheus would refuse); it is sent again after any
failure (a sample sent twice is harmless: same timestamp, first write wins). Rows are sent in
the order they were stored, so each series goes out in time order. The budget
(``send_bytes_per_s``), a duty cycle (``send_duty_cycle``: after a batch that took t to be
acknowledged, wait t * (1 - d) / d, so the agent's and the gateway's CPU stay shared with live
scrapes) and a single batch in flight keep the tunnel free for live scrapes,
whose streams the tunnel's round-robin serves beside this one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from edge_agent.backfill.metrics import BackfillMetrics
from edge_agent.backfill.store import Row
from raven.backfill.wire import (
    BACKFILL_NODE,
    BACKFILL_PORT,
    Ack,
    Batch,
    MessageReader,
    WireError,
    decode_ack,
)
from raven.protocol.codes import StreamCode
from raven.runtime.backoff import Backoff
from raven.transport.stream import StreamOpenError, StreamResetError
from raven.transport.tunnel import Tunnel, TunnelStream

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 120.0
MAX_BACKOFF_S = 30.0


class BatchRefused(Exception):
    """The gateway kept the batch out (its receiver refused or asked to wait): send it
    again after the backoff, and not before ``retry_after_s``."""

    def __init__(self, error: str, retry_after_s: float = 0.0) -> None:
        super().__init__(error)
        self.retry_after_s = retry_after_s


class Sender:
    def __init__(
        self,
        *,
        tunnels: Callable[[], list[Tunnel]],
        next_rows: Callable[[], Awaitable[list[Row]]],
        encode: Callable[[Batch], Awaitable[bytes]],
        delete_rows: Callable[[list[int]], Awaitable[None]],
        metrics: BackfillMetrics,
        bytes_per_s: int,
        duty_cycle: float = 1.0,
        buffered: Callable[[], dict[str, float]],
    ) -> None:
        self.tunnels = tunnels
        self.next_rows = next_rows
        self.encode = encode
        self.delete_rows = delete_rows
        self.metrics = metrics
        self.bytes_per_s = bytes_per_s
        self.duty_cycle = duty_cycle
        self.buffered = buffered
        self.wake = asyncio.Event()
        self.last_error = ""
        self.last_ack_wall: float | None = None
        self._stream: TunnelStream | None = None
        self._tunnel: Tunnel | None = None
        self._reader = MessageReader()
        self._batch_id = 0

    async def run(self) -> None:
        retry = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            tunnel = next(
                (t for t in self.tunnels() if not t.closed.done() and not t.draining), None
            )
            rows = await self.next_rows() if tunnel is not None else []
            if tunnel is None or not rows:
                await self._end_stream()  # an idle stream would hold up a gateway's drain
                self.wake.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await self.wake.wait()
                except TimeoutError:
                    pass
                continue
            started = time.monotonic()
            try:
                sent = await self._send(tunnel, rows)
            except (
                StreamOpenError,
                StreamResetError,
                WireError,
                TimeoutError,
                ConnectionError,
            ) as exc:
                self.last_error = str(exc) or type(exc).__name__
                self.metrics.batches.labels("error").inc()
                delay = retry.next_delay()
                log.warning("backfill batch failed err=%s retry_in_s=%.1f", self.last_error, delay)
                self._drop_stream()
            except BatchRefused as exc:
                self.last_error = str(exc)
                self.metrics.batches.labels("retry").inc()
                delay = max(retry.next_delay(), exc.retry_after_s)  # the receiver's Retry-After
                log.warning("backfill batch not stored err=%s retry_in_s=%.1f", exc, delay)
            else:
                retry.reset()
                busy = time.monotonic() - started
                idle = busy * (1 - self.duty_cycle) / self.duty_cycle
                await asyncio.sleep(max(sent / self.bytes_per_s, idle))
                continue
            await asyncio.sleep(delay)

    async def _end_stream(self) -> None:
        if self._stream is not None:
            stream = self._stream
            self._stream = None
            self._tunnel = None
            try:
                await stream.write_eof()
                async with asyncio.timeout(5.0):
                    while await stream.read():
                        pass
            except (StreamResetError, TimeoutError, ConnectionError):
                stream.reset(StreamCode.CANCELLED, "backfill stream abandoned")

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.reset(StreamCode.CANCELLED, "backfill stream abandoned")
        self._stream = None
        self._tunnel = None

    async def _send(self, tunnel: Tunnel, rows: list[Row]) -> int:
        if self._stream is None or self._tunnel is not tunnel or tunnel.closed.done():
            self._drop_stream()
            # bulk: on a thin link the backfill yields to live scrapes (never stops)
            self._stream = await tunnel.open_stream(
                BACKFILL_NODE, BACKFILL_PORT, timeout_s=10.0, bulk=True
            )
            self._tunnel = tunnel
            self._reader = MessageReader()
        self._batch_id += 1
        batch = Batch(self._batch_id, tuple(r.scrape for r in rows), self.buffered())
        data = await self.encode(batch)
        await self._stream.write(data)
        self.metrics.sent_bytes.inc(len(data))
        async with asyncio.timeout(ACK_TIMEOUT_S):
            ack = await self._read_ack(self._stream)
        if ack.batch_id != batch.batch_id:
            raise WireError(f"ack for batch {ack.batch_id}, expected {batch.batch_id}")
        samples = sum(r.nsamples for r in rows)
        if ack.ok:
            await self.delete_rows([r.row_id for r in rows])
            self.metrics.batches.labels("ok").inc()
            self.metrics.sent_samples.inc(samples)
            self.last_error = ""
            self.last_ack_wall = time.time()
            return len(data)
        if not ack.retry:
            await self.delete_rows([r.row_id for r in rows])
            self.metrics.batches.labels("refused").inc()
            self.metrics.dropped.labels("refused").inc(samples)
            log.error("gateway refused a backfill batch samples=%d err=%s", samples, ack.error)
            self.last_error = ack.error
            return len(data)
        raise BatchRefused(ack.error or "gateway asked to retry", ack.retry_after_s)

    async def _read_ack(self, stream: TunnelStream) -> Ack:
        while True:
            data = await stream.read()
            if not data:
                raise ConnectionError("gateway ended the backfill stream")
            for obj in self._reader.feed(data):
                return decode_ack(obj)
