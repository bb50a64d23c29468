"""A target's response, parsed and framed as it arrives and written straight to the client.

:class:`ResponseRelay` is the :class:`~raven.transport.stream.StreamReceiver` attached to a
request's stream: no task reads the stream, each chunk goes from the tunnel's callback into the
client's transport. Interim (1xx) responses are dropped, the body is counted by its framing
(re-chunked when the target closes to end it and the client speaks HTTP/1.1), and flow control
holds by the splice's rule (``raven.transport.splice.HeldCredit``): while the client's
transport is over its mark the stream's credit is kept back (at most one window more arrives),
and given back at ``client_writable``. :attr:`done` resolves with the
:class:`Outcome`, or fails with ``HttpParseError`` (a bad or cut response),
``StreamResetError`` (the stream was reset) or ``OSError`` (the client went away).
"""

from __future__ import annotations

import asyncio
import typing
from dataclasses import dataclass

from cloud_gateway.proxy.context import MAX_RESPONSE_HEAD_BYTES, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError
from cloud_gateway.proxy.framing import LAST_CHUNK, BodyFramer, chunk, framer_for
from cloud_gateway.proxy.heads import (
    BodyKind,
    HeadReader,
    RequestHead,
    ResponseHead,
    parse_response_head,
)
from cloud_gateway.proxy.rewrite import response_head_for_client
from raven.transport.splice import Consumer, HeldCredit
from raven.transport.stream import StreamResetError


@dataclass(slots=True)
class Outcome:
    """How an exchange ended: keep the client connection? how much was relayed?"""

    keep_alive: bool
    status: int
    response_bytes: int
    #: the stream stays open for the next request to its target (not ended, not reset)
    stream_kept: bool = False


class ClientSink(typing.Protocol):
    """Where a response goes: the client connection (see ``client_conn.ClientConnection``)."""

    writing_paused: bool
    #: the connection's loop (asyncio.get_running_loop() is a getpid syscall in Python 3.11)
    loop: asyncio.AbstractEventLoop

    def writelines(self, data: list[bytes]) -> None: ...


