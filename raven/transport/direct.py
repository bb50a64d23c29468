"""DirectOpener: the in-memory twin of a tunnel. Opens plain TCP to a node table.

Used by tests and the demo in place of the agent registry: same :class:`StreamOpener` contract,
same :class:`StreamOpenError` reasons, no tunnel. A node maps to a host (name or address) that is
dialled with ``loop.create_connection``; received data is queued (bounded) and
handed out without copies.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Collection, Mapping
from typing import cast

from raven.protocol.codes import StreamCode
from raven.protocol.names import normalize_node_name
from raven.transport.connect_errors import connect_failure
from raven.transport.reset import abort_with_rst
from raven.transport.stream import (
    OPEN_FAILURE_BY_CODE,
    ByteStream,
    OpenFailure,
    StreamOpenError,
    StreamReceiver,
    StreamResetError,
)


class _Protocol(asyncio.Protocol):
    """Receive side of a :class:`DirectStream`: a bounded queue of received chunks.

    Reading pauses once ``HIGH_WATER_BYTES`` are queued and resumes below ``LOW_WATER_BYTES``,
    so a slow consumer holds at most about that much per stream. Chunks are handed out as
    received, without copying.
    """

    HIGH_WATER_BYTES = 1 << 20
    LOW_WATER_BYTES = 256 << 10

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.queued = 0
        self.eof = False
        self.lost = False
        self.error: Exception | None = None
        self.paused_reading = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.write_paused = False
        self.receiver: StreamReceiver | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.queued += len(data)
        if self.queued > self.HIGH_WATER_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self.paused_reading = True
        if self.receiver is not None:
            self.receiver.stream_data(data)
            return
        self.chunks.append(data)
        self._wake()

    def consumed(self, size: int) -> None:
        self.queued -= size
        if self.paused_reading and self.queued < self.LOW_WATER_BYTES:
            self.paused_reading = False
            if self.transport is not None and not self.lost:
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        if self.receiver is not None:
            self.receiver.stream_eof()
        return True  # keep our sending side open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.error = exc
        self._wake()
        self.write_paused = False
        self._wake_drain()
        receiver, self.receiver = self.receiver, None
        if receiver is None:
            return
        if exc is not None:
            detail = str(exc) or type(exc).__name__
            receiver.stream_reset(StreamResetError(StreamCode.TARGET_RESET, detail))
        elif not self.eof:
            receiver.stream_eof()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drain()
        if self.receiver is not None:
            self.receiver.stream_writable()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_drain(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def wait_data(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def drain(self) -> None:
        if self.write_paused and not self.lost:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain


class DirectStream:
    """A :class:`ByteStream` over one TCP connection."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._proto = protocol
        self._reset: StreamResetError | None = None
        self._eof_written = False

    def _broken(self) -> StreamResetError:
        if self._reset is None:
            exc = self._proto.error
            detail = (str(exc) or type(exc).__name__) if exc else "connection closed"
            self._reset = StreamResetError(StreamCode.TARGET_RESET, detail)
        return self._reset

    async def read(self, max_bytes: int = 65536) -> bytes:
        proto = self._proto
        while True:
            if self._reset is not None:
                raise self._reset
            if proto.chunks:
                data = proto.chunks.popleft()
                if len(data) > max_bytes:
                    proto.chunks.appendleft(data[max_bytes:])
                    data = data[:max_bytes]
                proto.consumed(len(data))
                return data
            if proto.eof:
                return b""
            if proto.lost:
                if proto.error is None:
                    return b""
                raise self._broken()
            await proto.wait_data()

    async def write(self, data: bytes) -> None:
        if self._reset is not None:
            raise self._reset
        if self._proto.lost or self._eof_written:
            raise self._broken()
        self._transport.write(data)
        await self._proto.drain()
        if self._proto.lost and self._proto.error is not None:
            raise self._broken()

    def try_send(self, data: bytes) -> bool:
        """The transport buffers what the socket does not take: always sent."""
        if self._reset is not None:
            raise self._reset
        if self._proto.lost or self._eof_written:
            raise self._broken()
        self._transport.write(data)
        return True

    def send_nowait(self, data: bytes | memoryview) -> int:
        """The transport buffers what the socket does not take: all of it goes."""
        self.try_send(bytes(data))
        return len(data)

    @property
    def send_blocked(self) -> bool:
        """The transport is over its mark (``stream_writable`` comes at resume_writing)."""
        return self._proto.write_paused

    def attach(self, receiver: StreamReceiver) -> None:
        proto = self._proto
        proto.receiver = receiver
        while proto.chunks and proto.receiver is receiver:
            receiver.stream_data(proto.chunks.popleft())
        if proto.receiver is not receiver:
            return
        if self._reset is not None:
            receiver.stream_reset(self._reset)
        elif proto.eof or (proto.lost and proto.error is None):
            receiver.stream_eof()
        elif proto.lost:
            receiver.stream_reset(self._broken())

    def detach(self) -> None:
        self._proto.receiver = None

    def consumed(self, size: int) -> None:
        self._proto.consumed(size)

    def reusable(self) -> bool:
        proto = self._proto
        idle = not proto.chunks and not proto.eof and not proto.lost
        return idle and self._reset is None and not self._eof_written

    async def write_eof(self) -> None:
        if self._reset is not None:
            raise self._reset
        if self._eof_written:
            return
        if self._proto.lost:
            self._eof_written = True
            raise self._broken()
        self.end()

    def end(self) -> None:
        if self._eof_written or self._reset is not None or self._proto.lost:
            return
        self._eof_written = True
        if self._transport.can_write_eof():
            self._transport.write_eof()

    def reset(self, code: StreamCode, reason: str = "") -> None:
        self._proto.receiver = None  # our own reset: nothing more to deliver
        if self._reset is None:
            self._reset = StreamResetError(code, reason)
        abort_with_rst(self._transport)  # as the agent cuts its target: an RST, not a FIN

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close without waiting: the response is complete, the socket flushes on its own."""
        if self._reset is not None:
            self._transport.abort()
        else:
            self._transport.close()


class DirectOpener:
    """:class:`StreamOpener` by plain TCP to ``nodes[node]``.

    ``allowed_ports``: None allows every port. ``connect_timeout_s`` bounds the TCP connect
    (further bounded by the caller's ``timeout_s``).
    """

    def __init__(
        self,
        nodes: Mapping[str, str],
        allowed_ports: Collection[int] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._nodes = {normalize_node_name(k): v for k, v in nodes.items()}
        self._ports = None if allowed_ports is None else frozenset(allowed_ports)
        self._connect_timeout_s = connect_timeout_s

    async def open_stream(
        self, node: str, port: int, *, timeout_s: float, data: bytes = b""
    ) -> ByteStream:
        name = normalize_node_name(node)
        address = self._nodes.get(name)
        if address is None:
            raise StreamOpenError(OpenFailure.UNKNOWN_NODE, f"no such node {name}")
        if self._ports is not None and port not in self._ports:
            raise StreamOpenError(OpenFailure.PORT_NOT_ALLOWED, f"port {port} is not allowed")
        timeout = max(0.0, min(timeout_s, self._connect_timeout_s))
        try:
            async with asyncio.timeout(timeout):
                loop = asyncio.get_running_loop()
                transport, protocol = await loop.create_connection(_Protocol, address, port)
        except (OSError, TimeoutError) as exc:
            code, detail = connect_failure(exc, f"{name}:{port}", address)
            raise StreamOpenError(OPEN_FAILURE_BY_CODE[code], detail) from None
        stream = DirectStream(transport, protocol)
        if data:
            await stream.write(data)
        return stream
