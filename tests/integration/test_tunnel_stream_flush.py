"""When a stream's bytes reach the wire: a large write from outside the tunnel's own receive
(a target's answer in the agent) is sealed and written at once, with no call_soon round; a
small one (a request head, credit) waits for the turn's one flush, shared with what else the
turn sends. Two real Tunnels on loopback TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from raven.transport.tunnel import IMMEDIATE_WRITE_BYTES, Tunnel, TunnelStream
from tests.helpers import wait_for
from tests.helpers.tunnel import TunnelPair


class Pair(TunnelPair):
    """The gateway opens a stream; the agent accepts it and keeps it in ``served``."""

    def __init__(self) -> None:
        self.served: list[TunnelStream] = []
        super().__init__(agent={"on_stream": self.serve})

    async def serve(self, stream: TunnelStream, node: str, port: int) -> None:
        stream.accept()
        self.served.append(stream)


@pytest.fixture
async def streams() -> AsyncIterator[tuple[Tunnel, TunnelStream, TunnelStream]]:
    """(the agent's Tunnel, the gateway's stream, the agent's end of it), the OPEN's
    answer already flushed."""
    pair = Pair()
    await pair.start()
    try:
        opened = await pair.gateway.open_stream("edge-1", 9400, timeout_s=5)
        await wait_for(lambda: bool(pair.served))
        await asyncio.sleep(0.05)  # the accept's flush is done
        yield pair.agent, opened, pair.served[0]
    finally:
        await pair.close()


async def read_exactly(stream: TunnelStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        got += await asyncio.wait_for(stream.read(), 5)
    return bytes(got)


async def test_a_large_answer_is_written_in_the_same_call(
    streams: tuple[Tunnel, TunnelStream, TunnelStream],
) -> None:
    agent, opened, served = streams
    before = agent.conn.stats.wire.records_sent
    answer = b"x" * IMMEDIATE_WRITE_BYTES
    assert served.send_nowait(answer) == len(answer)
    # no await since: sealed and handed to the transport already
    assert agent.conn.stats.wire.records_sent > before
    assert not agent.conn.has_data_to_send
    assert await read_exactly(opened, len(answer)) == answer


async def test_small_writes_share_the_turns_flush(
    streams: tuple[Tunnel, TunnelStream, TunnelStream],
) -> None:
    agent, opened, served = streams
    before = agent.conn.stats.wire.records_sent
    heads = [b"head %d\n" % i for i in range(5)]
    for head in heads:
        served.send_nowait(head)
    assert agent.conn.stats.wire.records_sent == before  # waiting for the turn's flush
    assert agent.conn.has_data_to_send
    await asyncio.sleep(0)
    assert agent.conn.stats.wire.records_sent == before + 1  # one record for the five
    assert await read_exactly(opened, len(b"".join(heads))) == b"".join(heads)
