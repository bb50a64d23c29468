"""The agent's callback relay (raven/transport/splice.py as the target connection's protocol)
on loopback: flow control both ways, an RST to the target on reset, the first bytes riding
with OPEN."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from raven.protocol.codes import StreamCode
from raven.transport.reset import abort_with_rst
from raven.transport.splice import SOCKET_WRITE_HIGH_WATER_BYTES, Splice
from raven.transport.stream import OpenFailure, StreamOpenError, StreamResetError
from raven.transport.tunnel_stream import TunnelStream
from tests.helpers import wait_for
from tests.helpers.tunnel import LIMITS, Site, echo_port

NODE = "edge-relay-1"


def agent_leg(site: Site) -> Splice:
    """The one target leg the agent relays right now."""
    (stream,) = site.relays[0].active
    leg = stream.receiver
    assert isinstance(leg, Splice)
    return leg


def owed(leg: Splice) -> int:
    """Bytes the target's transport holds whose credit the agent keeps back."""
    return 0 if leg._credit is None else leg._credit.owed


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def driven_target() -> AsyncIterator[tuple[asyncio.Server, asyncio.Future[Connection]]]:
    """A target whose connection the test drives itself (handed over through the future),
    closed at the end."""
    conn: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not conn.done():  # a plain callback: no task behind the connection
            conn.set_result((reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server, conn
    finally:
        server.close()


async def open_to(site: Site, server: asyncio.Server, data: bytes = b"") -> TunnelStream:
    port = int(server.sockets[0].getsockname()[1])
    await site.start({NODE: "127.0.0.1"}, [port])
    await wait_for(lambda: site.registry.agents_for(NODE))
    return await site.registry.open_stream(NODE, port, timeout_s=5, data=data)


async def test_slow_target_reader_holds_the_gateway_back(site: Site) -> None:
    async with driven_target() as (server, conn):
        stream = await open_to(site, server)
        await conn  # the target never reads
        window = LIMITS.stream_window_bytes
        total = 64 * 1024 * 1024  # far beyond the kernel's socket buffers and the window
        writer = asyncio.create_task(stream.write(b"x" * total))
        await wait_for(lambda: owed(agent_leg(site)) > 0, "the target's buffer to fill")
        await wait_for(lambda: stream._tunnel.send_capacity(stream.stream_id) == 0, "no credit")
        leg = agent_leg(site)
        assert leg.transport is not None
        # the agent holds at most the target's buffer and one window; the gateway waits
        assert leg.transport.get_write_buffer_size() <= SOCKET_WRITE_HIGH_WATER_BYTES + window
        assert not writer.done()
        writer.cancel()
        stream.reset(StreamCode.CANCELLED, "test over")


async def test_slow_gateway_reader_pauses_the_target_read(site: Site) -> None:
    async with driven_target() as (server, conn):
        stream = await open_to(site, server)
        _, target = await conn

        async def feed() -> None:  # the target writes as fast as the agent takes it
            while True:
                target.write(b"y" * 65536)
                full = target.transport.get_write_buffer_size() > 1024 * 1024
                await asyncio.sleep(0.005 if full else 0)

        feeder = asyncio.create_task(feed())
        await wait_for(lambda: agent_leg(site)._reading_paused, "the agent to stop reading")
        leg = agent_leg(site)
        window = LIMITS.stream_window_bytes
        # the gateway holds at most the window, the agent at most one read beyond the credit
        assert sum(len(c) for c in stream._inbox.chunks) <= window
        assert len(leg._pending) <= 256 * 1024
        resumed: list[bool] = []
        resume = leg._resume_reading

        def counted_resume() -> None:  # the leg pauses again within a poll interval: count
            resumed.append(leg._reading_paused)
            resume()

        leg._resume_reading = counted_resume  # type: ignore[method-assign]
        got = 0
        while got < 2 * window:  # reading the stream lets the target's bytes flow again
            got += len(await stream.read())
        await wait_for(lambda: any(resumed), "reading resumed")
        feeder.cancel()
        stream.reset(StreamCode.CANCELLED, "test over")
        target.close()


async def test_reset_by_the_gateway_aborts_the_target_with_rst(site: Site) -> None:
    async with driven_target() as (server, conn):
        stream = await open_to(site, server, data=b"hello")
        reader, writer = await conn
        assert await reader.readexactly(5) == b"hello"
        stream.reset(StreamCode.CANCELLED, "client went away")
        try:
            rest = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:
            rest = None
        assert rest is None, "the target saw a clean close, not an RST"
        await wait_for(lambda: not site.relays[0].active, "the relay to let go")
        writer.close()


async def test_request_rides_with_open_no_data_frame_needed(site: Site) -> None:
    port = echo_port(site)
    await site.start({NODE: "127.0.0.1"}, [port])
    await wait_for(lambda: site.registry.agents_for(NODE))
    (link,) = site.links
    assert link.tunnel is not None
    stats = link.tunnel.conn.stats
    data_before = stats.frames_received.get("data", 0)
    opens_before = stats.frames_received.get("open", 0)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    stream = await site.registry.open_stream(NODE, port, timeout_s=5, data=request)
    await stream.write_eof()
    echoed = b""
    while chunk := await stream.read():
        echoed += chunk
    assert echoed == request  # the target got the bytes the OPEN carried
    assert stats.frames_received.get("open", 0) == opens_before + 1
    assert stats.frames_received.get("data", 0) == data_before  # no DATA frame: one trip less


async def test_half_close_both_ways_through_the_callback_relay(site: Site) -> None:
    async with driven_target() as (server, conn):
        stream = await open_to(site, server, data=b"request")
        reader, writer = await conn
        await stream.write_eof()
        assert await reader.read() == b"request"  # END arrives as the target's EOF
        writer.write(b"answer after the request ended")
        writer.write_eof()
        got = b""
        while chunk := await stream.read():
            got += chunk
        assert got == b"answer after the request ended"
        await wait_for(lambda: not site.relays[0].active, "the relay to end")
        writer.close()


async def test_target_breaking_resets_the_stream_and_the_relay_holds_no_task(site: Site) -> None:
    async with driven_target() as (server, conn):
        stream = await open_to(site, server, data=b"GET / HTTP/1.1\r\n\r\n")
        _, target = await conn
        (link,) = site.links
        assert link.tunnel is not None
        assert not link.tunnel.streams.handlers_running  # relaying, with no task behind the stream
        target.write(b"HTTP/1.1 200 OK\r\n")
        assert await stream.read() == b"HTTP/1.1 200 OK\r\n"
        abort_with_rst(target.transport)
        with pytest.raises(StreamResetError) as reset:
            await stream.read()
        assert reset.value.code is StreamCode.TARGET_RESET
        await wait_for(lambda: not site.relays[0].active, "the relay to let go")


async def test_refused_opens_with_data_fail_as_without(site: Site) -> None:
    port = echo_port(site)
    await site.start({NODE: "127.0.0.1", "edge-dead-1": "127.0.0.1"}, [port, 1])
    await wait_for(lambda: site.registry.agents_for(NODE))
    request = b"GET /metrics HTTP/1.1\r\n\r\n"
    for node, target_port, failure in [
        ("edge-dead-1", 1, OpenFailure.TARGET_REFUSED),
        (NODE, 2 if port != 2 else 3, OpenFailure.PORT_NOT_ALLOWED),
        ("edge-nope-1", port, OpenFailure.UNKNOWN_NODE),
    ]:
        with pytest.raises(StreamOpenError) as refused:
            await site.registry.open_stream(node, target_port, timeout_s=5, data=request)
        assert refused.value.reason is failure
    (link,) = site.links
    assert link.tunnel is not None
    assert link.tunnel.conn.buffered_bytes == 0  # the refused OPENs' data was let go
