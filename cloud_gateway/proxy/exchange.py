"""One proxied HTTP request: open a stream to the target, forward the request, stream back.

The whole tunnel leg (open, request, response) runs under one deadline taken from
``X-Prometheus-Scrape-Timeout-Seconds``. Until the first response byte goes to the client a
failure becomes an error response; after that the client connection is cut without completing
the framing, so a short body is never passed off as whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from cloud_gateway.proxy.context import (
    BODY_READ_BYTES,
    MAX_RESPONSE_HEAD_BYTES,
    READ_BYTES,
    ProxyContext,
)
from cloud_gateway.proxy.errors import (
    KIND_BY_OPEN_FAILURE,
    ErrorKind,
    HttpParseError,
    ProxyError,
)
from cloud_gateway.proxy.framing import LAST_CHUNK, chunk, framer_for
from cloud_gateway.proxy.heads import BodyKind, HeadReader, RequestHead, parse_response_head
from cloud_gateway.proxy.rewrite import request_head_for_target, response_head_for_client
from cloud_gateway.proxy.target import Target
from raven.protocol.codes import StreamCode
from raven.protocol.frames import MAX_OPEN_DATA_BYTES
from raven.transport.stream import ByteStream, StreamOpenError, StreamResetError

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(slots=True)
class Outcome:
    """How an exchange ended: keep the client connection? how much was relayed?"""

    keep_alive: bool
    status: int
    response_bytes: int
    #: the stream stays open for the client's next request (not ended, not reset)
    stream_kept: bool = False


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
        *,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        buf: HeadReader,
        req: RequestHead,
        target: Target,
        keep_stream: bool = False,
    ) -> None:
        self.ctx = ctx
        self.reader = reader
        self.writer = writer
        self.buf = buf
        self.req = req
        self.target = target
        self.started = False  # a response byte went to the client
        self.status = 0
        self.sent = 0
        #: asked: keep the stream for the next request; ``reusable``: the response allows it
        self.keep_stream = keep_stream
        self.reusable = False
        #: the whole request went with the stream's OPEN (early_request)
        self.sent_early = False

    def early_request(self) -> bytes:
        """The whole request when it can ride with the stream's OPEN (no round trip before it
        leaves): the head, with a Content-Length body already read; b"" when it cannot (a
        streamed or large body, ``Expect: 100-continue``) and :meth:`run` sends it."""
        req = self.req
        head = request_head_for_target(req, self.target, keep_alive=self.keep_stream)
        if req.body is BodyKind.NONE:
            data = head
        elif req.body is BodyKind.LENGTH and not req.expect_continue:
            if len(head) + req.content_length > MAX_OPEN_DATA_BYTES:
                return b""
            if len(self.buf) < req.content_length:
                return b""
            data = head + self.buf.take(req.content_length)
        else:
            return b""
        if len(data) > MAX_OPEN_DATA_BYTES:
            return b""
        self.sent_early = True
        return data

    async def run(self, stream: ByteStream, timeout_s: float) -> Outcome:
        """Forward over ``stream``; raises ProxyError (nothing sent yet) or CutConnection."""
        clean = kept = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._send_request(stream)
                outcome = await self._relay_response(stream)
            clean = True
            kept = outcome.stream_kept = self.reusable and stream.reusable()
            return outcome
        except TimeoutError:
            detail = f"{self.target.authority} did not answer within {timeout_s:g}s"
            raise self._failure(ProxyError(ErrorKind.SCRAPE_TIMEOUT, detail)) from None
        except StreamResetError as exc:
            detail = f"{self.target.authority}: {exc.code.label} {exc.reason}".rstrip()
            raise self._failure(ProxyError(ErrorKind.TARGET_RESET, detail)) from None
        except HttpParseError as exc:
            raise self._failure(exc) from None
        except OSError as exc:
            error = ProxyError(ErrorKind.CLIENT_GONE, str(exc) or type(exc).__name__)
            raise CutConnection(error, 499, self.sent) from None
        finally:
            if kept:
                pass  # idle, whole, owned by the client connection for its next request
            elif clean:  # the response is complete: END our side, the peer ends its own
                with contextlib.suppress(StreamResetError, OSError):
                    await stream.write_eof()
                await stream.aclose()
            else:
                stream.reset(StreamCode.CANCELLED, "proxy request aborted")
                await stream.aclose()

    def _failure(self, error: ProxyError) -> Exception:
        if not self.started:
            return error
        if error.kind is not ErrorKind.SCRAPE_TIMEOUT:
            error = ProxyError(ErrorKind.INCOMPLETE, f"response cut short: {error.detail}")
        return CutConnection(error, self.status, self.sent)

    async def _send_request(self, stream: ByteStream) -> None:
        if self.sent_early:
            return
        req = self.req
        head = request_head_for_target(req, self.target, keep_alive=self.keep_stream)
        if req.body is BodyKind.NONE:
            await stream.write(head)
            return
        if req.expect_continue:
            self.writer.write(_CONTINUE)
        framer = framer_for(req.body, req.content_length, ErrorKind.MALFORMED)
        data = self.buf.take()
        while True:
            n = framer.feed(data)
            if n < len(data):
                self.buf.unread(data[n:])
            await stream.write(head + data[:n] if head else data[:n])
            head = b""
            if framer.done:
                return
            data = await self.reader.read(READ_BYTES)
            if not data:
                raise ConnectionResetError("client closed the connection mid-body")

    async def _read_response_head(self, stream: ByteStream) -> tuple[bytes, bytes]:
        heads = HeadReader(MAX_RESPONSE_HEAD_BYTES, ErrorKind.BAD_RESPONSE)
        while True:
            data = await stream.read(BODY_READ_BYTES)
            if not data:
                raise HttpParseError(
                    ErrorKind.BAD_RESPONSE, f"{self.target.authority} closed without a response"
                )
            if not len(heads):  # fast path: the whole head in the first read, no copies
                end = data.find(b"\r\n\r\n", 0, MAX_RESPONSE_HEAD_BYTES)
                if end >= 0:
                    return data[: end + 4], data[end + 4 :]
            heads.feed(data)
            head = heads.next_head()
            if head is not None:
                return head, heads.take()

    async def _relay_response(self, stream: ByteStream) -> Outcome:
        req = self.req
        while True:
            head, data = await self._read_response_head(stream)
            resp = parse_response_head(head, req.method)
            if resp.status >= 200:
                break
            if resp.status == 101:
                raise HttpParseError(ErrorKind.BAD_RESPONSE, "unexpected 101 Switching Protocols")
            if data:  # interim 1xx answers are dropped; put the rest back in front
                stream = _Prefixed(stream, data)
        framer = framer_for(resp.body, resp.content_length, ErrorKind.BAD_RESPONSE)
        rechunk = resp.body is BodyKind.CLOSE and not resp.has_transfer_encoding
        rechunk = rechunk and req.version == (1, 1)
        keep = req.keep_alive and not self.ctx.draining
        keep = keep and (resp.body is not BodyKind.CLOSE or rechunk)
        # the target's connection (and so the stream) serves another request only when the
        # target keeps it, the body ends by its framing and nothing came before or after it
        self.reusable = (
            self.keep_stream
            and resp.version == (1, 1)
            and b"close" not in resp.connection_tokens
            and resp.body is not BodyKind.CLOSE
            and not isinstance(stream, _Prefixed)
        )
        writer = self.writer
        out = [response_head_for_client(resp, req.version, keep_alive=keep, rechunk=rechunk)]
        self.started, self.status, self.sent = True, resp.status, len(out[0])
        while True:
            if data:
                n = framer.feed(data)
                if n < len(data):  # bytes past the body: the connection is not reusable
                    self.reusable = False
                body = data if n == len(data) else data[:n]
                out.extend(chunk(body) if rechunk else (body,))
                self.sent += n
            if out:  # the head goes out with the first body bytes: one send, not two
                writer.writelines(out)
                out = []
                await writer.drain()
            if framer.done:
                break
            data = await stream.read(BODY_READ_BYTES)
            if not data and not framer.finish():
                raise HttpParseError(ErrorKind.INCOMPLETE, "target closed mid-body")
            if framer.done:
                break
        if rechunk:
            writer.write(LAST_CHUNK)
            self.sent += len(LAST_CHUNK)
        await writer.drain()
        return Outcome(keep, resp.status, self.sent)


class _Prefixed:
    """A ByteStream that first returns ``prefix`` (bytes read past an interim response)."""

    def __init__(self, inner: ByteStream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    async def read(self, max_bytes: int = READ_BYTES) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return out
        return await self._inner.read(max_bytes)

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def write_eof(self) -> None:
        await self._inner.write_eof()

    def reset(self, code: StreamCode, reason: str = "") -> None:
        self._inner.reset(code, reason)

    def reusable(self) -> bool:
        return False  # bytes past an interim response were consumed: never kept

    async def aclose(self) -> None:
        await self._inner.aclose()
