"""One client connection on the HTTP proxy listener: keep-alive requests, driven by callbacks.

Heads are parsed as bytes arrive (``data_received``); a complete head starts the one task of
its request, and nothing runs for the connection between requests. Bounds: the first request
head must arrive within ``header_timeout_s`` of the accept, later ones within
``header_timeout_s`` of their first byte; an idle keep-alive connection closes after
``idle_timeout_s`` (at once on a drain); a head over ``max_header_bytes`` gets 431. Parse errors
close the connection; a failed target keeps it (the request was read completely) unless the
request had a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from cloud_gateway.proxy.client_conn import ClientConnection, ConnectionSlots
from cloud_gateway.proxy.context import UNKNOWN_MODE, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError, ProxyError, error_response
from cloud_gateway.proxy.exchange import CutConnection, Exchange, open_target
from cloud_gateway.proxy.heads import BodyKind, RequestHead, parse_request_head
from cloud_gateway.proxy.relay import relay
from cloud_gateway.proxy.target import Mode, Target, resolve_target

_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
#: How a kept stream whose target connection went away while idle fails before any response
#: byte (the agent's END or a reset): the request, which had no body, is sent again once on a
#: new stream, as HTTP/1.1 clients do on a reused connection.
_STALE = frozenset({ErrorKind.TARGET_RESET, ErrorKind.BAD_RESPONSE})


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
        """Start the next request if its head is complete."""
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
        self.spawn(self._serve(head))

    def finished(self, result: object) -> None:
        """The request's task ended: ``result`` is True to keep the connection."""
        if not result or self.lost:
            self._end()
        elif len(self.buf):  # a pipelined request, or part of one
            self.arm(self.ctx.config.header_timeout_s, self._header_timeout)
            self._next_request()
        elif self.eof or self.ctx.draining:
            self._end()
        else:
            self._idle = True
            self.ctx.idle.add(self)
            self.arm(self.ctx.config.idle_timeout_s, self._end)

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

    # ------------------------------------------------------------ one request (its task)
    async def _serve(self, head: bytes) -> bool:
        """Handle one request; True to keep the connection for the next one."""
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
        with contextlib.ExitStack() as slot:
            try:
                slot.enter_context(self.ctx.admit(self.client, target.node))
            except ProxyError as exc:  # over a limit: 429/503 with Retry-After
                connect = target.mode is Mode.CONNECT
                close = not req.keep_alive or req.body is not BodyKind.NONE or connect
                self._fail(exc, target.mode.value, target.node, close=close)
                return not close
            if target.mode is Mode.CONNECT:
                await self._connect(target)
                return False
            return await self._forward(req, target)

    async def _forward(self, req: RequestHead, target: Target) -> bool:
        ctx = self.ctx
        start = time.monotonic()  # full resolution (uvloop's loop.time() is in ms)
        timeout_s = ctx.scrape_timeout(req.header(b"x-prometheus-scrape-timeout-seconds"))
        close_on_error = not req.keep_alive or req.body is not BodyKind.NONE or ctx.draining
        # a request without a body can be sent again if a kept stream proves stale: it takes
        # one from the pool, and its stream (the target's connection) stays for the next
        # request to that target from any client (stream_pool), whatever this client does
        pooled = req.body is BodyKind.NONE and ctx.streams.enabled  # closed by a drain
        key = (target.node, target.port)
        stream = ctx.streams.take(key) if pooled else None
        reused = stream is not None
        while True:
            exchange = Exchange(ctx, self, req, target, keep_stream=pooled)
            if stream is None:  # the request rides with the OPEN when it can
                try:
                    stream = await open_target(ctx, target, timeout_s, exchange.early_request())
                except ProxyError as exc:
                    self._fail(exc, target.mode.value, target.node, close=close_on_error)
                    return not close_on_error
            remaining = timeout_s - (time.monotonic() - start)
            try:
                outcome = await exchange.run(stream, remaining)
            except asyncio.CancelledError:
                if exchange.started:  # a drain past its grace cuts the answer: visibly
                    self.abort()
                raise
            except CutConnection as cut:
                ctx.record_error(cut.error, target.mode.value, self.peer, target.node, cut.status)
                ctx.metrics.response_bytes.inc(cut.response_bytes)
                self.abort()
                return False
            except ProxyError as exc:
                retry = reused and not exchange.started and req.body is BodyKind.NONE
                if retry and exc.kind in _STALE:
                    reused, stream = False, None  # the kept connection had gone: once afresh
                    continue
                self._fail(exc, target.mode.value, target.node, close=True)
                return False
            break
        if outcome.stream_kept:
            ctx.streams.put(key, stream)
        ctx.metrics.request(target.mode.value, outcome.status)
        ctx.metrics.response_bytes.inc(outcome.response_bytes)
        seconds = time.monotonic() - start
        ctx.metrics.observe(target.node, seconds)
        ctx.scrapes.ok(target.node, outcome.status, seconds)
        return outcome.keep_alive

    async def _connect(self, target: Target) -> None:
        ctx = self.ctx
        try:
            stream = await open_target(ctx, target, ctx.config.default_timeout_s)
        except ProxyError as exc:
            self._fail(exc, Mode.CONNECT.value, target.node, close=True)
            return
        self.write(_ESTABLISHED)
        early = self.buf.take()
        ctx.metrics.request(Mode.CONNECT.value, 200)
        await relay(ctx, self, stream, early=early, target=target)
