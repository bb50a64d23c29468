"""ResponseRelay: a target's answer parsed, framed and written from the stream's callbacks.

Driven by hand (no sockets): a fake client sink records what was written and whether its
transport is over its mark; a fake stream records the credit given back.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.proxy.context import ProxyContext
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError
from cloud_gateway.proxy.heads import parse_request_head
from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.proxy.response_relay import Outcome, ResponseRelay
from raven.config.gateway import ProxyConfig
from raven.protocol.codes import StreamCode
from raven.transport.stream import OpenFailure, StreamResetError
from tests.helpers.proxy import FailingOpener


class Sink:
    def __init__(self) -> None:
        self.writing_paused = False
        self.loop = asyncio.get_running_loop()
        self.out: list[bytes] = []

    def writelines(self, data: list[bytes]) -> None:
        self.out.extend(data)

    @property
    def bytes(self) -> bytes:
        return b"".join(self.out)


class Credit:
    """The stream side: only the credit given back matters to the relay."""

    def __init__(self) -> None:
        self.credit = 0

    def consumed(self, size: int) -> None:
        self.credit += size


def relay_for(request: bytes, sink: Sink, credit: Credit, *, keep: bool = True) -> ResponseRelay:
    metrics = ProxyMetrics(CollectorRegistry())
    ctx = ProxyContext(opener=FailingOpener(OpenFailure.INTERNAL), config=ProxyConfig(),
                       metrics=metrics)  # fmt: skip
    done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    return ResponseRelay(
        sink, credit, parse_request_head(request), keep_stream=keep, ctx=ctx, done=done
    )


GET11 = b"GET /metrics HTTP/1.1\r\nHost: n:1\r\n\r\n"
GET10 = b"GET /metrics HTTP/1.0\r\nHost: n:1\r\n\r\n"


async def test_a_head_split_over_chunks_and_a_length_body() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    parts = [b"HTTP/1.1 200 OK\r\nContent-", b"Length: 5\r\n\r\nab", b"cde"]
    for part in parts:
        relay.stream_data(part)
    outcome = relay.done.result()
    assert outcome.status == 200 and outcome.keep_alive
    assert sink.bytes.startswith(b"HTTP/1.1 200 OK\r\n") and sink.bytes.endswith(b"\r\n\r\nabcde")
    assert outcome.response_bytes == len(sink.bytes)
    assert credit.credit == sum(map(len, parts))  # every byte's credit went back
    assert relay.reusable


async def test_interim_answers_are_dropped_and_the_stream_not_kept() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    relay.stream_data(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert relay.done.result().status == 204
    assert b"100 Continue" not in sink.bytes
    assert not relay.reusable


async def test_bytes_past_the_body_make_the_stream_not_reusable() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    relay.stream_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert relay.done.result().status == 200
    assert sink.bytes.endswith(b"\r\n\r\nok") and b"EXTRA" not in sink.bytes
    assert not relay.reusable
    relay.stream_data(b"more")  # after the end: dropped, credit back, still not reusable
    assert credit.credit == len(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA") + 4


async def test_close_delimited_body_is_rechunked_for_http11_and_ends_at_eof() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    relay.stream_data(b"HTTP/1.1 200 OK\r\n\r\nhello")
    assert not relay.done.done()
    relay.stream_eof()
    outcome = relay.done.result()
    assert outcome.keep_alive and b"Transfer-Encoding: chunked" in sink.bytes
    assert sink.bytes.endswith(b"5\r\nhello\r\n0\r\n\r\n")
    assert not relay.reusable


async def test_close_delimited_body_for_http10_closes_the_connection() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET10, sink, credit)
    relay.stream_data(b"HTTP/1.1 200 OK\r\n\r\nhello")
    relay.stream_eof()
    outcome = relay.done.result()
    assert not outcome.keep_alive and sink.bytes.endswith(b"\r\n\r\nhello")


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", ErrorKind.BAD_RESPONSE),  # closed without a response
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", ErrorKind.INCOMPLETE),
    ],
)
async def test_an_early_end_fails_visibly(data: bytes, kind: ErrorKind) -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    if data:
        relay.stream_data(data)
    relay.stream_eof()
    with pytest.raises(HttpParseError) as caught:
        relay.done.result()
    assert caught.value.kind is kind


async def test_a_bad_head_a_reset_and_a_gone_client_fail_the_relay() -> None:
    relay = relay_for(GET11, Sink(), Credit())
    relay.stream_data(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
    with pytest.raises(HttpParseError, match="101"):
        relay.done.result()
    relay = relay_for(GET11, Sink(), Credit())
    relay.stream_reset(StreamResetError(StreamCode.TARGET_RESET, "boom"))
    with pytest.raises(StreamResetError):
        relay.done.result()
    relay = relay_for(GET11, Sink(), Credit())
    relay.client_gone(None)
    with pytest.raises(ConnectionResetError):
        relay.done.result()


async def test_a_client_over_its_mark_holds_the_credit_and_the_end() -> None:
    sink, credit = Sink(), Credit()
    relay = relay_for(GET11, sink, credit)
    sink.writing_paused = True
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab"
    relay.stream_data(first)
    relay.stream_data(b"cd")
    assert credit.credit == 0  # nothing flows back while the client does not read
    assert not relay.done.done()  # complete, but the client has not taken it yet
    sink.writing_paused = False
    relay.client_writable()
    assert credit.credit == len(first) + 2
    assert relay.done.result().status == 200


async def test_head_too_large_is_a_bad_response() -> None:
    relay = relay_for(GET11, Sink(), Credit())
    relay.stream_data(b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 70000)
    with pytest.raises(HttpParseError) as caught:
        relay.done.result()
    assert caught.value.kind is ErrorKind.BAD_RESPONSE
    await asyncio.sleep(0)
