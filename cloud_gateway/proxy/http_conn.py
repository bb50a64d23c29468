"""One client connection on the HTTP proxy listener: a keep-alive loop of requests.

Bounds: the first request head must arrive within ``header_timeout_s`` of the accept, later ones
within ``header_timeout_s`` of their first byte; an idle keep-alive connection closes after
``idle_timeout_s``; a head over ``max_header_bytes`` gets 431. Parse errors close the connection;
a failed target keeps it (the request was read completely) unless the request had a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from cloud_gateway.proxy.context import (
    READ_BYTES,
    UNKNOWN_MODE,
    ProxyContext,
    peer_host,
    peer_name,
)
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError, ProxyError, error_response
from cloud_gateway.proxy.exchange import CutConnection, Exchange, open_target
from cloud_gateway.proxy.heads import BodyKind, HeadReader, RequestHead, parse_request_head
from cloud_gateway.proxy.relay import relay
from cloud_gateway.proxy.target import Mode, Target, resolve_target
from raven.transport.reset import abort_with_rst
from raven.transport.stream import ByteStream, StreamResetError

_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
#: How a kept stream whose target connection went away while idle fails before any response
#: byte (the agent's END or a reset): the request, which had no body, is sent again once on a
#: new stream, as HTTP/1.1 clients do on a reused connection.
_STALE = frozenset({ErrorKind.TARGET_RESET, ErrorKind.BAD_RESPONSE})
#: After an error answer that closes the connection, what the client still sends is read
#: and dropped this long before the socket closes (see _lingering_close).
LINGER_S = 1.0


class HttpConnection:
    """Serves requests on one accepted connection until it should close."""

    def __init__(
        self, ctx: ProxyContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.ctx = ctx
        self.reader = reader
        self.writer = writer
        self.peer = peer_name(writer)
        self.client = peer_host(writer)
        self.buf = HeadReader(ctx.config.max_header_bytes)
        self.loop = asyncio.get_running_loop()
        #: the stream of the last request, kept for the next one to the same target
        self.upstream: tuple[tuple[str, int], ByteStream] | None = None
        self._linger = False

    async def run(self) -> None:
        deadline: float | None = self.loop.time() + self.ctx.config.header_timeout_s
        try:
            while True:
                head = await self._next_head(deadline)
                if head is None or not await self._serve(head):
                    break
                deadline = None
        finally:
            await self._drop_upstream()
        if self._linger:
            await self._lingering_close()

    async def _lingering_close(self) -> None:
        """After an error answer on a connection the client may still be writing to: FIN
        first, then drop what it still sends for at most LINGER_S, so that closing never
        becomes an RST that destroys the answer in the client's receive queue (nginx's
        lingering close)."""
        writer = self.writer
        if writer.is_closing() or not writer.can_write_eof():
            return
        with contextlib.suppress(OSError, TimeoutError):
            writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                while await self.reader.read(READ_BYTES):
                    pass

    async def _drop_upstream(self) -> None:
        """End the kept stream cleanly (END; the agent closes its target connection)."""
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            stream = upstream[1]
            with contextlib.suppress(StreamResetError, OSError):
                await stream.write_eof()
            await stream.aclose()

    async def _kept_stream(self, target: Target) -> ByteStream | None:
        """The kept stream when it goes to ``target`` and is still whole, else None."""
        if self.upstream is not None:
            key, stream = self.upstream
            if key == (target.node, target.port) and stream.reusable():
                self.upstream = None
                return stream
            await self._drop_upstream()
        return None

    def _fail(self, exc: ProxyError, mode: str, node: str = "", *, close: bool) -> None:
        self.ctx.record_error(exc, mode, self.peer, node)
        if not self.writer.is_closing():
            self.writer.write(error_response(exc.kind, exc.detail, close=close))
            self._linger = self._linger or close

    async def _next_head(self, deadline: float | None) -> bytes | None:
        """The next request head, or None when the connection should close."""
        try:
            head = self.buf.next_head()
            if head is None and deadline is None:
                if not await self._wait_first_byte():
                    return None
                deadline = self.loop.time() + self.ctx.config.header_timeout_s
                head = self.buf.next_head()
            while head is None:
                assert deadline is not None
                data = await self._read_until(deadline)
                if not data:
                    return None
                self.buf.feed(data)
                head = self.buf.next_head()
            return head
        except TimeoutError:
            detail = f"request head not received within {self.ctx.config.header_timeout_s:g}s"
            self._fail(ProxyError(ErrorKind.HEADER_TIMEOUT, detail), UNKNOWN_MODE, close=True)
            return None
        except HttpParseError as exc:
            self._fail(exc, UNKNOWN_MODE, close=True)
            return None
        except OSError:
            return None

    async def _read_until(self, deadline: float) -> bytes:
        """Read more of a head; while nothing of it has arrived the connection counts as idle
        (closed at once by a drain)."""
        idle = not len(self.buf)
        if idle:
            if self.ctx.draining:
                return b""
            self.ctx.idle.add(self.writer)
        try:
            async with asyncio.timeout_at(deadline):
                return await self.reader.read(READ_BYTES)
        finally:
            if idle:
                self.ctx.idle.discard(self.writer)

    async def _wait_first_byte(self) -> bool:
        """Idle between requests: False on EOF, idle timeout or drain."""
        if len(self.buf):
            return True
        if self.ctx.draining:
            return False
        self.ctx.idle.add(self.writer)
        try:
            async with asyncio.timeout(self.ctx.config.idle_timeout_s):
                data = await self.reader.read(READ_BYTES)
        except TimeoutError:
            return False
        finally:
            self.ctx.idle.discard(self.writer)
        if not data:
            return False
        self.buf.feed(data)
        return True

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
        stream = await self._kept_stream(target)
        reused = stream is not None
        while True:
            exchange = Exchange(ctx, reader=self.reader, writer=self.writer, buf=self.buf,
                                req=req, target=target, keep_stream=not close_on_error)  # fmt: skip
            if stream is None:  # the request rides with the OPEN when it can
                try:
                    stream = await open_target(ctx, target, timeout_s, exchange.early_request())
                except ProxyError as exc:
                    self._fail(exc, target.mode.value, target.node, close=close_on_error)
                    return not close_on_error
            remaining = timeout_s - (time.monotonic() - start)
            try:
                outcome = await exchange.run(stream, remaining)
            except CutConnection as cut:
                ctx.record_error(cut.error, target.mode.value, self.peer, target.node, cut.status)
                ctx.metrics.response_bytes.inc(cut.response_bytes)
                abort_with_rst(self.writer.transport)
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
            self.upstream = ((target.node, target.port), stream)
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
        self.writer.write(_ESTABLISHED)
        early = self.buf.take()
        ctx.metrics.request(Mode.CONNECT.value, 200)
        await relay(
            ctx, self.reader, self.writer, stream, early=early, target=target, peer=self.peer
        )
