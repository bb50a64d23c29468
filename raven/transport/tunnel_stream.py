"""One multiplexed stream of a tunnel, as the application sees it (a ByteStream).

:class:`TunnelStream` buffers what the peer sent until the application reads it (credit
flows back only then), waits for send credit before writing, and turns the peer's resets
into :class:`StreamResetError`. Its tunnel's
:class:`~raven.transport.tunnel_streams.TunnelStreams` delivers the events (the ``on_*``
methods: the stream's side of the tunnel) and its tunnel, a :class:`StreamCarrier` (the
:class:`~raven.transport.tunnel.Tunnel`), carries its calls to the connection.

The stream's bytes, end and reset go to its :attr:`TunnelStream.receiver` as callbacks: a
relay :meth:`TunnelStream.attach`-es one (credit flows back when it calls
:meth:`TunnelStream.consumed`) and sends with :meth:`TunnelStream.send_nowait` (as much as the
credit allows), told by ``stream_writable`` when more may go. With none attached they go to the
stream's :class:`~raven.transport.inbox.StreamInbox`, which ``read`` takes them from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from raven.protocol.codes import StreamCode
from raven.protocol.connection import TunnelConnection
from raven.transport.inbox import StreamInbox
from raven.transport.stream import StreamOpenError, StreamReceiver, StreamResetError

__all__ = ["END_LINGER_S", "StreamCarrier", "StreamReceiver", "StreamSlots", "TunnelStream"]

#: After we ended a stream whose peer has not ended yet and the application let go of it (a
#: complete response), how long the peer has to send its END before the stream is reset.
END_LINGER_S = 10.0


class StreamSlots(Protocol):
    """The tunnel's stream table as a stream sees it."""

    def forget(self, stream_id: int) -> object:
        """The stream is gone (reset or refused by us)."""
        ...

    @property
    def crowded(self) -> bool:
        """Over half the tunnel's streams are open: an idle one is not kept for reuse."""
        ...


