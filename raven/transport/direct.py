"""DirectOpener: the in-memory twin of a tunnel. Opens plain TCP to a node table.

Used by tests and the demo in place of the agent registry: same :class:`StreamOpener` contract,
same :class:`StreamOpenError` reasons, no tunnel. A node maps to a host (name or address) that is
dialled with ``loop.create_connection``; received data goes to the attached receiver or the
stream's inbox (bounded), without copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import cast

from raven.protocol.codes import StreamCode
from raven.protocol.names import normalize_node_name
from raven.transport.connect_errors import connect_failure
from raven.transport.inbox import StreamInbox
from raven.transport.reset import abort_with_rst
from raven.transport.stream import (
    OPEN_FAILURE_BY_CODE,
    ByteStream,
    OpenFailure,
    StreamOpenError,
    StreamReceiver,
    StreamResetError,
)


class DirectStream(asyncio.Protocol):
    """A :class:`ByteStream` over one TCP connection (and that connection's protocol).

    Received bytes go to the attached receiver, else to the stream's inbox (for ``read``).
    Reading pauses once ``HIGH_WATER_BYTES`` were received and not yet consumed and resumes
    below ``LOW_WATER_BYTES``, so a slow consumer holds at most about that much per stream.
    """

    HIGH_WATER_BYTES = 1 << 20
    LOW_WATER_BYTES = 256 << 10

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._inbox = StreamInbox(self)
        #: where the stream's events go: its inbox unless a receiver is attached
        self.receiver: StreamReceiver = self._inbox
        self._queued = 0
        self._eof = self._lost = self._paused_reading = self._write_paused = False
        self._error: Exception | None = None
        self._drain: asyncio.Future[None] | None = None
        self._reset: StreamResetError | None = None
        self._eof_written = False

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._queued += len(data)
        if self._queued > self.HIGH_WATER_BYTES and self._transport is not None:
            self._transport.pause_reading()
            self._paused_reading = True
        self.receiver.stream_data(data)

    def eof_received(self) -> bool:
        self._eof = True
        self.receiver.stream_eof()
        return True  # keep our sending side open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._error = exc
        self._write_paused = False
        self._wake_drain()
        receiver, self.receiver = self.receiver, self._inbox  # nothing more to deliver
        if exc is not None:
            receiver.stream_reset(self._broken())
        elif not self._eof:
            receiver.stream_eof()
        self._inbox.wake()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain()
        self.receiver.stream_writable()

    # ------------------------------------------------------------ ByteStream
    async def read(self, max_bytes: int = 65536) -> bytes:
        """What the inbox holds (no receiver attached): :meth:`StreamInbox.read`."""
        return await self._inbox.read(max_bytes)

    def read_failure(self) -> StreamResetError | None:
        if self._reset is None and self._lost and self._error is not None:
            return self._broken()
        return self._reset

    def read_ended(self) -> bool:
        return self._eof or self._lost

    async def write(self, data: bytes) -> None:
        self.try_send(data)
        if self._write_paused and not self._lost:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain
        if self._lost and self._error is not None:
            raise self._broken()

    def try_send(self, data: bytes) -> bool:
        """The transport buffers what the socket does not take: always sent."""
        if self._reset is not None:
            raise self._reset
        if self._lost or self._eof_written or self._transport is None:
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
        return self._write_paused

    def attach(self, receiver: StreamReceiver) -> None:
        self.receiver = receiver
        self._inbox.hand_to(receiver)
        if self.receiver is not receiver:
            return
        failure = self.read_failure()
        if failure is not None:
            receiver.stream_reset(failure)
        elif self.read_ended():
            receiver.stream_eof()

    def detach(self) -> None:
        self.receiver = self._inbox

    def consumed(self, size: int) -> None:
        self._queued -= size
        if self._paused_reading and self._queued < self.LOW_WATER_BYTES:
            self._paused_reading = False
            if self._transport is not None and not self._lost:
                self._transport.resume_reading()

    def reusable(self) -> bool:
        idle = not (self._inbox or self._eof or self._lost)
        return idle and self._reset is None and not self._eof_written

    async def write_eof(self) -> None:
        if self._reset is not None:
            raise self._reset
        if self._eof_written:
            return
        if self._lost:
            self._eof_written = True
            raise self._broken()
        self.end()

    def end(self) -> None:
        if self._eof_written or self._reset is not None or self._lost:
            return
        self._eof_written = True
        if self._transport is not None and self._transport.can_write_eof():
            self._transport.write_eof()

    def reset(self, code: StreamCode, reason: str = "") -> None:
        self.receiver = self._inbox  # our own reset: nothing more to deliver
        if self._reset is None:
            self._reset = StreamResetError(code, reason)
        self._inbox.wake()
        if self._transport is not None:
            abort_with_rst(self._transport)  # as the agent cuts its target: an RST, not a FIN

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close without waiting: the response is complete, the socket flushes on its own."""
        if self._transport is None:
            return
        if self._reset is not None:
            self._transport.abort()
        else:
            self._transport.close()

    # ------------------------------------------------------------ internals
    def _broken(self) -> StreamResetError:
        if self._reset is None:
            exc = self._error
            detail = (str(exc) or type(exc).__name__) if exc else "connection closed"
            self._reset = StreamResetError(StreamCode.TARGET_RESET, detail)
        return self._reset

    def _wake_drain(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)


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
                _, stream = await loop.create_connection(DirectStream, address, port)
        except (OSError, TimeoutError) as exc:
            code, detail = connect_failure(exc, f"{name}:{port}", address)
            raise StreamOpenError(OPEN_FAILURE_BY_CODE[code], detail) from None
        if data:
            await stream.write(data)
        return stream
