"""The one byte pump between a tunnel stream and a TCP connection, both directions at once.

Used by the gateway's CONNECT and TLS passthrough (client <-> stream); the agent's relay moves
its bytes by callbacks instead (edge_agent/target_leg.py). Half-close is kept: the end of one
direction is passed on (EOF / END) while the other keeps flowing. The pump ends when both
directions have ended, when either breaks (the other is cancelled), or after ``idle_timeout_s``
without a byte either way. It never closes anything itself: the caller decides, from the
`PumpResult`, how to end the stream and the connection.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from raven.transport.stream import ByteStream

#: Called with each chunk of a direction (never with b"").
ChunkHook = Callable[[bytes], None]


class SocketReader(Protocol):
    """The socket's receive side (an ``asyncio.StreamReader``, or the proxy's connection)."""

    async def read(self, n: int = -1) -> bytes: ...


class SocketWriter(Protocol):
    """The socket's send side (an ``asyncio.StreamWriter``, or the proxy's connection)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def is_closing(self) -> bool: ...


class PumpEnd(enum.Enum):
    DONE = "done"
    """Both directions reached their end cleanly."""
    IDLE = "idle"
    """No byte moved either way for ``idle_timeout_s``."""
    FAILED = "failed"
    """A direction raised (a reset stream, a broken connection); see `PumpResult.error`."""


@dataclass(frozen=True, slots=True)
class PumpResult:
    end: PumpEnd
    error: BaseException | None
    to_stream_bytes: int
    to_socket_bytes: int


class _Pump:
    def __init__(
        self,
        stream: ByteStream,
        reader: SocketReader,
        writer: SocketWriter,
        *,
        chunk_bytes: int,
        on_to_stream: ChunkHook | None,
        on_to_socket: ChunkHook | None,
    ) -> None:
        self.stream, self.reader, self.writer = stream, reader, writer
        self.chunk_bytes = chunk_bytes
        self.on_to_stream, self.on_to_socket = on_to_stream, on_to_socket
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.to_stream_bytes = self.to_socket_bytes = 0

    async def to_stream(self, early: bytes) -> None:
        if early:
            self._count_to_stream(early)
            await self.stream.write(early)
        while True:
            data = await self.reader.read(self.chunk_bytes)
            self.last = self.loop.time()
            if not data:
                await self.stream.write_eof()
                return
            self._count_to_stream(data)
            await self.stream.write(data)

    def _count_to_stream(self, data: bytes) -> None:
        self.to_stream_bytes += len(data)
        if self.on_to_stream is not None:
            self.on_to_stream(data)

    async def to_socket(self) -> None:
        writer = self.writer
        while True:
            data = await self.stream.read(self.chunk_bytes)
            self.last = self.loop.time()
            if not data:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                return
            self.to_socket_bytes += len(data)
            if self.on_to_socket is not None:
                self.on_to_socket(data)
            writer.write(data)
            await writer.drain()


async def pump(
    stream: ByteStream,
    reader: SocketReader,
    writer: SocketWriter,
    *,
    chunk_bytes: int,
    idle_timeout_s: float | None = None,
    early: bytes = b"",
    on_to_stream: ChunkHook | None = None,
    on_to_socket: ChunkHook | None = None,
) -> PumpResult:
    """Move bytes both ways until done; ``early``: socket bytes already read (sent first)."""
    p = _Pump(stream, reader, writer, chunk_bytes=chunk_bytes, on_to_stream=on_to_stream,
              on_to_socket=on_to_socket)  # fmt: skip
    tasks = [asyncio.create_task(p.to_stream(early)), asyncio.create_task(p.to_socket())]
    end, error = PumpEnd.DONE, None
    try:
        while pending := [t for t in tasks if not t.done()]:
            wait_s = None if idle_timeout_s is None else p.last + idle_timeout_s - p.loop.time()
            if wait_s is not None and wait_s <= 0:
                end = PumpEnd.IDLE
                break
            done, _ = await asyncio.wait(
                pending, timeout=wait_s, return_when=asyncio.FIRST_EXCEPTION
            )
            error = next((t.exception() for t in done if t.exception() is not None), None)
            if error is not None:
                end = PumpEnd.FAILED
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return PumpResult(end, error, p.to_stream_bytes, p.to_socket_bytes)
