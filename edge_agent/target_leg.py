"""The agent's connection to a target, driven by callbacks: no tasks, no StreamReader copies.

:class:`TargetLeg` is the protocol of the TCP connection to the target (a
:class:`~raven.transport.read_buffer.CopyingReader`) and the
:class:`~raven.transport.stream.StreamReceiver` of the tunnel stream it serves. Bytes go
straight from ``data_received`` into the stream and from the stream into the target transport,
with flow control both ways:

- target -> gateway: what the stream's credit does not cover waits (one buffer) and reading the
  target pauses until ``stream_writable`` (credit back, or the tunnel's transport drained);
- gateway -> target: credit goes back to the gateway only once the target transport took the
  bytes (at once, or at ``resume_writing`` when its buffer was over the mark), so a slow target
  holds at most its buffer and the stream's window.

Half-close both ways (the target's EOF is sent as END, the stream's END as a write EOF); the leg
is :attr:`done` when both directions ended, the target broke (the stream is reset
``TARGET_RESET``) or the stream was reset (the target connection is aborted with an RST).
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable

from raven.protocol.codes import StreamCode
from raven.transport.read_buffer import CopyingReader
from raven.transport.reset import abort_with_rst
from raven.transport.stream import StreamResetError
from raven.transport.tunnel_stream import TunnelStream

__all__ = ["TARGET_WRITE_HIGH_WATER_BYTES", "TargetLeg"]

#: The target transport's write buffer above which credit stops flowing back to the gateway.
TARGET_WRITE_HIGH_WATER_BYTES = 256 * 1024

#: Checks each chunk going to the target (the allow-list re-check, metrics, request watcher);
#: raising ConnectionAbortedError ends the leg as a broken target connection.
ToTargetHook = Callable[[bytes], None]
#: Counts each chunk coming from the target.
FromTargetHook = Callable[[int], None]


class TargetLeg(CopyingReader):
    """One relayed target connection (see the module docstring)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.transport: asyncio.Transport | None = None
        self.stream: TunnelStream | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_to_target: ToTargetHook | None = None
        self.on_from_target: FromTargetHook | None = None
        #: target bytes the stream's credit did not cover yet
        self._pending: bytes | memoryview = b""
        #: stream bytes written to the target whose credit is held back (its buffer is full)
        self._owed = 0
        self._reading_paused = False
        self._target_full = False
        self._target_eof = False
        self._stream_eof = False

    # ------------------------------------------------------------ the relay's calls
    def start(self, stream: TunnelStream, on_to_target: ToTargetHook,
              on_from_target: FromTargetHook) -> None:  # fmt: skip
        """Relay between the target and ``stream`` (accepted): what either sent meanwhile
        goes now."""
        self.on_to_target, self.on_from_target = on_to_target, on_from_target
        self.stream = stream
        if self.done.done():  # the target went away between the connect and now
            stream.reset(StreamCode.TARGET_RESET, "target connection broke before relaying")
            return
        stream.attach(self)
        if not self.done.done():
            self.stream_writable()

    def close(self) -> None:
        """Let go of the target connection: flushed and closed once the relay ended, aborted
        (RST) when it did not."""
        if not self.done.done():
            self._abort_target()
            self._finish()
        elif self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ asyncio.Protocol (target)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here
        self.transport = typing.cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(TARGET_WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        if self.on_from_target is not None:
            self.on_from_target(len(data))
        if self._pending or self.stream is None:  # not started, or a read raced the pause
            self._pending = bytes(self._pending) + data
            self._pause_reading()
            return
        self._to_stream(data)

    def eof_received(self) -> bool:
        self._target_eof = True
        if not self._pending and self.stream is not None:
            self._end_stream()
        return True  # keep the connection: the request may still be flowing to the target

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if exc is None and not (self._target_eof and self._stream_eof):
            exc = ConnectionResetError("target closed the connection")
        if exc is not None:
            self._broken(exc)
        self._finish()

    def pause_writing(self) -> None:
        self._target_full = True

    def resume_writing(self) -> None:
        self._target_full = False
        owed, self._owed = self._owed, 0
        if self.stream is not None:
            self.stream.consumed(owed)

    # ------------------------------------------------------------ StreamReceiver (gateway)
    def stream_data(self, data: bytes) -> None:
        stream, transport = self.stream, self.transport
        if stream is None or transport is None or self.done.done():
            return
        try:
            if self.on_to_target is not None:
                self.on_to_target(data)
        except ConnectionAbortedError as exc:
            self._broken(exc)
            self._abort_target()
            self._finish()
            return
        transport.write(data)
        if self._target_full:  # credit back once the target takes it (resume_writing)
            self._owed += len(data)
        else:
            stream.consumed(len(data))

    def stream_eof(self) -> None:
        self._stream_eof = True
        transport = self.transport
        if transport is not None and transport.can_write_eof() and not transport.is_closing():
            transport.write_eof()
        self._check_done()

    def stream_reset(self, error: StreamResetError) -> None:
        self._abort_target()
        self._finish()

    def stream_writable(self) -> None:
        stream = self.stream
        if stream is None or self.done.done():
            return
        if self._pending:
            pending, self._pending = self._pending, b""
            self._to_stream(pending)
        elif not stream.send_blocked:
            self._resume_reading()
        if not self._pending and self._target_eof:
            self._end_stream()

    # ------------------------------------------------------------ internals
    def _to_stream(self, data: bytes | memoryview) -> None:
        assert self.stream is not None
        try:
            sent = self.stream.send_nowait(data)
        except StreamResetError:
            return  # the reset reached (or reaches) stream_reset
        if sent < len(data):
            self._pending = memoryview(data)[sent:]
            self._pause_reading()
        elif self.stream.send_blocked:
            self._pause_reading()
        else:
            self._resume_reading()

    def _end_stream(self) -> None:
        assert self.stream is not None
        self.stream.end()
        self._check_done()

    def _check_done(self) -> None:
        if self._target_eof and self._stream_eof and not self._pending:
            self._finish()
            self.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._target_eof:
            self._reading_paused = False
            self.transport.resume_reading()

    def _broken(self, exc: BaseException) -> None:
        if self.stream is not None and not self.done.done():
            self.stream.reset(StreamCode.TARGET_RESET, f"target connection broke: {exc}")

    def _abort_target(self) -> None:
        """Close the target connection with an RST (the request was abandoned)."""
        if self.transport is not None:
            abort_with_rst(self.transport)

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
