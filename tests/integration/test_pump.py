"""The shared byte pump over loopback: a DirectStream (the tunnel stream's in-memory twin,
plain TCP) on one side, a TCP connection on the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from raven.protocol.codes import StreamCode
from raven.transport.direct import DirectOpener
from raven.transport.pump import PumpEnd, pump
from raven.transport.stream import ByteStream, StreamResetError

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[Conn, Conn]]:
    """Two ends of one loopback TCP connection."""
    accepted: asyncio.Queue[Conn] = asyncio.Queue()

    async def on_client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await accepted.put((r, w))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.open_connection("127.0.0.1", port)
    served = await accepted.get()
    try:
        yield client, served
    finally:
        for _, w in (client, served):
            w.close()
        server.close()
        await server.wait_closed()


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
        await stream.aclose()
        target[1].close()
        server.close()
        await server.wait_closed()


async def test_both_directions_half_close_early_bytes_and_hooks() -> None:
    seen_up: list[bytes] = []
    seen_down: list[bytes] = []
    pair, target = tcp_pair(), direct_stream()
    async with (
        pair as ((client_r, client_w), (sock_r, sock_w)),
        target as (stream, (target_r, target_w)),
    ):
        task = asyncio.create_task(pump(stream, sock_r, sock_w, chunk_bytes=4, early=b"GET ",
                                        on_to_stream=seen_up.append,
                                        on_to_socket=seen_down.append))  # fmt: skip
        client_w.write(b"/metrics")
        client_w.write_eof()
        assert await target_r.read() == b"GET /metrics"  # EOF passed on, other way open
        target_w.write(b"up 1\n")
        target_w.write_eof()
        assert await client_r.read() == b"up 1\n"
        result = await task
    assert result.end is PumpEnd.DONE and result.error is None
    assert (result.to_stream_bytes, result.to_socket_bytes) == (12, 5)
    assert b"".join(seen_up) == b"GET /metrics" and b"".join(seen_down) == b"up 1\n"
    assert all(chunk and len(chunk) <= 8 for chunk in seen_up + seen_down)


async def test_idle_ends_the_pump_without_closing_anything() -> None:
    async with tcp_pair() as (_, (sock_r, sock_w)), direct_stream() as (stream, _target):
        result = await pump(stream, sock_r, sock_w, chunk_bytes=1024, idle_timeout_s=0.05)
        assert result.end is PumpEnd.IDLE and result.error is None
        assert not sock_w.is_closing()


async def test_a_reset_stream_is_reported_as_the_error() -> None:
    async with tcp_pair() as ((_, client_w), (sock_r, sock_w)), direct_stream() as (stream, _):
        stream.reset(StreamCode.CANCELLED, "gone")
        client_w.write(b"x")
        result = await pump(stream, sock_r, sock_w, chunk_bytes=1024)
    assert result.end is PumpEnd.FAILED
    assert isinstance(result.error, StreamResetError)


async def test_cancelling_the_pump_cancels_both_directions() -> None:
    async with tcp_pair() as (_, (sock_r, sock_w)), direct_stream() as (stream, _):
        task = asyncio.create_task(pump(stream, sock_r, sock_w, chunk_bytes=1024))
        await asyncio.sleep(0.02)
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
