"""Gateway router and agent forwarder wired back to back through plain callables.

Two MemoryTuns play the kernels of the cloud gateway node and the edge agent node; a
bounded queue between them plays the tunnel's datagram queue (send() -> False when full).
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress

from prometheus_client import CollectorRegistry

from cloud_gateway.l3 import L3Router
from edge_agent.tun import TunForwarder
from raven.l3 import parse_packet
from raven.l3.build import TCP_SYN, icmp_echo, mss_option, tcp_packet, udp_packet
from raven.transport.tun import MemoryTun

CLOUD = ipaddress.IPv4Address("10.1.0.2")
EDGE = ipaddress.IPv4Address("192.168.50.7")
CLOUD6 = ipaddress.IPv6Address("fd00:1::2")
EDGE6 = ipaddress.IPv6Address("fd00:50::7")
SITE = [ipaddress.ip_network("192.168.50.0/24"), ipaddress.ip_network("fd00:50::/64")]


class DatagramQueue:
    """A bounded queue like the tunnel's: put() never blocks, False when full."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: collections.deque[bytes] = collections.deque()

    def put(self, packet: bytes) -> bool:
        if len(self.items) >= self.limit:
            return False
        self.items.append(packet)
        return True


class Wiring:
    def __init__(self, limit: int = 1024) -> None:
        self.gw_reg, self.ag_reg = CollectorRegistry(), CollectorRegistry()
        self.gw_tun, self.ag_tun = MemoryTun("gw0"), MemoryTun("ag0")
        self.router = L3Router(self.gw_tun, self.gw_reg, None, 1380)
        self.fwd = TunForwarder(self.ag_tun, self.ag_reg, SITE, 1380, agent="site-a")
        self.down = DatagramQueue(limit)  # gateway -> agent
        self.up = DatagramQueue(limit)  # agent -> gateway
        self.port = self.router.attach_agent("site-a", SITE, self.down.put)
        self.path = self.fwd.add_path(self.up.put)
        self.port.set_routes(SITE)

    async def start(self) -> None:
        await self.router.start()
        await self.fwd.start()

    def pump(self) -> None:
        while self.down.items:
            self.path.packet_from_gateway(self.down.items.popleft())
        while self.up.items:
            self.port.packet_from_agent(self.up.items.popleft())

    def gw(self, name: str, **labels: str) -> float:
        return self.gw_reg.get_sample_value(name, labels) or 0.0


async def test_packets_cross_both_ways_v4_and_v6() -> None:
    w = Wiring()
    await w.start()
    ping = icmp_echo(CLOUD, EDGE, 7, 1, b"ping")
    w.gw_tun.inject(ping)
    w.gw_tun.inject(udp_packet(CLOUD6, EDGE6, 5000, 5001, b"v6 down"))
    w.pump()
    assert w.ag_tun.take_written() == [ping, udp_packet(CLOUD6, EDGE6, 5000, 5001, b"v6 down")]
    reply = udp_packet(EDGE, CLOUD, 5001, 5000, b"up")
    w.ag_tun.inject(reply)
    w.ag_tun.inject(udp_packet(EDGE6, CLOUD6, 5001, 5000, b"v6 up"))
    w.pump()
    assert w.gw_tun.take_written() == [reply, udp_packet(EDGE6, CLOUD6, 5001, 5000, b"v6 up")]
    assert w.gw("raven_l3_packets_total", direction="to_agent", agent="site-a") == 2
    assert w.gw("raven_l3_packets_total", direction="from_agent", agent="site-a") == 2
    ag_sent = w.ag_reg.get_sample_value(
        "raven_l3_packets_total", {"direction": "from_agent", "agent": "site-a"}
    )
    assert ag_sent == 2


async def test_tcp_handshake_is_clamped_both_ways() -> None:
    w = Wiring()
    await w.start()
    w.gw_tun.inject(tcp_packet(CLOUD, EDGE, 40000, 9100, flags=TCP_SYN, options=mss_option(8960)))
    w.pump()
    (syn,) = w.ag_tun.take_written()
    assert int.from_bytes(syn[42:44], "big") == 1340
    w.ag_tun.inject(
        tcp_packet(EDGE6, CLOUD6, 9100, 40000, flags=TCP_SYN | 0x10, options=mss_option(8940))
    )
    w.pump()
    (syn_ack,) = w.gw_tun.take_written()
    assert int.from_bytes(syn_ack[62:64], "big") == 1320


async def test_spoofed_source_from_agent_is_dropped_and_counted() -> None:
    w = Wiring()
    await w.start()
    # A compromised agent puts a packet with a foreign source straight on its tunnel.
    spoofed = udp_packet(ipaddress.IPv4Address("10.1.0.99"), CLOUD, 53, 53, b"evil")
    assert w.up.put(spoofed)
    w.pump()
    assert w.gw_tun.take_written() == []
    assert w.gw("raven_l3_drops_total", reason="spoofed_source") == 1
    # The honest forwarder never even sends it.
    w.ag_tun.inject(spoofed)
    assert not w.up.items
    assert w.ag_reg.get_sample_value("raven_l3_drops_total", {"reason": "source_not_local"}) == 1


async def test_oversized_packet_gets_icmp_on_its_own_side() -> None:
    w = Wiring()
    await w.start()
    big = udp_packet(CLOUD, EDGE, 1, 2, b"x" * 1500)
    w.gw_tun.inject(big)
    w.pump()
    assert w.ag_tun.take_written() == []
    (icmp,) = w.gw_tun.take_written()
    info = parse_packet(icmp)
    assert info.dst_address == CLOUD and icmp[20:22] == b"\x03\x04"


async def test_queue_overflow_drops_without_blocking() -> None:
    w = Wiring(limit=64)
    await w.start()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:  # stands in for L7 streams sharing the loop
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def drain() -> None:  # the tunnel writer: 16 packets per loop turn
        while not stop.is_set():
            for _ in range(16):
                if w.down.items:
                    w.path.packet_from_gateway(w.down.items.popleft())
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(drain())]
    sent = 5000
    pkt = udp_packet(CLOUD, EDGE, 1, 2, b"flood")
    for i in range(sent):
        w.gw_tun.inject(pkt)  # returns at once whether queued or dropped
        if i % 100 == 99:
            await asyncio.sleep(0)
    while w.down.items:
        await asyncio.sleep(0)
    stop.set()
    await asyncio.gather(*tasks)
    delivered = len(w.ag_tun.take_written()) + w.ag_tun.write_drops
    dropped = w.gw("raven_l3_drops_total", reason="tunnel_queue_full")
    assert dropped > 0 and delivered > 0
    assert delivered + dropped == sent
    assert w.gw("raven_l3_packets_total", direction="to_agent", agent="site-a") == delivered
    assert ticks >= 50  # the loop kept turning while L3 was saturated


async def test_agent_reconnect_moves_routes_to_new_port() -> None:
    w = Wiring()
    await w.start()
    w.port.detach()
    w.path.remove()
    w.gw_tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"lost"))
    assert w.gw("raven_l3_drops_total", reason="no_route") == 1
    w.gw_tun.take_written()  # the ICMP unreachable
    port = w.router.attach_agent("site-a", SITE, w.down.put)
    port.set_routes(SITE)
    path = w.fwd.add_path(w.up.put)
    w.port, w.path = port, path
    w.gw_tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"back"))
    w.ag_tun.inject(udp_packet(EDGE, CLOUD, 2, 1, b"back up"))
    w.pump()
    assert len(w.ag_tun.take_written()) == 1 and len(w.gw_tun.take_written()) == 1
