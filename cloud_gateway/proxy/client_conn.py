"""A proxy client's connection as an ``asyncio.Protocol``: no StreamReader, no task while idle.

:class:`ClientConnection` holds what the HTTP and the TLS listeners share:

- the receive buffer (a :class:`HeadReader`): reading pauses while more than a head and one
  read are buffered and nobody takes them (a request in flight, pipelined bytes behind it);
- ``read`` (awaitable) for request bodies and the CONNECT/TLS relays; ``write``/``drain`` with
  the transport's flow control; the attached response relay is told when the client's
  transport drains (its credit flows again) or the client goes;
- the refusals at accept (``proxy.allowed_clients``, the refusal penalty: an RST before any
  byte is read) and the connection slots (``proxy.max_connections``: a connection over the
  limit waits, not read, for ``header_timeout_s``, then gets 503);
- the lingering close after an error answer (FIN, then what the client still sends is dropped
  for ``LINGER_S``, so the answer is not destroyed by an RST);
- a splice (CONNECT, TLS passthrough): :meth:`splice_to` joins the connection to a stream and
  from then on hands the transport's events to the :class:`~raven.transport.splice.Splice`.

Subclasses serve the bytes: ``start`` (admitted), ``received`` (new bytes in :attr:`buf`),
``ended`` (the client's EOF), ``closed`` (the connection is gone).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import typing

from cloud_gateway.proxy.context import READ_BYTES, ProxyContext, peer_host, peer_name
from cloud_gateway.proxy.errors import ErrorKind, ProxyError, error_response
from cloud_gateway.proxy.heads import HeadReader
from raven.protocol.codes import StreamCode
from raven.telemetry.logs import fields
from raven.transport.reset import abort_with_rst
from raven.transport.splice import Splice
from raven.transport.stream import ByteStream

log = logging.getLogger("cloud_gateway.proxy")

#: After an error answer that closes the connection, what the client still sends is read
#: and dropped this long before the socket closes (nginx's lingering close).
LINGER_S = 1.0


class ResponseSink(typing.Protocol):
    """The response relay attached to a connection (``response_relay.ResponseRelay``)."""

    def client_writable(self) -> None: ...

    def client_gone(self, exc: BaseException | None) -> None: ...


class ConnectionSlots:
    """At most ``limit`` connections served at once; the others wait in arrival order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active: set[ClientConnection] = set()
        self.waiting: collections.deque[ClientConnection] = collections.deque()

    def admit(self, conn: ClientConnection) -> bool:
        """True: ``conn`` holds a slot now; False: it waits (``admitted`` is called later)."""
        if len(self.active) < self.limit:
            self.active.add(conn)
            return True
        self.waiting.append(conn)
        return False

    def release(self, conn: ClientConnection) -> None:
        if conn in self.active:
            self.active.discard(conn)
            while self.waiting and len(self.active) < self.limit:
                nxt = self.waiting.popleft()
                self.active.add(nxt)
                nxt.admitted()
        elif conn in self.waiting:
            self.waiting.remove(conn)


