"""The one splice: a TCP connection joined to a stream, bytes moved by callbacks both ways.

:class:`Splice` is the ``asyncio.Protocol`` of the TCP connection (a
:class:`~raven.transport.read_buffer.CopyingReader`) and the
:class:`~raven.transport.stream.StreamReceiver` of the stream it is joined to: no task, no
StreamReader copies. The agent joins a target connection to a tunnel stream with it; the
gateway joins a CONNECT or TLS passthrough client to the stream it opened (its client
connection hands the transport's events on: ``ClientConnection.splice``). Flow control both
ways:

- socket -> stream: what the stream's credit does not cover waits (one buffer) and reading the
  socket pauses until ``stream_writable`` (credit back, or the tunnel's transport drained);
- stream -> socket: credit goes back to the peer only once the socket's transport took the
  bytes (at once, or at ``resume_writing`` when its buffer was over the mark), so a slow
  reader holds at most its buffer and the stream's window.

Half-close both ways (the socket's EOF is sent as the stream's END, the stream's END as a
write EOF). :attr:`Splice.done` resolves with a :class:`SpliceResult` once both directions
ended (DONE: the socket is closed with a FIN), either side broke (FAILED: a broken socket
resets the stream with ``broken_code``, a reset stream aborts the socket with an RST), or
nothing moved either way for ``idle_timeout_s`` (IDLE: both cut as for a failure).
"""

from __future__ import annotations

import asyncio
import enum
import typing
from collections.abc import Callable
from dataclasses import dataclass

from raven.protocol.codes import StreamCode
from raven.transport.read_buffer import CopyingReader
from raven.transport.reset import abort_with_rst
from raven.transport.stream import ByteStream, StreamResetError

__all__ = [
    "SOCKET_WRITE_HIGH_WATER_BYTES",
    "Consumer",
    "HeldCredit",
    "Splice",
    "SpliceEnd",
    "SpliceResult",
]

#: The socket transport's write buffer above which credit stops flowing back to the peer.
SOCKET_WRITE_HIGH_WATER_BYTES = 256 * 1024

#: Checks each chunk going to the socket (the agent's allow-list re-check, metrics, request
#: watcher); raising ConnectionAbortedError ends the splice as a broken socket.
ToSocketHook = Callable[[bytes], None]
#: Counts each chunk read from the socket.
FromSocketHook = Callable[[int], None]


class Consumer(typing.Protocol):
    """A stream's receive side: credit given back per byte taken."""

    def consumed(self, size: int) -> None: ...


class HeldCredit:
    """The stream -> socket credit rule, shared by the splice and the gateway's HTTP-aware
    response relay: bytes written to a socket whose transport is over its mark are owed, and
    their credit goes back to the stream only once the socket drains (a slow reader holds at
    most its buffer and the stream's window)."""

    __slots__ = ("owed", "stream")

    def __init__(self, stream: Consumer) -> None:
        self.stream = stream
        self.owed = 0

    def written(self, size: int, socket_full: bool) -> None:
        """``size`` stream bytes went to the socket."""
        if socket_full:
            self.owed += size
        else:
            self.stream.consumed(size)

    def drained(self) -> None:
        """The socket took its buffer: what was owed flows back."""
        owed, self.owed = self.owed, 0
        if owed:
            self.stream.consumed(owed)


class SpliceEnd(enum.Enum):
    DONE = "done"
    """Both directions reached their end cleanly."""
    IDLE = "idle"
    """No byte moved either way for ``idle_timeout_s``."""
    FAILED = "failed"
    """A side broke (a reset stream, a broken connection); see `SpliceResult.error`."""


@dataclass(frozen=True, slots=True)
class SpliceResult:
    end: SpliceEnd
    error: BaseException | None
    to_stream_bytes: int
    to_socket_bytes: int