class ResponseRelay:
    """Relays one response (see the module docstring)."""

    def __init__(
        self,
        client: ClientSink,
        stream: Consumer,
        req: RequestHead,
        *,
        keep_stream: bool,
        ctx: ProxyContext,
        done: asyncio.Future[Outcome],
    ) -> None:
        self.client = client
        self.stream = stream
        self.req = req
        self.keep_stream = keep_stream
        self.ctx = ctx
        #: the exchange's future: resolved by the relay (or failed: a deadline, a cancel)
        self.done = done
        #: a response byte went to the client; its status; bytes sent to the client
        self.started = False
        self.status = 0
        self.sent = 0
        #: the response allows the stream to carry the next request to its target
        self.reusable = False
        self._heads: HeadReader | None = None
        self._framer: BodyFramer | None = None
        self._interim = False
        self._rechunk = False
        self._keep_alive = False
        self._held = HeldCredit(stream)
        self._complete_when_writable = False

    # ------------------------------------------------------------ StreamReceiver
    def stream_data(self, data: bytes) -> None:
        if self.done.done():  # past the end of the response: the stream is not reusable
            self.reusable = False
            self.stream.consumed(len(data))
            return
        try:
            self._relay(data)
        except HttpParseError as exc:
            self.fail(exc)

    def stream_eof(self) -> None:
        if self.done.done():
            return
        framer = self._framer
        if framer is None:
            self.fail(HttpParseError(ErrorKind.BAD_RESPONSE, "target closed without a response"))
        elif not framer.finish():
            self.fail(HttpParseError(ErrorKind.INCOMPLETE, "target closed mid-body"))
        else:  # a close-delimited body ends here
            self._body_complete([])

    def stream_reset(self, error: StreamResetError) -> None:
        self.fail(error)

    def stream_writable(self) -> None:
        """Nothing to do: the relay only receives."""

    # ------------------------------------------------------------ from the client connection
    def client_writable(self) -> None:
        """The client's transport drained below its mark: credit flows again."""
        self._held.drained()
        if self._complete_when_writable:
            self._complete_when_writable = False
            self._complete()

    def client_gone(self, exc: BaseException | None) -> None:
        self.fail(exc if isinstance(exc, OSError) else ConnectionResetError("client went away"))

    def fail(self, exc: BaseException) -> None:
        """End the relay with ``exc`` (its deadline passed, say); nothing once it is done."""
        if not self.done.done():
            self.done.set_exception(exc)

    # ------------------------------------------------------------ internals
    def _relay(self, data: bytes) -> None:
        size = len(data)
        out: list[bytes] = []
        if self._framer is None:
            data = self._head(data, out)
        framer = self._framer
        if framer is not None and data:
            n = framer.feed(data)
            if n < len(data):  # bytes past the body: the connection is not reusable
                self.reusable = False
            body = data if n == len(data) else data[:n]
            out.extend(chunk(body) if self._rechunk else (body,))
            self.sent += n
        if framer is not None and framer.done:
            self._body_complete(out)
        elif out:
            self.client.writelines(out)
        self._held.written(size, self.client.writing_paused)

    def _head(self, data: bytes, out: list[bytes]) -> bytes:
        """Parse the response head from ``data`` (and what came before); returns the body
        bytes that followed it. Interim answers are dropped."""
        method = self.req.method
        heads = self._heads
        if heads is None:  # fast path: the whole final head in the first chunk, no copies
            end = data.find(b"\r\n\r\n", 0, MAX_RESPONSE_HEAD_BYTES)
            if end >= 0:
                resp = parse_response_head(data[: end + 4], method)
                if resp.status >= 200:
                    self._start(resp, out)
                    return data[end + 4 :]
            heads = self._heads = HeadReader(MAX_RESPONSE_HEAD_BYTES, ErrorKind.BAD_RESPONSE)
        heads.feed(data)
        while True:
            head = heads.next_head()
            if head is None:
                return b""
            resp = parse_response_head(head, method)
            if resp.status >= 200:
                self._start(resp, out)
                return heads.take()
            if resp.status == 101:
                raise HttpParseError(ErrorKind.BAD_RESPONSE, "unexpected 101 Switching Protocols")
            self._interim = True

    def _start(self, resp: ResponseHead, out: list[bytes]) -> None:
        req = self.req
        self._framer = framer_for(resp.body, resp.content_length, ErrorKind.BAD_RESPONSE)
        rechunk = resp.body is BodyKind.CLOSE and not resp.has_transfer_encoding
        self._rechunk = rechunk = rechunk and req.version == (1, 1)
        keep = req.keep_alive and not self.ctx.draining
        self._keep_alive = keep and (resp.body is not BodyKind.CLOSE or rechunk)
        # the target's connection (and so the stream) serves another request only when the
        # target keeps it, the body ends by its framing and nothing came before or after it
        self.reusable = (
            self.keep_stream
            and resp.version == (1, 1)
            and b"close" not in resp.connection_tokens
            and resp.body is not BodyKind.CLOSE
            and not self._interim
        )
        head = response_head_for_client(resp, req.version, keep_alive=self._keep_alive,
                                         rechunk=rechunk)  # fmt: skip
        out.append(head)
        self.started, self.status, self.sent = True, resp.status, len(head)

    def _body_complete(self, out: list[bytes]) -> None:
        if self._rechunk:
            out.append(LAST_CHUNK)
            self.sent += len(LAST_CHUNK)
        if out:
            self.client.writelines(out)
        if self.client.writing_paused:  # the answer is not taken yet: wait for the client
            self._complete_when_writable = True
        else:
            self._complete()

    def _complete(self) -> None:
        if not self.done.done():
            self.done.set_result(Outcome(self._keep_alive, self.status, self.sent))
