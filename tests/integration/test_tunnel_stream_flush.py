"""When a stream's bytes reach the wire: a large write from outside the tunnel's own receive
(a target's answer in the agent) is sealed and written at once, with no call_soon round; a
small one (a request head, credit) waits for the turn's one flush, shared with what else the
turn sends. Two real Tunnels on loopback TCP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from raven.transport.tunnel import IMMEDIATE_WRITE_BYTES, Tunnel, TunnelStream
from tests.helpers import wait_for
from tests.unit.test_connection import make_agent, make_gateway


class Pair:
    """A gateway Tunnel that opens a stream; an agent Tunnel that accepts and keeps it."""

    def __init__(self) -> None:
        self.gateway: Tunnel | None = None
        self.agent: Tunnel | None = None
        self.served: list[TunnelStream] = []
        self.server: asyncio.Server | None = None

    async def serve(self, stream: TunnelStream, node: str, port: int) -> None:
        stream.accept()
        self.served.append(stream)

    async def start(self) -> tuple[TunnelStream, TunnelStream]:
        loop = asyncio.get_running_loop()

        def gateway() -> Tunnel:
            self.gateway = Tunnel(make_gateway(now=time.monotonic()))
            return self.gateway

        self.server = await loop.create_server(gateway, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        _, self.agent = await loop.create_connection(
            lambda: Tunnel(make_agent(now=time.monotonic()), on_stream=self.serve),
            "127.0.0.1",
            port,
        )
        await self.agent.handshake
        await wait_for(lambda: self.gateway is not None)
        assert self.gateway is not None
        await self.gateway.handshake
        opened = await self.gateway.open_stream("edge-1", 9400, timeout_s=5)
        await wait_for(lambda: bool(self.served))
        return opened, self.served[0]

    async def close(self) -> None:
        for tunnel in (self.agent, self.gateway):
            if tunnel is not None:
                await tunnel.aclose()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def streams() -> AsyncIterator[tuple[Pair, TunnelStream, TunnelStream]]:
    pair = Pair()
    opened, served = await pair.start()
    try:
        yield pair, opened, served
    finally:
        await pair.close()


async def test_a_large_answer_is_written_in_the_same_call(
    streams: tuple[Pair, TunnelStream, TunnelStream],
) -> None:
    pair, opened, served = streams
    agent = pair.agent
    assert agent is not None
    await asyncio.sleep(0.05)  # the accept's flush is done
    before = agent.conn.stats.records_sent
    answer = b"x" * IMMEDIATE_WRITE_BYTES
    assert served.send_nowait(answer) == len(answer)
    # no await since: sealed and handed to the transport already
    assert agent.conn.stats.records_sent > before
    assert not agent.conn.has_data_to_send
    got = bytearray()
    while len(got) < len(answer):
        got += await asyncio.wait_for(opened.read(), 5)
    assert bytes(got) == answer


async def test_small_writes_share_the_turns_flush(
    streams: tuple[Pair, TunnelStream, TunnelStream],
) -> None:
    pair, opened, served = streams
    agent = pair.agent
    assert agent is not None
    await asyncio.sleep(0.05)
    before = agent.conn.stats.records_sent
    for i in range(5):
        served.send_nowait(b"head %d\n" % i)
    assert agent.conn.stats.records_sent == before  # waiting for the turn's flush
    assert agent.conn.has_data_to_send
    await asyncio.sleep(0)
    assert agent.conn.stats.records_sent == before + 1  # one record for the five
    got = bytearray()
    while len(got) < 35:
        got += await asyncio.wait_for(opened.read(), 5)
    assert bytes(got) == b"".join(b"head %d\n" % i for i in range(5))
