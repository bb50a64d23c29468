"""One client connection on the HTTP proxy listener: keep-alive requests, driven by callbacks.

Heads are parsed, resolved and admitted as bytes arrive (``data_received``). Every request
is one Exchange run by callbacks under one timer (``Exchange.start``): at once on a kept stream
of its target (stream_pool), else once a task has opened its stream (the only wait; CONNECT
then joins the client to it, ``relay``). Nothing runs for the connection between requests.
Bounds: the first request head must arrive within ``header_timeout_s`` of the accept, later
ones within ``header_timeout_s`` of their first byte; an idle keep-alive connection closes
after ``idle_timeout_s`` (at once on a drain); a head over ``max_header_bytes`` gets 431. Parse
errors close the connection; a failed target keeps it (the request was read completely) unless
the request had a body.
"""

from __future__ import annotations

import asyncio
import time

from cloud_gateway.proxy.client_conn import ClientConnection, ConnectionSlots, log
from cloud_gateway.proxy.context import UNKNOWN_MODE, Admission, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError, ProxyError, error_response
from cloud_gateway.proxy.exchange import CutConnection, Exchange, open_target
from cloud_gateway.proxy.heads import BodyKind, RequestHead, parse_request_head
from cloud_gateway.proxy.relay import relay
from cloud_gateway.proxy.response_relay import Outcome
from cloud_gateway.proxy.target import Mode, Target, resolve_target
from raven.telemetry.logs import fields
from raven.transport.stream import ByteStream

_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
#: How a kept stream whose target connection went away while idle fails before any response
#: byte (the agent's END or a reset): the request, which had no body, is sent again once on a
#: new stream, as HTTP/1.1 clients do on a reused connection.
_STALE = frozenset({ErrorKind.TARGET_RESET, ErrorKind.BAD_RESPONSE})
_TIMEOUT_HEADER = b"x-prometheus-scrape-timeout-seconds"


