"""A tunnel's streams as the application sees them: the table, their events, the handlers.

:class:`TunnelStreams` is the stream side of a :class:`~raven.transport.tunnel.Tunnel`, which
holds one: it keeps the :class:`~raven.transport.tunnel_stream.TunnelStream` of every open
stream id, delivers each stream event of the connection to its stream (data and window openings
on the hot path, then opens answered, ends, resets, closes), hands an incoming OPEN to the
stream handler (one task per stream, its failure answered for it), aborts every stream when the
tunnel ends and tells a drain when the last one is gone. The tunnel reaches it through its
public methods only, and it reaches the tunnel through the tunnel's public ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from raven.protocol import events as ev
from raven.protocol.codes import StreamCode
from raven.transport.stream import OPEN_FAILURE_BY_CODE, OpenFailure, StreamOpenError
from raven.transport.tunnel_stream import StreamCarrier, TunnelStream

__all__ = ["StreamHandler", "TunnelSide", "TunnelStreams"]

log = logging.getLogger("raven.transport.tunnel")

#: Serves one incoming stream (the agent's relay; the gateway's backfill receiver).
StreamHandler = Callable[[TunnelStream, str, int], Awaitable[None]]


class TunnelSide(StreamCarrier, Protocol):
    """What the table needs of its tunnel besides what its streams do."""

    name: str

    @property
    def closed(self) -> asyncio.Future[ev.ConnectionTerminated]: ...


class TunnelStreams:
    """The open streams of one tunnel (see the module docstring)."""

    __slots__ = ("_by_id", "_none_left", "_tasks", "max_streams", "on_stream", "tunnel")

    def __init__(
        self, tunnel: TunnelSide, on_stream: StreamHandler | None, *, max_streams: int
    ) -> None:
        self.tunnel = tunnel
        self.on_stream = on_stream
        self.max_streams = max_streams
        self._by_id: dict[int, TunnelStream] = {}
        #: the stream handlers' tasks, made by the first (a gateway's tunnels mostly never have one)
        self._tasks: set[asyncio.Task[Any]] | None = None
        #: set when the last stream is gone; made by wait_done (a drain) only
        self._none_left: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[TunnelStream]:
        return iter(list(self._by_id.values()))

    def get(self, stream_id: int) -> TunnelStream | None:
        return self._by_id.get(stream_id)

    @property
    def crowded(self) -> bool:
        """Over half of ``max_streams`` are open (an idle stream must not crowd out new ones)."""
        return len(self._by_id) * 2 > self.max_streams

    @property
    def handlers_running(self) -> int:
        """Incoming streams whose handler task has not returned yet."""
        return len(self._tasks or ())

    # ------------------------------------------------------------ the table
    def add(self, stream: TunnelStream) -> None:
        self._by_id[stream.stream_id] = stream

    def forget(self, stream_id: int) -> TunnelStream | None:
        """Take a stream out of the table (reset, refused or closed)."""
        stream = self._by_id.pop(stream_id, None)
        if not self._by_id:
            self._tell_none_left()
        return stream

    async def wait_done(self, timeout_s: float) -> bool:
        """Wait until no stream is open, at most ``timeout_s``; True if none are left."""
        if self._by_id and not self.tunnel.closed.done():
            if self._none_left is None:
                self._none_left = asyncio.Event()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._none_left.wait()
            except TimeoutError:
                pass
        return not self._by_id

    def abort_all(self, reason: str) -> None:
        """The tunnel ended: every stream reset TUNNEL_CLOSED, every open answered so."""
        streams = list(self._by_id.values())
        self._by_id.clear()
        for stream in streams:
            stream.on_reset(StreamCode.TUNNEL_CLOSED, reason)
            stream.on_open_answer(StreamOpenError(OpenFailure.TUNNEL_CLOSED, reason))
        self._tell_none_left()

    def all_writable(self) -> None:
        """The tunnel's transport drained: writers and attached receivers paused on it go on."""
        for stream in list(self._by_id.values()):
            stream.on_window()

    async def cancel_handlers(self) -> None:
        """Cancel the handler tasks and wait for them (nothing left running)."""
        tasks = list(self._tasks or ())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ events
    def data(self, stream_id: int, data: bytes) -> None:
        """Stream data (the hot path): to its stream, or its credit straight back when
        nobody will read it."""
        stream = self._by_id.get(stream_id)
        if stream is not None:
            stream.on_data(data)
        else:
            self.tunnel.consume_stream_data(stream_id, len(data))

    def window_opened(self, stream_id: int) -> None:
        if (stream := self._by_id.get(stream_id)) is not None:
            stream.on_window()

    def dispatch(self, event: ev.Event) -> bool:
        """Deliver one of the other stream events; False when ``event`` is not one."""
        if isinstance(event, ev.StreamOpened):
            self._incoming(event)
        elif isinstance(event, ev.StreamAccepted):
            if (stream := self._by_id.get(event.stream_id)) is not None:
                stream.on_open_answer(None)
        elif isinstance(event, ev.StreamRefused):
            if (stream := self.forget(event.stream_id)) is not None:
                failure = OPEN_FAILURE_BY_CODE.get(event.code, OpenFailure.INTERNAL)
                stream.on_open_answer(StreamOpenError(failure, event.reason))
        elif isinstance(event, ev.StreamEnded):
            if (stream := self._by_id.get(event.stream_id)) is not None:
                stream.on_end()
        elif isinstance(event, ev.StreamReset):
            if (stream := self.forget(event.stream_id)) is not None:
                stream.on_reset(event.code, event.reason)
                failure = OPEN_FAILURE_BY_CODE.get(event.code, OpenFailure.TUNNEL_CLOSED)
                stream.on_open_answer(StreamOpenError(failure, event.reason))
        elif isinstance(event, ev.StreamClosed):
            if (stream := self.forget(event.stream_id)) is not None:
                stream.on_closed()
        else:
            return False
        return True

    # ------------------------------------------------------------ incoming streams
    def _incoming(self, event: ev.StreamOpened) -> None:
        stream = TunnelStream(self.tunnel, event.stream_id, incoming=True)
        self.add(stream)
        if self.on_stream is None:
            stream.refuse(StreamCode.UNKNOWN_NODE, "this side serves no streams")
            return
        task = self.tunnel.loop.create_task(self._run_handler(stream, event.node, event.port))
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_handler(self, stream: TunnelStream, node: str, port: int) -> None:
        assert self.on_stream is not None
        try:
            await self.on_stream(stream, node, port)
        except asyncio.CancelledError:
            stream.reset(StreamCode.CANCELLED, "handler cancelled")
            raise
        except Exception:
            log.exception(
                "stream handler failed tunnel=%s node=%s port=%s", self.tunnel.name, node, port
            )
            if not stream.answered:
                stream.refuse(StreamCode.INTERNAL, "handler failed")
            else:
                stream.reset(StreamCode.INTERNAL, "handler failed")

    def _tell_none_left(self) -> None:
        none_left, self._none_left = self._none_left, None
        if none_left is not None:
            none_left.set()
