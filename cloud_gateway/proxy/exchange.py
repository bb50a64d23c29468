"""One proxied HTTP request: open a stream to the target, forward the request, relay the answer.

The whole tunnel leg (open, request, response) runs under one deadline taken from
``X-Prometheus-Scrape-Timeout-Seconds``. Only opening the stream is awaited (by the connection);
the request goes with the stream's OPEN when it can, else at once when its head fits the
stream's credit, else (a body, no credit) by a task of the exchange; the response is relayed by
callbacks (``response_relay``) into :attr:`Exchange.done`. Until the first response byte goes
to the client a failure becomes an error response; after that the client connection is cut
without completing the framing, so a short body is never passed off as whole.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from cloud_gateway.proxy.context import ProxyContext
from cloud_gateway.proxy.errors import (
    KIND_BY_OPEN_FAILURE,
    ErrorKind,
    HttpParseError,
    ProxyError,
)
from cloud_gateway.proxy.framing import framer_for
from cloud_gateway.proxy.heads import BodyKind, RequestHead
from cloud_gateway.proxy.response_relay import Outcome, ResponseRelay
from cloud_gateway.proxy.rewrite import request_head_for_target
from cloud_gateway.proxy.target import Target
from raven.protocol.codes import StreamCode
from raven.protocol.frames import MAX_OPEN_DATA_BYTES
from raven.transport.stream import ByteStream, StreamOpenError, StreamResetError

if TYPE_CHECKING:
    from cloud_gateway.proxy.client_conn import ClientConnection

__all__ = ["CutConnection", "Exchange", "open_target"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class CutConnection(Exception):
    """The response started but cannot complete: the client connection must be cut."""

    def __init__(self, error: ProxyError, status: int, response_bytes: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.status = status
        self.response_bytes = response_bytes


async def open_target(
    ctx: ProxyContext, target: Target, timeout_s: float, early: bytes = b""
) -> ByteStream:
    """Open a stream to ``target`` or raise :class:`ProxyError` with the matching kind;
    ``early``: the first request bytes, sent with the open (:meth:`Exchange.early_request`)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await ctx.opener.open_stream(
                target.node, target.port, timeout_s=timeout_s, data=early
            )
    except StreamOpenError as exc:
        kind = KIND_BY_OPEN_FAILURE.get(exc.reason, ErrorKind.INTERNAL)
        raise ProxyError(kind, exc.detail or f"{target.authority}: {exc.reason.value}") from None
    except TimeoutError:
        raise ProxyError(
            ErrorKind.SCRAPE_TIMEOUT, f"opening {target.authority} took over {timeout_s:g}s"
        ) from None


