"""Datagrams through two real Tunnels on loopback TCP: a lone datagram leaves in the same
loop turn (no call_soon round) and a lone read is handed on without the tunnel's after-I/O
pass (the datagram lane), a burst (a TUN read batch) shares one record and one write,
packets reach on_datagram straight from the receive path, and a handler may answer from
inside it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from raven.protocol.events import DatagramReceived, Event
from raven.transport.send_burst import SEND_BURST
from raven.transport.tunnel import Tunnel
from tests.helpers import wait_for
from tests.helpers.tunnel import TunnelPair


class Pair(TunnelPair):
    """Two Tunnels whose datagrams land in lists (and the gateway's events)."""

    def __init__(self) -> None:
        self.agent_got: list[bytes] = []
        self.gateway_got: list[bytes] = []
        self.gateway_events: list[Event] = []
        super().__init__(
            agent={"on_datagram": self.agent_got.append},
            gateway={
                "on_datagram": self.gateway_got.append,
                "on_event": lambda _tunnel, event: self.gateway_events.append(event),
            },
        )


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    p = Pair()
    await p.start()
    yield p
    await p.close()


def records_sent(tunnel: Tunnel) -> int:
    return tunnel.conn.stats.wire.records_sent


async def test_a_lone_datagram_is_written_in_the_same_loop_turn(pair: Pair) -> None:
    agent = pair.agent
    before = records_sent(agent)
    assert agent.send_datagram(b"\x45" + bytes(63))
    # no await since: the record was sealed and handed to the transport already
    assert records_sent(agent) == before + 1
    assert not agent.conn.has_data_to_send
    await wait_for(lambda: pair.gateway_got == [b"\x45" + bytes(63)])
    assert not any(isinstance(e, DatagramReceived) for e in pair.gateway_events)


async def test_a_lone_datagram_read_is_handed_on_without_the_after_io_pass(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The datagram lane on receive: a read of one record of one DATAGRAM frame reaches
    on_datagram, and the tunnel skips the events, flush and timer pass (nothing is due)."""
    gateway = pair.gateway
    passes: list[None] = []
    after_io = gateway._after_io
    monkeypatch.setattr(gateway, "_after_io", lambda: (passes.append(None), after_io())[1])
    for i in range(3):
        assert pair.agent.send_datagram(b"\x45" + bytes([i]) * 63)
        await wait_for(lambda i=i: len(pair.gateway_got) == i + 1)  # one read each
    assert passes == []
    assert gateway.conn.stats.datagrams_received == 3


async def test_a_burst_shares_one_record_written_when_it_ends(pair: Pair) -> None:
    agent = pair.agent
    before = records_sent(agent)
    packets = [b"\x45" + bytes([i]) * 100 for i in range(20)]
    with SEND_BURST:
        for packet in packets:
            assert agent.send_datagram(packet)
        assert records_sent(agent) == before  # held until the batch ends
    assert records_sent(agent) == before + 1
    await wait_for(lambda: len(pair.gateway_got) == 20)
    assert pair.gateway_got == packets


async def test_a_handler_may_answer_from_the_receive_path(pair: Pair) -> None:
    gateway = pair.gateway
    gateway.on_datagram = lambda packet: gateway.send_datagram(b"\x45re:" + packet[1:])
    for i in range(5):
        pair.agent.send_datagram(b"\x45" + bytes([i]))
    await wait_for(lambda: len(pair.agent_got) == 5)
    assert pair.agent_got == [b"\x45re:" + bytes([i]) for i in range(5)]


async def test_without_on_datagram_packets_are_events(pair: Pair) -> None:
    pair.gateway.on_datagram = None
    pair.agent.send_datagram(b"\x45event")
    await wait_for(lambda: DatagramReceived(b"\x45event") in pair.gateway_events)
    assert pair.gateway_got == []


async def test_a_closed_tunnel_drops_datagrams_without_trying_the_lane(pair: Pair) -> None:
    agent = pair.agent
    agent.close()
    assert agent.send_datagram(b"\x45late") is False
    assert agent.conn.stats.datagrams_sent == 0


async def _lane_both_ways() -> tuple[list[bytes], list[bytes], list[int]]:
    p = Pair()
    await p.start()
    try:
        records = [records_sent(p.agent)]
        for i in range(3):  # lone packets: the lane both ways, one read each
            assert p.agent.send_datagram(b"\x45up" + bytes([i]))
            await wait_for(lambda i=i: len(p.gateway_got) == i + 1)
            assert p.gateway.send_datagram(b"\x45down" + bytes([i]))
            await wait_for(lambda i=i: len(p.agent_got) == i + 1)
        records.append(records_sent(p.agent))
        with SEND_BURST:  # and a batch on the same tunnel: one record at its end
            for i in range(10):
                p.agent.send_datagram(b"\x45batch" + bytes([i]))
        records.append(records_sent(p.agent))
        await wait_for(lambda: len(p.gateway_got) == 13)
        return p.gateway_got, p.agent_got, records
    finally:
        await p.close()


def test_the_lane_on_uvloop_where_tunnels_read_the_plain_way() -> None:
    """The gateway (and an L3 agent) run on uvloop, where the tunnel is read through
    data_received (raven.transport.read_buffer): the same packets, in order, a record each
    for lone packets and one for a batch."""
    import uvloop

    up, down, records = uvloop.run(_lane_both_ways())
    assert up == [b"\x45up" + bytes([i]) for i in range(3)] + [
        b"\x45batch" + bytes([i]) for i in range(10)
    ]
    assert down == [b"\x45down" + bytes([i]) for i in range(3)]
    start, lone, batch = records
    assert (lone - start, batch - lone) == (3, 1)