class HttpConnection(ClientConnection):
    """Serves requests on one accepted connection until it should close."""

    def __init__(self, ctx: ProxyContext, slots: ConnectionSlots) -> None:
        super().__init__(ctx, slots)
        self._linger = False
        self._idle = False

    # ------------------------------------------------------------ ClientConnection hooks
    def start(self) -> None:
        self.arm(self.ctx.config.header_timeout_s, self._header_timeout)
        self._next_request()

    def received(self) -> None:
        if self.task is not None:
            return  # a request in flight: its body, or pipelined requests waiting their turn
        if self._idle:  # the first byte of the next request: its head has header_timeout_s
            self._leave_idle()
            self.arm(self.ctx.config.header_timeout_s, self._header_timeout)
        self._next_request()

    def ended(self) -> None:
        if self.task is None:
            self._end()

    # ------------------------------------------------------------ between requests
    def _next_request(self) -> None:
        """Serve the requests whose heads are complete, in order, until one is in flight (its
        task, or a kept stream's callbacks: `finished` goes on from there) or the connection
        ends. A loop, not recursion: a client may pipeline any number of refused requests."""
        while True:
            try:
                head = self.buf.next_head()
            except HttpParseError as exc:
                self._fail(exc, UNKNOWN_MODE, close=True)
                self._end()
                return
            if head is None:
                if self.eof:
                    self._end()
                return
            self.disarm()
            self.reading_room()
            keep = self._begin(head)
            if keep is None or not self._between(keep):
                return

    def finished(self, result: object) -> None:
        """The request's task ended: ``result`` is True to keep the connection."""
        if self._between(bool(result)):
            self._next_request()

    def _between(self, keep: bool) -> bool:
        """A request is done: True when the next head may already be buffered."""
        if not keep or self.lost:
            self._end()
        elif len(self.buf):  # a pipelined request, or part of one
            self.arm(self.ctx.config.header_timeout_s, self._header_timeout)
            return True
        elif self.eof or self.ctx.draining:
            self._end()
        else:
            self._idle = True
            self.ctx.idle.add(self)
            self.arm(self.ctx.config.idle_timeout_s, self._end)
        return False

    def _leave_idle(self) -> None:
        self._idle = False
        self.ctx.idle.discard(self)

    def _header_timeout(self) -> None:
        if self.task is not None:
            return
        if not len(self.buf):
            # nothing ever sent (the header timer runs with an empty buffer only from the
            # accept: later ones start at a request's first byte): a client's spare pooled
            # connection (Go's transport dials one per waiting request and pools those it did
            # not need) or a port scan. Closed with a FIN as nginx does, not a 408, which a
            # client that picks the connection at this moment reads as its request's answer.
            self.ctx.metrics.unused_closed.inc()
            self._end()
            return
        detail = f"request head not received within {self.ctx.config.header_timeout_s:g}s"
        self._fail(ProxyError(ErrorKind.HEADER_TIMEOUT, detail), UNKNOWN_MODE, close=True)
        self._end()

    def close(self) -> None:
        """Close (a drain closes idle connections through here)."""
        self._release()
        super().close()

    def _end(self) -> None:
        """The connection is done: after an error answer a lingering close, else FIN."""
        self._release()
        if self._linger:
            self.linger_close()
        else:
            super().close()

    def _release(self) -> None:
        """No longer idle."""
        if self._idle:
            self._leave_idle()

    def _fail(self, exc: ProxyError, mode: str, node: str = "", *, close: bool) -> None:
        self.ctx.record_error(exc, mode, self.peer, node)
        if not self.is_closing():
            self.write(error_response(exc.kind, exc.detail, close=close))
            self._linger = self._linger or close

    # ------------------------------------------------------------ one request
    def _begin(self, head: bytes) -> bool | None:
        """Start one request: None while it is in flight, else whether to keep the
        connection (it was answered at once: a bad head, an unknown target, a limit)."""
        try:
            req = parse_request_head(head)
        except HttpParseError as exc:
            self._fail(exc, UNKNOWN_MODE, close=True)
            return False
        try:
            target = resolve_target(req)
        except ProxyError as exc:
            mode = Mode.CONNECT.value if req.method == "CONNECT" else UNKNOWN_MODE
            close = not req.keep_alive or req.body is not BodyKind.NONE or req.method == "CONNECT"
            self._fail(exc, mode, close=close)
            return not close
        try:
            slot = self.ctx.admit(self.client, target.node)  # released when the request is done
        except ProxyError as exc:  # over a limit: 429/503 with Retry-After
            connect = target.mode is Mode.CONNECT
            close = not req.keep_alive or req.body is not BodyKind.NONE or connect
            self._fail(exc, target.mode.value, target.node, close=close)
            return not close
        if target.mode is Mode.CONNECT:
            self.spawn(self._connect(target, slot))
        else:
            self._forward(req, target, slot, time.monotonic())
        return None

    def _forward(
        self,
        req: RequestHead,
        target: Target,
        slot: Admission,
        start: float,
        *,
        fresh: bool = False,
    ) -> None:
        """Forward one request: on a kept stream of its target at once (stream_pool: a
        bodiless request, which may be sent again if the stream proves stale), else on a
        stream a task opens (the request rides with the OPEN when it can); ``fresh``: a kept
        stream proved stale, this is the one retry. Either way one Exchange, by callbacks."""
        ctx = self.ctx
        # the stream of a bodiless request (the target's connection) stays for the next
        # request to that target from any client (stream_pool), whatever this client does
        pooled = req.body is BodyKind.NONE and ctx.streams.enabled  # closed by a drain
        exchange = Exchange(ctx, self, req, target, keep_stream=pooled)
        stream = ctx.streams.take((target.node, target.port)) if pooled and not fresh else None
        if stream is None:
            self.spawn(self._open(exchange, slot, start))
        else:
            self._run(exchange, stream, slot, start, reused=True)

    async def _open(self, exchange: Exchange, slot: Admission, start: float) -> bool | None:
        """The one wait of a request: opening its stream. None: the exchange runs on (its
        end goes on in _exchanged); else whether to keep the connection."""
        req, target = exchange.req, exchange.target
        timeout_s = self.ctx.scrape_timeout(req.header(_TIMEOUT_HEADER))
        try:
            stream = await open_target(self.ctx, target, timeout_s, exchange.early_request())
        except ProxyError as exc:
            slot.release()
            close = not req.keep_alive or req.body is not BodyKind.NONE or self.ctx.draining
            self._fail(exc, target.mode.value, target.node, close=close)
            return not close
        except BaseException:  # cancelled: a drain past its grace
            slot.release()
            raise
        self._run(exchange, stream, slot, start, reused=False)
        return None

    def _run(
        self, exchange: Exchange, stream: ByteStream, slot: Admission, start: float, reused: bool
    ) -> None:
        timeout_s = self.ctx.scrape_timeout(exchange.req.header(_TIMEOUT_HEADER))
        done = exchange.start(stream, timeout_s - (time.monotonic() - start))
        self.task = done  # what a drain waits for, and cancels past its grace
        done.add_done_callback(lambda _: self._exchanged(exchange, stream, slot, start, reused))

    def _exchanged(
        self, exchange: Exchange, stream: ByteStream, slot: Admission, start: float, reused: bool
    ) -> None:
        """The exchange ended: a stale kept stream's request once more afresh; else the
        admission slot released, the outcome recorded, the connection kept or ended."""
        self.task = None
        result = exchange.finish(stream)
        req, target = exchange.req, exchange.target
        if reused and _stale(result, exchange):
            self._forward(req, target, slot, start, fresh=True)
            return
        with slot:
            if isinstance(result, Outcome):
                self._succeeded(target, stream, result, start)
                keep = result.keep_alive
            elif isinstance(result, asyncio.CancelledError):
                if exchange.started:  # a drain past its grace cuts the answer: visibly
                    self.abort()
                keep = False
            else:
                keep = self._failed(result, target)
        self.finished(keep)

    def _succeeded(
        self, target: Target, stream: ByteStream, outcome: Outcome, start: float
    ) -> None:
        ctx = self.ctx
        if outcome.stream_kept:
            ctx.streams.put((target.node, target.port), stream)
        ctx.metrics.request(target.mode.value, outcome.status)
        ctx.metrics.response_bytes += outcome.response_bytes
        seconds = time.monotonic() - start
        ctx.metrics.observe(target.node, seconds)
        ctx.scrapes.ok(target.node, outcome.status, seconds)

    def _failed(self, exc: BaseException, target: Target) -> bool:
        """An exchange failed: record, answer (and close) or cut; False: the connection ends."""
        if isinstance(exc, CutConnection):
            self.ctx.record_error(exc.error, target.mode.value, self.peer, target.node,
                                  exc.status)  # fmt: skip
            self.ctx.metrics.response_bytes += exc.response_bytes
            self.abort()
            return False
        if isinstance(exc, ProxyError):
            self._fail(exc, target.mode.value, target.node, close=True)
            return False
        log.error("proxy connection failed", exc_info=exc, extra=fields(peer=self.peer))
        self.abort()  # a bug, as a task's would be (ClientConnection._task_done)
        return False

    async def _connect(self, target: Target, slot: Admission) -> bool:
        with slot:
            await self._connect_on(target)
        return False

    async def _connect_on(self, target: Target) -> None:
        ctx = self.ctx
        try:
            stream = await open_target(ctx, target, ctx.config.default_timeout_s)
        except ProxyError as exc:
            self._fail(exc, Mode.CONNECT.value, target.node, close=True)
            return
        self.write(_ESTABLISHED)
        ctx.metrics.request(Mode.CONNECT.value, 200)
        await relay(ctx, self, stream, target=target)


def _stale(exc: object, exchange: Exchange) -> bool:
    """The exchange on a kept stream failed as one whose target connection had gone while
    idle does (_STALE), before any response byte: the request may go once more, afresh."""
    return isinstance(exc, ProxyError) and exc.kind in _STALE and not exchange.started