class Exchange:
    """Forwards one request whose target resolved to an HTTP mode."""

    def __init__(
        self,
        ctx: ProxyContext,
        client: ClientConnection,
        req: RequestHead,
        target: Target,
        *,
        keep_stream: bool = False,
    ) -> None:
        self.ctx = ctx
        self.client = client
        self.req = req
        self.target = target
        #: asked: keep the stream for the next request
        self.keep_stream = keep_stream
        #: the whole request went with the stream's OPEN (early_request)
        self.sent_early = False
        self.relay: ResponseRelay | None = None
        #: what the exchange comes to (the relay resolves it; the deadline, a failed send or
        #: a cancel end it before)
        self.done: asyncio.Future[Outcome] = client.loop.create_future()
        self.timeout_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        #: sends a body, or a head waiting for credit (most requests have none)
        self._sender: asyncio.Task[None] | None = None
        #: the scraper named to the agent while backfill is on (the client's address)
        self.scraper = ctx.scrapers.note(client.client, target.mode.value) if ctx.scrapers else None

    @property
    def started(self) -> bool:
        """A response byte went to the client."""
        return self.relay is not None and self.relay.started

    def early_request(self) -> bytes:
        """The whole request when it can ride with the stream's OPEN (no round trip before it
        leaves): the head, with a Content-Length body already read; b"" when it cannot (a
        streamed or large body, ``Expect: 100-continue``) and :meth:`run` sends it."""
        req, buf = self.req, self.client.buf
        head = self._head()
        if req.body is BodyKind.NONE:
            data = head
        elif req.body is BodyKind.LENGTH and not req.expect_continue:
            if len(head) + req.content_length > MAX_OPEN_DATA_BYTES:
                return b""
            if len(buf) < req.content_length:
                return b""
            data = head + buf.take(req.content_length)
            self.client.reading_room()
        else:
            return b""
        if len(data) > MAX_OPEN_DATA_BYTES:
            return b""
        self.sent_early = True
        return data

    def start(self, stream: ByteStream, timeout_s: float) -> asyncio.Future[Outcome]:
        """Forward over ``stream`` under one deadline; returns :attr:`done`. The request
        went with the OPEN, or its head goes now when the stream's credit allows; a body (or
        a head waiting for credit) is sent by a task of the exchange, which reads the client.
        Then the response is relayed by callbacks. :meth:`finish` says how it ended;
        cancelling :attr:`done` (a drain past its grace) ends it now."""
        loop = self.client.loop
        self.timeout_s = timeout_s
        self._timer = loop.call_later(timeout_s, self._fail, TimeoutError())
        req = self.req
        try:
            if self.sent_early or (req.body is BodyKind.NONE and stream.try_send(self._head())):
                self._attach_relay(stream)
                return self.done
        except StreamResetError as exc:  # gone since the pool checked it: stale
            self._fail(exc)
            return self.done
        self._sender = loop.create_task(self._send_then_relay(stream))
        return self.done

    def finish(self, stream: ByteStream) -> Outcome | BaseException:
        """Once :attr:`done` is: the stream released (kept for the next request when whole
        and idle, ENDed after a complete response, else reset) and what the exchange came
        to: the Outcome, a ProxyError (nothing sent to the client yet), a CutConnection,
        or a CancelledError (cancelled)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._sender is not None:
            self._sender.cancel()
        done = self.done
        outcome = None if done.cancelled() or done.exception() else done.result()
        self._release(stream, outcome)
        if outcome is not None:
            return outcome
        if done.cancelled():
            return asyncio.CancelledError()
        exc = done.exception()
        assert exc is not None
        return self.error_for(exc, self.timeout_s)

    def error_for(self, exc: BaseException, timeout_s: float) -> BaseException:
        """What a failure of the exchange becomes: ProxyError before the response started,
        CutConnection after (and when the client went away); anything else as it is."""
        if isinstance(exc, TimeoutError):
            detail = f"{self.target.authority} did not answer within {timeout_s:g}s"
            return self._failure(ProxyError(ErrorKind.SCRAPE_TIMEOUT, detail))
        if isinstance(exc, StreamResetError):
            detail = f"{self.target.authority}: {exc.code.label} {exc.reason}".rstrip()
            return self._failure(ProxyError(ErrorKind.TARGET_RESET, detail))
        if isinstance(exc, HttpParseError):
            return self._failure(exc)
        if isinstance(exc, OSError):
            error = ProxyError(ErrorKind.CLIENT_GONE, str(exc) or type(exc).__name__)
            return CutConnection(error, 499, self._sent())
        return exc

    def _release(self, stream: ByteStream, outcome: Outcome | None) -> None:
        """After the exchange (``outcome`` None: it failed): the stream is kept for the next
        request to the target when whole and idle, else ENDed after a complete response,
        else reset."""
        self.client.response = None
        stream.detach()
        if outcome is not None:
            assert self.relay is not None
            outcome.stream_kept = self.relay.reusable and stream.reusable()
            if outcome.stream_kept:
                return  # idle and whole: the caller keeps it for the next request
            stream.end()  # the response is complete: END our side, the peer ends its own
        else:
            stream.reset(StreamCode.CANCELLED, "proxy request aborted")
        stream.close()

    def _sent(self) -> int:
        return 0 if self.relay is None else self.relay.sent

    def _failure(self, error: ProxyError) -> ProxyError | CutConnection:
        if not self.started:
            return error
        assert self.relay is not None
        if error.kind is not ErrorKind.SCRAPE_TIMEOUT:
            error = ProxyError(ErrorKind.INCOMPLETE, f"response cut short: {error.detail}")
        return CutConnection(error, self.relay.status, self.relay.sent)

    def _head(self) -> bytes:
        return request_head_for_target(
            self.req, self.target, keep_alive=self.keep_stream, scraper=self.scraper
        )

    def _fail(self, exc: BaseException) -> None:
        """End the exchange with ``exc`` (its deadline passed, the send failed)."""
        if not self.done.done():
            self.done.set_exception(exc)

    async def _send_then_relay(self, stream: ByteStream) -> None:
        try:
            await self._send_request(stream)
        except (StreamResetError, HttpParseError, OSError) as exc:
            self._fail(exc)
            return
        if not self.done.done():
            self._attach_relay(stream)

    async def _send_request(self, stream: ByteStream) -> None:
        if self.sent_early:
            return
        req, client = self.req, self.client
        head = self._head()
        if req.body is BodyKind.NONE:
            await stream.write(head)
            return
        if req.expect_continue:
            client.write(_CONTINUE)
        framer = framer_for(req.body, req.content_length, ErrorKind.MALFORMED)
        data = client.buf.take()
        client.reading_room()
        while True:
            n = framer.feed(data)
            if n < len(data):
                client.buf.unread(data[n:])
            await stream.write(head + data[:n] if head else data[:n])
            head = b""
            if framer.done:
                return
            data = await client.read()
            if not data:
                raise ConnectionResetError("client closed the connection mid-body")

    def _attach_relay(self, stream: ByteStream) -> None:
        relay = self.relay = ResponseRelay(self.client, stream, self.req,
                                           keep_stream=self.keep_stream, ctx=self.ctx,
                                           done=self.done)  # fmt: skip
        self.client.attach_response(relay)
        stream.attach(relay)