class StreamCarrier(Protocol):
    """What a stream needs of its tunnel (:class:`raven.transport.tunnel.Tunnel`)."""

    loop: asyncio.AbstractEventLoop

    @property
    def streams(self) -> StreamSlots: ...

    @property
    def write_paused(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    def call(self, fn: Callable[[TunnelConnection], object]) -> None: ...

    def send_stream_data(self, stream_id: int, data: bytes | memoryview) -> None: ...

    def consume_stream_data(self, stream_id: int, n: int) -> None: ...

    def send_capacity(self, stream_id: int) -> int: ...

    async def wait_writable(self) -> None: ...


class TunnelStream:
    """One multiplexed stream: implements :class:`raven.transport.stream.ByteStream`."""

    def __init__(self, tunnel: StreamCarrier, stream_id: int, *, incoming: bool) -> None:
        self._tunnel = tunnel
        self.stream_id = stream_id
        self.incoming = incoming
        self._inbox = StreamInbox(self)
        self._writable = asyncio.Event()
        self._eof = False
        self._sent_eof = False
        self._reset: StreamResetError | None = None
        self._closed = False
        self._answered = not incoming
        self._linger: asyncio.TimerHandle | None = None
        self.opened: asyncio.Future[None] | None = None
        #: where the stream's events go: its inbox (for ``read``) unless a receiver is attached
        self.receiver: StreamReceiver = self._inbox

    # ------------------------------------------------------------ events (TunnelStreams)
    def on_data(self, data: bytes) -> None:
        if self._linger is not None:  # nobody reads any more: give the credit straight back
            self._tunnel.consume_stream_data(self.stream_id, len(data))
            return
        self.receiver.stream_data(data)

    def on_end(self) -> None:
        self._eof = True
        self.receiver.stream_eof()

    def on_reset(self, code: StreamCode, reason: str) -> None:
        self._stop_linger()
        if self._reset is None:
            self._reset = StreamResetError(code, reason)
        self._writable.set()
        self.receiver.stream_reset(self._reset)

    def on_window(self) -> None:
        self._writable.set()
        self.receiver.stream_writable()

    def on_open_answer(self, failure: StreamOpenError | None) -> None:
        """The peer's answer to our OPEN (None: accepted), for whoever awaits ``opened``."""
        opened = self.opened
        if opened is not None and not opened.done():
            if failure is None:
                opened.set_result(None)
            else:
                opened.set_exception(failure)

    def on_closed(self) -> None:
        self._stop_linger()
        self._closed = True
        self._inbox.wake()
        self._writable.set()

    # ------------------------------------------------------------ incoming streams
    @property
    def answered(self) -> bool:
        """Accepted or refused (an opened stream: always)."""
        return self._answered

    def accept(self) -> None:
        """Accept an incoming stream (the agent connected to the target). Raises
        StreamResetError when the peer reset it (or the tunnel closed) meanwhile."""
        if self._reset is not None:
            raise self._reset
        if not self._answered:
            self._answered = True
            self._tunnel.call(lambda c: c.accept_stream(self.stream_id))

    def refuse(self, code: StreamCode, reason: str = "") -> None:
        """Refuse an incoming stream with a reason code (nothing to do once reset)."""
        if not self._answered and self._reset is None:
            self._answered = True
            self._closed = True
            self._tunnel.call(lambda c: c.refuse_stream(self.stream_id, code, reason))
            self._tunnel.streams.forget(self.stream_id)

    # ------------------------------------------------------------ callbacks (StreamReceiver)
    def attach(self, receiver: StreamReceiver) -> None:
        """Deliver this stream's events to ``receiver`` from now on, starting with what is
        buffered (bytes, then the END or the reset)."""
        self.receiver = receiver
        self._inbox.hand_to(receiver)
        if self._reset is not None:
            receiver.stream_reset(self._reset)
        elif self._eof:
            receiver.stream_eof()

    def detach(self) -> None:
        """Back to ``read``: bytes that arrive from now on are buffered (a kept stream between
        two requests; anything that arrives then makes it no longer reusable)."""
        self.receiver = self._inbox

    def consumed(self, size: int) -> None:
        """An attached receiver took ``size`` bytes: their credit may flow back."""
        if size and not self._closed and self._reset is None:
            self._tunnel.consume_stream_data(self.stream_id, size)

    @property
    def send_blocked(self) -> bool:
        """No credit, or the tunnel's transport is over its mark: wait for stream_writable."""
        return self._tunnel.write_paused or self._tunnel.send_capacity(self.stream_id) <= 0

    def send_nowait(self, data: bytes | memoryview) -> int:
        """Send what the credit allows now; returns how many bytes of ``data`` went."""
        if self._reset is not None:
            raise self._reset
        if self._closed or self._sent_eof:
            raise StreamResetError(StreamCode.CANCELLED, "write after end of stream")
        n = min(self._tunnel.send_capacity(self.stream_id), len(data))
        if n > 0:
            self._tunnel.send_stream_data(self.stream_id, data if n == len(data) else data[:n])
        return max(n, 0)

    def try_send(self, data: bytes) -> bool:
        broken = self._reset is not None or self._closed or self._sent_eof
        if not broken and len(data) > self._tunnel.send_capacity(self.stream_id):
            return False  # not the credit for all of it now
        return self.send_nowait(data) == len(data)  # raises on a broken stream

    def end(self) -> None:
        """Half-close now (END after the queued data); a no-op once ended or reset."""
        if self._sent_eof or self._closed or self._reset is not None:
            return
        self._sent_eof = True
        self._tunnel.call(lambda c: c.end_stream(self.stream_id))

    # ------------------------------------------------------------ ByteStream
    async def read(self, max_bytes: int = 65536) -> bytes:
        """What the inbox holds (no receiver attached): :meth:`StreamInbox.read`."""
        return await self._inbox.read(max_bytes)

    def read_failure(self) -> StreamResetError | None:
        return self._reset

    def read_ended(self) -> bool:
        return self._eof or self._closed

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._reset is not None:
                raise self._reset
            if self._closed or self._sent_eof:
                raise StreamResetError(StreamCode.CANCELLED, "write after end of stream")
            capacity = self._tunnel.send_capacity(self.stream_id)
            if capacity <= 0:
                self._writable.clear()
                await self._writable.wait()
                continue
            n = min(capacity, len(view))
            self._tunnel.send_stream_data(self.stream_id, bytes(view[:n]))
            view = view[n:]
        await self._tunnel.wait_writable()

    def reusable(self) -> bool:
        """Idle and whole, on a tunnel neither draining nor more than half full of streams (an
        idle stream kept for reuse must not crowd out new ones)."""
        whole = not (self._eof or self._sent_eof or self._closed or self._inbox)
        if not whole or self._reset is not None or self._linger is not None:
            return False
        return not (self._tunnel.draining or self._tunnel.streams.crowded)

    async def write_eof(self) -> None:
        self.end()

    def reset(self, code: StreamCode, reason: str = "") -> None:
        if self._closed or self._reset is not None:
            return
        self._reset = StreamResetError(code, reason)
        self._inbox.wake()
        self._writable.set()
        self._tunnel.call(lambda c: c.reset_stream(self.stream_id, code, reason))
        self._tunnel.streams.forget(self.stream_id)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Release the stream. Ended both ways: nothing to do. Ended by us only: the peer's
        END closes it (what it still sends is dropped), or a reset CANCELLED after
        `END_LINGER_S`. Not ended by us: reset CANCELLED now."""
        if self._closed or self._reset is not None or self._linger is not None:
            return
        if not self._sent_eof:
            self.reset(StreamCode.CANCELLED, "closed by application")
        elif not self._eof:
            unread = self._inbox.drop()
            if unread:
                self._tunnel.consume_stream_data(self.stream_id, unread)
            self._linger = self._tunnel.loop.call_later(END_LINGER_S, self._linger_expired)

    def _linger_expired(self) -> None:
        self._linger = None
        self.reset(StreamCode.CANCELLED, f"no END from the peer within {END_LINGER_S:g}s")

    def _stop_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