class Splice(CopyingReader):
    """One TCP connection joined to one stream (see the module docstring)."""

    def __init__(self, what: str, *, broken_code: StreamCode = StreamCode.TARGET_RESET) -> None:
        self.what = what
        self.broken_code = broken_code
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.stream: ByteStream | None = None
        self.done: asyncio.Future[SpliceResult] = self.loop.create_future()
        self.on_to_socket: ToSocketHook | None = None
        self.on_from_socket: FromSocketHook | None = None
        self.to_stream_bytes = self.to_socket_bytes = 0
        #: socket bytes the stream's credit did not cover yet
        self._pending: bytes | memoryview = b""
        #: stream bytes written to the socket whose credit is held back (its buffer is full)
        self._credit: HeldCredit | None = None
        self._reading_paused = self._socket_full = False
        self._socket_eof = self._stream_eof = False
        self._idle_s: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._moved_at = 0.0

    # ------------------------------------------------------------ the owner's calls
    def start(
        self,
        stream: ByteStream,
        *,
        early: bytes = b"",
        idle_timeout_s: float | None = None,
        on_to_socket: ToSocketHook | None = None,
        on_from_socket: FromSocketHook | None = None,
    ) -> None:
        """Join the socket to ``stream``: ``early`` (socket bytes already read) goes first,
        then what either side sent meanwhile."""
        self.on_to_socket, self.on_from_socket = on_to_socket, on_from_socket
        self.stream = stream
        self._credit = HeldCredit(stream)
        if self.done.done():  # the socket went away between the connect and now
            stream.reset(self.broken_code, f"{self.what} connection broke before relaying")
            return
        if idle_timeout_s is not None:
            self._idle_s, self._moved_at = idle_timeout_s, self.loop.time()
            self._idle_timer = self.loop.call_later(idle_timeout_s, self._idle_check)
        if early:
            self._pending = early + bytes(self._pending)
            self.to_stream_bytes += len(early)
        stream.attach(self)
        if not self.done.done():
            self.stream_writable()

    def close(self) -> None:
        """Let go of both sides now (an owner cancelled): a splice still running ends FAILED,
        the stream reset and the socket aborted with an RST."""
        if not self.done.done():
            self._fail(asyncio.CancelledError(), StreamCode.CANCELLED)

    # ------------------------------------------------------------ asyncio.Protocol (socket)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here
        self.transport = typing.cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(SOCKET_WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.to_stream_bytes += len(data)
        if self._idle_s is not None:
            self._moved_at = self.loop.time()
        if self.on_from_socket is not None:
            self.on_from_socket(len(data))
        if self._pending or self.stream is None:  # not started, or a read raced the pause
            self._pending = bytes(self._pending) + data
            self._pause_reading()
            return
        self._to_stream(data)

    def eof_received(self) -> bool:
        self._socket_eof = True
        if not self._pending and self.stream is not None:
            self._end_stream()
        return True  # keep the connection: the other direction may still be flowing

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if exc is None and not (self._socket_eof and self._stream_eof):
            exc = ConnectionResetError("closed before both directions ended")
        if exc is not None:
            self._fail(exc, self.broken_code)
        else:
            self._finish(SpliceEnd.DONE, None)

    def pause_writing(self) -> None:
        self._socket_full = True

    def resume_writing(self) -> None:
        self._socket_full = False
        if self._credit is not None and not self.done.done():
            self._credit.drained()

    # ------------------------------------------------------------ StreamReceiver
    def stream_data(self, data: bytes) -> None:
        credit, transport = self._credit, self.transport
        if credit is None or transport is None or self.done.done():
            return
        self.to_socket_bytes += len(data)
        if self._idle_s is not None:
            self._moved_at = self.loop.time()
        if self.on_to_socket is not None:
            try:
                self.on_to_socket(data)
            except ConnectionAbortedError as exc:
                self._fail(exc, self.broken_code)
                return
        transport.write(data)
        credit.written(len(data), self._socket_full)  # back once the socket takes it

    def stream_eof(self) -> None:
        self._stream_eof = True
        transport = self.transport
        if transport is not None and transport.can_write_eof() and not transport.is_closing():
            transport.write_eof()
        self._check_done()

    def stream_reset(self, error: StreamResetError) -> None:
        if not self.done.done():
            self._abort_socket()
            self._finish(SpliceEnd.FAILED, error)

    def stream_writable(self) -> None:
        stream = self.stream
        if stream is None or self.done.done():
            return
        if self._pending:
            pending, self._pending = self._pending, b""
            self._to_stream(pending)
        elif not stream.send_blocked:
            self._resume_reading()
        if not self._pending and self._socket_eof:
            self._end_stream()

    # ------------------------------------------------------------ internals
    def _to_stream(self, data: bytes | memoryview) -> None:
        stream = self.stream
        assert stream is not None
        try:
            sent = stream.send_nowait(data)
        except StreamResetError:
            return  # the reset reached (or reaches) stream_reset
        if sent < len(data):
            self._pending = memoryview(data)[sent:]
            self._pause_reading()
        elif stream.send_blocked:
            self._pause_reading()
        else:
            self._resume_reading()

    def _end_stream(self) -> None:
        assert self.stream is not None
        self.stream.end()
        self._check_done()

    def _check_done(self) -> None:
        if self._socket_eof and self._stream_eof and not self._pending:
            self._finish(SpliceEnd.DONE, None)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self.done.done() or self._idle_s is None:
            return
        left = self._moved_at + self._idle_s - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_check)
            return
        if self.stream is not None:
            self.stream.reset(StreamCode.CANCELLED, f"idle for {self._idle_s:g}s")
        self._abort_socket()
        self._finish(SpliceEnd.IDLE, None)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._socket_eof:
            self._reading_paused = False
            self.transport.resume_reading()

    def _fail(self, exc: BaseException, code: StreamCode) -> None:
        """The socket broke (or the owner gave up): the stream is reset, the socket cut."""
        if self.done.done():
            return
        if self.stream is not None:
            self.stream.reset(code, f"{self.what} connection broke: {exc}".rstrip(": "))
        self._abort_socket()
        self._finish(SpliceEnd.FAILED, exc)

    def _abort_socket(self) -> None:
        """Close the socket with an RST (the exchange was abandoned)."""
        if self.transport is not None:
            abort_with_rst(self.transport)

    def _finish(self, end: SpliceEnd, error: BaseException | None) -> None:
        if self.done.done():
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if end is SpliceEnd.DONE:
            if self.transport is not None:
                self.transport.close()  # flushed first, then a FIN
            if self.stream is not None:
                self.stream.close()  # ended both ways: released
        self.done.set_result(SpliceResult(end, error, self.to_stream_bytes, self.to_socket_bytes))
