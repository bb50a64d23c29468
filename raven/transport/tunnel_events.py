"""What a tunnel does with each event of its connection (the adapter's half that reacts).

:class:`TunnelEvents` is a part of :class:`raven.transport.tunnel.Tunnel`: stream data fed to
its stream, open answers settled, resets and ends delivered, an incoming OPEN handed to the
stream handler (one task per stream, its failure answered for it), the handshake's future
settled, and every event but a stream's data and window openings (the stream's own business,
the most frequent events by far) passed on to ``on_event`` afterwards. Nothing here touches the
socket or the connection's state: the tunnel's engine calls :meth:`TunnelEvents._dispatch`
for each event it takes from the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from raven.protocol import events as ev
from raven.protocol.codes import CloseCode, StreamCode
from raven.transport.stream import OPEN_FAILURE_BY_CODE, OpenFailure, StreamOpenError
from raven.transport.tunnel_stream import TunnelStream

if TYPE_CHECKING:
    from raven.transport.tunnel import Tunnel

__all__ = ["DatagramHandler", "EventHandler", "StreamHandler", "TunnelEvents"]

log = logging.getLogger("raven.transport.tunnel")

StreamHandler = Callable[[TunnelStream, str, int], Awaitable[None]]
DatagramHandler = Callable[[bytes], None]
#: told which tunnel (one handler serves a listener's every tunnel, no closure per tunnel)
EventHandler = Callable[["Tunnel", ev.Event], None]


class TunnelEvents:
    """The event half of :class:`~raven.transport.tunnel.Tunnel` (see the module docstring)."""

    if TYPE_CHECKING:  # what the tunnel provides
        loop: asyncio.AbstractEventLoop
        name: str
        streams: dict[int, TunnelStream]
        handshake: asyncio.Future[bytes]
        rtt_s: float | None
        on_stream: StreamHandler | None
        on_event: EventHandler | None
        _tasks: set[asyncio.Task[Any]] | None

        @property
        def on_datagram(self) -> DatagramHandler | None: ...

        def _consumed(self, stream_id: int, n: int) -> None: ...

        def _trim_if_quiet(self) -> None: ...

        def _terminate(
            self,
            code: CloseCode,
            reason: str,
            *,
            by_peer: bool,
            event: ev.ConnectionTerminated | None = None,
        ) -> None: ...

    def _dispatch(self, event: ev.Event) -> None:
        if isinstance(event, ev.StreamDataReceived):  # a stream's own business: no on_event
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream._feed(event.data)
            else:  # nobody will read it: give the credit straight back
                self._consumed(event.stream_id, len(event.data))
            return
        if isinstance(event, ev.StreamWindowOpened):
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream._window_opened()
            return
        if isinstance(event, ev.StreamOpened):
            self._incoming_stream(event)
        elif isinstance(event, ev.StreamAccepted):
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream._open_answered(None)
        elif isinstance(event, ev.StreamRefused):
            if (stream := self.streams.pop(event.stream_id, None)) is not None:
                failure = OPEN_FAILURE_BY_CODE.get(event.code, OpenFailure.INTERNAL)
                stream._open_answered(StreamOpenError(failure, event.reason))
        elif isinstance(event, ev.StreamEnded):
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream._feed_eof()
        elif isinstance(event, ev.StreamReset):
            if (stream := self.streams.pop(event.stream_id, None)) is not None:
                stream._abort(event.code, event.reason)
                failure = OPEN_FAILURE_BY_CODE.get(event.code, OpenFailure.TUNNEL_CLOSED)
                stream._open_answered(StreamOpenError(failure, event.reason))
        elif isinstance(event, ev.StreamClosed):
            if (stream := self.streams.pop(event.stream_id, None)) is not None:
                stream._finished()
        elif isinstance(event, ev.DatagramReceived):
            if self.on_datagram is not None:
                self.on_datagram(event.data)
        elif isinstance(event, ev.HandshakeCompleted):
            if not self.handshake.done():
                self.handshake.set_result(event.remote_static)
        elif isinstance(event, ev.PongReceived):
            self.rtt_s = event.rtt_s
            self._trim_if_quiet()
        elif isinstance(event, ev.ConnectionTerminated):
            self._terminate(event.code, event.reason, by_peer=event.by_peer, event=event)
            return
        if self.on_event is not None:
            self.on_event(cast("Tunnel", self), event)

    def _incoming_stream(self, event: ev.StreamOpened) -> None:
        stream = TunnelStream(cast("Tunnel", self), event.stream_id, incoming=True)
        self.streams[event.stream_id] = stream
        if self.on_stream is None:
            stream.refuse(StreamCode.UNKNOWN_NODE, "this side serves no streams")
            return
        task = self.loop.create_task(self._run_handler(stream, event.node, event.port))
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
            log.exception("stream handler failed tunnel=%s node=%s port=%s", self.name, node, port)
            if not stream._answered:
                stream.refuse(StreamCode.INTERNAL, "handler failed")
            else:
                stream.reset(StreamCode.INTERNAL, "handler failed")