class ClientConnection(asyncio.Protocol):
    """One accepted client connection (see the module docstring)."""

    def __init__(self, ctx: ProxyContext, slots: ConnectionSlots) -> None:
        self.ctx = ctx
        self.slots = slots
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = self.client = "?"
        self.buf = HeadReader(ctx.config.max_header_bytes)
        self.eof = self.lost = False
        self.writing_paused = False
        #: the request (HTTP) or the relay (TLS) in flight, if any: its task, or the future of
        #: a request served by callbacks (what a drain waits for, and cancels past its grace)
        self.task: asyncio.Future[typing.Any] | None = None
        #: the response relay of the request in flight, if any
        self.response: ResponseSink | None = None
        #: the splice the connection is joined to (CONNECT, TLS): it takes the socket's events
        self.splice: Splice | None = None
        self._pause_mark = ctx.config.max_header_bytes + READ_BYTES
        self._reading_paused = self._lingering = self._admitted = False
        self._reader: asyncio.Future[None] | None = None
        self._drainer: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ subclass hooks
    def start(self) -> None:
        """The connection holds a slot: begin serving (bytes may already be buffered)."""

    def received(self) -> None:
        """New bytes are in :attr:`buf`."""

    def ended(self) -> None:
        """The client sent EOF (what it sent before is in :attr:`buf`)."""

    def closed(self) -> None:
        """The connection is gone."""

    def finished(self, result: typing.Any) -> None:
        """The task started by :meth:`spawn` returned ``result``."""
        self.close()

    def spawn(self, work: typing.Coroutine[typing.Any, typing.Any, typing.Any]) -> None:
        """Run ``work`` as this connection's :attr:`task` (one at a time); when it ends,
        :meth:`finished` gets its result; an error is logged and the connection aborted; a
        cancellation (a drain past its grace) closes it."""
        self.task = task = self.loop.create_task(work)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[typing.Any]) -> None:
        if self.task is not task and not task.cancelled() and task.exception() is None:
            return  # its work goes on by callbacks (a request whose stream it opened)
        self.task = None
        if task.cancelled():  # a drain past its grace; a started answer was cut (RST) already
            self.close()
            return
        exc = task.exception()
        if exc is not None:
            log.error("proxy connection failed", exc_info=exc, extra=fields(peer=self.peer))
            self.abort()
            return
        self.finished(task.result())

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here
        self.transport = typing.cast(asyncio.Transport, transport)
        self.peer, self.client = peer_name(transport), peer_host(transport)
        self.ctx.metrics.active_connections.inc()
        refusal = self._refusal_at_accept()
        if refusal is not None:
            self.ctx.record_error(refusal, "unknown", self.peer)
            self.abort()
        elif self.slots.admit(self):
            self._admitted = True
            self.start()
        else:
            self._pause_reading()
            self.arm(self.ctx.config.header_timeout_s, self._no_slot)

    def admitted(self) -> None:
        """A slot came free for this waiting connection."""
        self.disarm()
        self._admitted = True
        self._resume_reading()
        self.start()
        if len(self.buf):
            self.received()

    def data_received(self, data: bytes) -> None:
        if self.splice is not None:
            self.splice.data_received(data)
            return
        if self._lingering:
            return
        self.buf.feed(data)
        if len(self.buf) > self._pause_mark:
            self._pause_reading()
        self._wake_reader()
        if self._admitted:
            self.received()

    def eof_received(self) -> bool:
        self.eof = True
        if self.splice is not None:
            return self.splice.eof_received()
        self._wake_reader()
        if self._lingering:
            self.close()
        elif self._admitted:
            self.ended()
        return True  # keep our side open: the answer may still be on its way

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.disarm()
        self._wake_reader()
        self._wake_drainer()
        self.slots.release(self)
        self.ctx.idle.discard(self)
        self.ctx.metrics.active_connections.dec()
        response, self.response = self.response, None
        if response is not None:
            response.client_gone(exc)
        if self.splice is not None:
            self.splice.connection_lost(exc)
        self.closed()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.splice is not None:
            self.splice.pause_writing()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.splice is not None:
            self.splice.resume_writing()
        self._wake_drainer()
        if self.response is not None:
            self.response.client_writable()

    # ------------------------------------------------------------ reading and writing
    async def read(self, n: int = READ_BYTES) -> bytes:
        """Up to ``n`` bytes (all buffered when negative) of what the client sent; b"" once it
        ended or went away."""
        while not len(self.buf):
            if self.eof or self.lost:
                return b""
            self._resume_reading()
            self._reader = self.loop.create_future()
            await self._reader
        data = self.buf.take(n if n >= 0 else None)
        self.reading_room()
        return data

    def reading_room(self) -> None:
        """Bytes were taken from :attr:`buf`: read again once below the mark."""
        if self._reading_paused and len(self.buf) <= self._pause_mark and self._admitted:
            self._resume_reading()

    def splice_to(self, stream: ByteStream, *, idle_timeout_s: float) -> Splice:
        """Join the connection to ``stream`` (CONNECT, TLS passthrough): what :attr:`buf`
        holds goes first, then the bytes move by callbacks both ways until the splice's
        ``done`` (its result says how it ended; it closed or cut both sides)."""
        splice = Splice(f"client {self.peer}", broken_code=StreamCode.CANCELLED)
        self.disarm()
        early = self.buf.take()
        self._resume_reading()  # the splice pauses and resumes reading from now on
        if self.transport is not None and not self.lost:
            splice.connection_made(self.transport)
        self.splice = splice
        splice.start(stream, early=early, idle_timeout_s=idle_timeout_s)
        if self.lost:
            splice.connection_lost(None)
        elif self.eof:
            splice.eof_received()
        return splice

    def attach_response(self, response: ResponseSink) -> None:
        """Tell ``response`` when the client drains or goes (at once if it is gone)."""
        self.response = response
        if self.lost:
            self.response = None
            response.client_gone(None)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def writelines(self, data: list[bytes]) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines(data)

    async def drain(self) -> None:
        """Wait while the transport is over its mark; ConnectionResetError once it is gone."""
        if self.writing_paused and not self.lost:
            self._drainer = self.loop.create_future()
            await self._drainer
        if self.lost:
            raise ConnectionResetError("client connection lost")

    def can_write_eof(self) -> bool:
        return self.transport is not None and self.transport.can_write_eof()

    def write_eof(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write_eof()

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close once written (FIN)."""
        self.disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Close now with an RST (a cut response, a refused connection)."""
        self.disarm()
        if self.transport is not None:
            abort_with_rst(self.transport)

    def linger_close(self) -> None:
        """After an error answer: FIN, then drop what the client still sends for LINGER_S,
        so that closing never becomes an RST that destroys the answer in its receive queue."""
        transport = self.transport
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        if self.eof:
            self.close()
            return
        self._lingering = True
        self.buf.take()
        self._resume_reading()
        self.arm(LINGER_S, self.close)

    # ------------------------------------------------------------ timers
    def arm(self, delay_s: float, callback: typing.Callable[[], None]) -> None:
        """One timer per connection: ``callback`` in ``delay_s`` (replaces the armed one)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay_s, callback)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------ internals
    def _refusal_at_accept(self) -> ProxyError | None:
        """Why this connection is reset before a byte is read, if it is."""
        if not self.ctx.client_allowed(self.client):
            return ProxyError(ErrorKind.CLIENT_NOT_ALLOWED, "outside proxy.allowed_clients")
        if self.ctx.penalised(self.client):
            limit = self.ctx.config.max_refusals_per_client_per_s
            detail = f"more than {limit} refusals a second, Retry-After ignored"
            return ProxyError(ErrorKind.CLIENT_PENALISED, detail)
        return None

    def _no_slot(self) -> None:
        """Waited ``header_timeout_s`` for a connection slot: 503 and close."""
        self.slots.release(self)
        exc = ProxyError(ErrorKind.BUSY, "too many client connections")
        self.ctx.record_error(exc, "unknown", self.peer)
        self.write(error_response(exc.kind, exc.detail, close=True))
        self.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.lost:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()

    def _wake_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    def _wake_drainer(self) -> None:
        drainer, self._drainer = self._drainer, None
        if drainer is not None and not drainer.done():
            drainer.set_result(None)
