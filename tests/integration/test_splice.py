"""The one splice over loopback: a TCP connection whose protocol is the Splice, joined to a
DirectStream (the tunnel stream's in-memory twin, plain TCP) whose far end is the 'target'."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from raven.protocol.codes import StreamCode
from raven.transport.direct import DirectOpener
from raven.transport.reset import abort_with_rst
from raven.transport.splice import Splice, SpliceEnd
from raven.transport.stream import ByteStream, StreamResetError

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def spliced_socket() -> AsyncIterator[tuple[Splice, Conn]]:
    """A Splice as the protocol of an accepted connection, and the client's end of it."""
    made: asyncio.Queue[Splice] = asyncio.Queue()

    def factory() -> Splice:
        splice = Splice("client", broken_code=StreamCode.CANCELLED)
        made.put_nowait(splice)
        return splice

    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.open_connection("127.0.0.1", port)
    splice = await made.get()
    try:
        yield splice, client
    finally:
        client[1].close()
        server.close()


@asynccontextmanager
async def direct_stream() -> AsyncIterator[tuple[ByteStream, Conn]]:
    """A ByteStream and the TCP end its bytes arrive at (the 'target')."""
    accepted: asyncio.Queue[Conn] = asyncio.Queue()

    async def on_target(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await accepted.put((r, w))

    server = await asyncio.start_server(on_target, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stream = await DirectOpener({"node-a": "127.0.0.1"}).open_stream("node-a", port, timeout_s=5)
    target = await accepted.get()
    try:
        yield stream, target
    finally:
        stream.close()
        target[1].close()
        server.close()


async def read_all_or_reset(reader: asyncio.StreamReader) -> bytes | None:
    """What the peer sent until its FIN; None when it ended with an RST."""
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return None


async def test_both_directions_half_close_early_bytes_and_hooks() -> None:
    to_socket: list[bytes] = []
    from_socket: list[int] = []
    async with (
        spliced_socket() as (splice, (client_r, client_w)),
        direct_stream() as (stream, (target_r, target_w)),
    ):
        splice.start(stream, early=b"GET ", on_to_socket=to_socket.append,
                     on_from_socket=from_socket.append)  # fmt: skip
        client_w.write(b"/metrics")
        client_w.write_eof()
        assert await target_r.read() == b"GET /metrics"  # EOF passed on, other way open
        target_w.write(b"up 1\n")
        target_w.write_eof()
        assert await client_r.read() == b"up 1\n"  # and the socket closed with a FIN
        result = await asyncio.wait_for(splice.done, 10)
    assert result.end is SpliceEnd.DONE and result.error is None
    assert (result.to_stream_bytes, result.to_socket_bytes) == (12, 5)
    assert b"".join(to_socket) == b"up 1\n" and sum(from_socket) == 8  # early: read before


async def test_bytes_sent_before_the_start_wait_and_go_first() -> None:
    async with (
        spliced_socket() as (splice, (_, client_w)),
        direct_stream() as (stream, (target_r, _)),
    ):
        client_w.write(b"second")
        await asyncio.sleep(0.05)  # arrives before the stream is joined: held, reading paused
        splice.start(stream, early=b"first ")
        assert await target_r.readexactly(12) == b"first second"


async def test_idle_cuts_both_sides() -> None:
    async with (
        spliced_socket() as (splice, (client_r, _)),
        direct_stream() as (stream, (target_r, _)),
    ):
        splice.start(stream, idle_timeout_s=0.05)
        result = await asyncio.wait_for(splice.done, 10)
        assert result.end is SpliceEnd.IDLE and result.error is None
        assert await read_all_or_reset(client_r) is None  # an RST, never a clean end
        assert await read_all_or_reset(target_r) is None


async def test_activity_keeps_an_idle_timer_from_firing() -> None:
    async with (
        spliced_socket() as (splice, (_, client_w)),
        direct_stream() as (stream, (target_r, _)),
    ):
        splice.start(stream, idle_timeout_s=0.2)
        for _ in range(6):  # 0.3 s of traffic in all, never 0.2 s quiet
            client_w.write(b"x")
            await asyncio.sleep(0.05)
        assert not splice.done.done()
        assert await target_r.readexactly(6) == b"xxxxxx"
        splice.close()


async def test_a_reset_stream_fails_the_splice_and_cuts_the_socket() -> None:
    async with (
        spliced_socket() as (splice, (client_r, _)),
        direct_stream() as (stream, _),
    ):
        stream.reset(StreamCode.CANCELLED, "gone")
        splice.start(stream)
        splice.stream_reset(StreamResetError(StreamCode.CANCELLED, "gone"))
        result = await asyncio.wait_for(splice.done, 10)
        assert result.end is SpliceEnd.FAILED
        assert isinstance(result.error, StreamResetError)
        assert await read_all_or_reset(client_r) is None


async def test_the_target_breaking_reaches_the_socket_as_an_rst() -> None:
    async with (
        spliced_socket() as (splice, (client_r, _)),
        direct_stream() as (stream, (_, target_w)),
    ):
        splice.start(stream)
        target_w.write(b"partial")
        abort_with_rst(target_w.transport)
        result = await asyncio.wait_for(splice.done, 10)
        assert result.end is SpliceEnd.FAILED
        got = b""
        with pytest.raises(ConnectionResetError):
            while chunk := await asyncio.wait_for(client_r.read(1024), 10):
                got += chunk
        assert got in (b"", b"partial")


async def test_the_socket_breaking_resets_the_stream_with_its_code() -> None:
    async with (
        spliced_socket() as (splice, (_, client_w)),
        direct_stream() as (stream, (target_r, _)),
    ):
        splice.start(stream)
        abort_with_rst(client_w.transport)  # the client went away without a FIN
        result = await asyncio.wait_for(splice.done, 10)
        assert result.end is SpliceEnd.FAILED and isinstance(result.error, ConnectionError)
        assert await read_all_or_reset(target_r) is None  # the stream was reset: an RST


async def test_closing_a_running_splice_cuts_both_sides() -> None:
    async with (
        spliced_socket() as (splice, (client_r, _)),
        direct_stream() as (stream, (target_r, _)),
    ):
        splice.start(stream)
        splice.close()
        result = splice.done.result()
        assert result.end is SpliceEnd.FAILED
        assert isinstance(result.error, asyncio.CancelledError)
        assert await read_all_or_reset(client_r) is None
        assert await read_all_or_reset(target_r) is None
