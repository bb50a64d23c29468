"""Byte relay for CONNECT and the TLS listener: both directions, half-close kept, TLS untouched.

The relay ends when both directions have ended, when either side breaks (the other is then
aborted), or after ``idle_timeout_s`` with no byte in either direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cloud_gateway.proxy.context import READ_BYTES, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.target import Target
from raven.protocol.codes import StreamCode
from raven.transport.stream import ByteStream, StreamResetError

log = logging.getLogger("cloud_gateway.proxy")


class _Relay:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stream: ByteStream,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.stream = stream
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.down_bytes = 0

    async def up(self, early: bytes) -> None:
        """Client -> target."""
        if early:
            await self.stream.write(early)
        while True:
            data = await self.reader.read(READ_BYTES)
            self.last = self.loop.time()
            if not data:
                await self.stream.write_eof()
                return
            await self.stream.write(data)

    async def down(self) -> None:
        """Target -> client."""
        writer = self.writer
        while True:
            data = await self.stream.read(READ_BYTES)
            self.last = self.loop.time()
            if not data:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                return
            writer.write(data)
            self.down_bytes += len(data)
            await writer.drain()


async def relay(
    ctx: ProxyContext,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stream: ByteStream,
    *,
    early: bytes,
    target: Target,
    peer: str,
) -> None:
    """Relay until done; ``early`` are client bytes already read (sent to the target first)."""
    r = _Relay(reader, writer, stream)
    tasks = [asyncio.create_task(r.up(early)), asyncio.create_task(r.down())]
    idle_s = ctx.config.idle_timeout_s
    failed: BaseException | None = None
    try:
        while failed is None:
            pending = [t for t in tasks if not t.done()]
            if not pending:
                break
            wait_s = r.last + idle_s - r.loop.time()
            if wait_s <= 0:
                log.debug(
                    "relay idle mode=%s node=%s peer=%s", target.mode.value, target.node, peer
                )
                break
            done, _ = await asyncio.wait(
                pending, timeout=wait_s, return_when=asyncio.FIRST_EXCEPTION
            )
            failed = next((t.exception() for t in done if t.exception() is not None), None)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        ctx.metrics.response_bytes.inc(r.down_bytes)
        clean = failed is None and all(t.done() and not t.cancelled() for t in tasks)
        if clean:
            await stream.aclose()
            writer.close()
        else:
            stream.reset(StreamCode.CANCELLED, "relay ended")
            await stream.aclose()
            writer.transport.abort()
    if isinstance(failed, StreamResetError):
        ctx.metrics.error(ErrorKind.TARGET_RESET)
        log.info(
            "relay reset mode=%s node=%s peer=%s code=%s",
            target.mode.value,
            target.node,
            peer,
            failed.code.label,
        )
