"""The agent forwarder with a MemoryTun: site-only delivery, paths, failover, drops."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from edge_agent.tun import TunForwarder
from raven.l3.build import TCP_SYN, mss_option, tcp_packet, udp_packet
from raven.transport.tun import MemoryTun
from tests.helpers import sample
from tests.helpers.l3 import Sink

CLOUD = ipaddress.IPv4Address("10.1.0.2")
EDGE = ipaddress.IPv4Address("192.168.50.7")
EDGE6 = ipaddress.IPv6Address("fd00:50::7")
CLOUD6 = ipaddress.IPv6Address("fd00:1::2")
SUBNETS = [ipaddress.ip_network("192.168.50.0/24"), ipaddress.ip_network("fd00:50::/64")]


async def make(failover_after: int = 32) -> tuple[TunForwarder, MemoryTun, CollectorRegistry]:
    reg = CollectorRegistry()
    tun = MemoryTun()
    fwd = TunForwarder(tun, reg, SUBNETS, 1380, agent="site-a", failover_after=failover_after)
    await fwd.start()
    return fwd, tun, reg


async def test_delivers_only_to_site_subnets() -> None:
    fwd, tun, reg = await make()
    path = fwd.add_path(Sink())
    good = udp_packet(CLOUD, EDGE, 1, 2, b"in")
    good6 = udp_packet(CLOUD6, EDGE6, 1, 2, b"in6")
    path.packet_from_gateway(good)
    path.packet_from_gateway(good6)
    path.packet_from_gateway(
        udp_packet(CLOUD, ipaddress.IPv4Address("10.9.9.9"), 1, 2, b"elsewhere")
    )
    path.packet_from_gateway(udp_packet(CLOUD, ipaddress.IPv4Address("192.168.51.1"), 1, 2, b"x"))
    path.packet_from_gateway(b"\x60\x00")
    assert tun.take_written() == [good, good6]
    assert sample(reg, "raven_l3_drops_total", reason="not_local_destination") == 2
    assert sample(reg, "raven_l3_drops_total", reason="malformed") == 1
    assert sample(reg, "raven_l3_packets_total", direction="to_agent", agent="site-a") == 2
    assert sample(reg, "raven_l3_bytes_total", direction="to_agent", agent="site-a") == len(
        good
    ) + len(good6)


async def test_sends_local_sources_through_first_path() -> None:
    fwd, tun, reg = await make()
    first, second = Sink(), Sink()
    fwd.add_path(first)
    fwd.add_path(second)
    out = udp_packet(EDGE, CLOUD, 1, 2, b"out")
    tun.inject(out)
    tun.inject(udp_packet(ipaddress.IPv4Address("172.16.0.1"), CLOUD, 1, 2, b"not ours"))
    assert first.packets == [out] and not second.packets
    assert sample(reg, "raven_l3_drops_total", reason="source_not_local") == 1
    assert sample(reg, "raven_l3_packets_total", direction="from_agent", agent="site-a") == 1


async def test_no_path_drops() -> None:
    fwd, tun, reg = await make()
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    path = fwd.add_path(Sink())
    path.remove()
    path.remove()
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    assert sample(reg, "raven_l3_drops_total", reason="no_path") == 2
    assert fwd.paths == ()


async def test_removed_path_falls_over_to_next() -> None:
    fwd, tun, _ = await make()
    first, second = Sink(), Sink()
    p1 = fwd.add_path(first)
    fwd.add_path(second)
    p1.remove()
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    assert not first.packets and len(second.packets) == 1


async def test_congested_path_fails_over_after_repeated_refusals() -> None:
    fwd, tun, reg = await make(failover_after=3)
    stuck, spare = Sink(accept=False), Sink()
    fwd.add_path(stuck)
    fwd.add_path(spare)
    for _ in range(5):
        tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    assert sample(reg, "raven_l3_drops_total", reason="tunnel_queue_full") == 3
    assert len(spare.packets) == 2
    assert fwd.paths[-1].send is stuck


async def test_single_congested_path_keeps_dropping() -> None:
    fwd, tun, reg = await make(failover_after=2)
    fwd.add_path(Sink(accept=False))
    for _ in range(6):
        tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    assert sample(reg, "raven_l3_drops_total", reason="tunnel_queue_full") == 6


async def test_too_big_icmp_and_mss_clamp() -> None:
    fwd, tun, reg = await make()
    sink = Sink()
    path = fwd.add_path(sink)
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x" * 1400))
    (icmp,) = tun.take_written()
    assert icmp[20:22] == b"\x03\x04" and int.from_bytes(icmp[26:28], "big") == 1380
    assert sample(reg, "raven_l3_drops_total", reason="too_big") == 1
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"x" * 1400, dont_fragment=False))
    assert len(sink.packets) == 2
    sink.packets.clear()
    tun.inject(tcp_packet(EDGE, CLOUD, 1, 2, flags=TCP_SYN, options=mss_option(1460)))
    assert int.from_bytes(sink.packets[0][42:44], "big") == 1340
    path.packet_from_gateway(
        tcp_packet(CLOUD6, EDGE6, 2, 1, flags=TCP_SYN, options=mss_option(1440))
    )
    assert int.from_bytes(tun.take_written()[0][62:64], "big") == 1320


async def test_stop_stops_reading() -> None:
    fwd, tun, _ = await make()
    sink = Sink()
    fwd.add_path(sink)
    await fwd.stop()
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"held"))
    assert not sink.packets
    await fwd.start()  # the twin holds packets while stopped, like the kernel's queue
    assert len(sink.packets) == 1


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        TunForwarder(MemoryTun(), CollectorRegistry(), SUBNETS, 500)
    with pytest.raises(ValueError):
        TunForwarder(MemoryTun(), CollectorRegistry(), SUBNETS, 1380, failover_after=0)


def test_memory_tun_contract() -> None:
    tun = MemoryTun("m0", capacity=2)
    assert tun.name == "m0" and not tun.started
    assert tun.write(b"a") and tun.write(b"b") and not tun.write(b"c")
    assert tun.write_drops == 1 and tun.take_written() == [b"a", b"b"]
    for p in (b"1", b"2", b"3"):
        tun.inject(p)
    assert tun.inject_drops == 1
    got: list[bytes] = []
    tun.start(got.append)
    assert got == [b"1", b"2"] and tun.started
    routed: list[bytes] = []
    tun.on_write = routed.append
    assert tun.write(b"x") and routed == [b"x"] and not tun.written
    tun.close()
    assert not tun.write(b"y") and tun.write_drops == 2
    with pytest.raises(RuntimeError):
        tun.start(got.append)


class FakeTunnel:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.on_datagram: Callable[[bytes], None] | None = None

    def send_datagram(self, data: bytes) -> bool:
        self.sent.append(data)
        return True


async def test_agent_setup_follows_tunnels_of_links() -> None:
    from edge_agent.tun.setup import start_agent_l3
    from raven.config.common import TunConfig
    from raven.transport.netconfig import NetConfig
    from tests.helpers.l3 import FakeIp

    ip = FakeIp()
    tun = MemoryTun("raven0")
    cfg = TunConfig(enabled=True, name="raven0", routes=["10.1.0.0/24", "fd00:1::/64"])
    reg = CollectorRegistry()
    l3 = await start_agent_l3(
        cfg, ["192.168.50.0/24"], reg, agent="site-a", tun=tun, netconfig=NetConfig(runner=ip)
    )
    assert ["ip", "-6", "route", "replace", "fd00:1::/64", "dev", "raven0"] in ip.commands
    replica_a, replica_b = FakeTunnel(), FakeTunnel()
    l3.tunnel_changed("link-a", replica_a)
    l3.tunnel_changed("link-b", replica_b)
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"1"))
    l3.tunnel_changed("link-a", None)  # replica a's tunnel dropped
    tun.inject(udp_packet(EDGE, CLOUD, 1, 2, b"2"))
    assert len(replica_a.sent) == 1 and len(replica_b.sent) == 1
    l3.packet_from_gateway(udp_packet(CLOUD, EDGE, 2, 1, b"down"))
    assert len(tun.take_written()) == 1
    # each tunnel hands its packets straight to the forwarder (no hop through the app)
    assert replica_b.on_datagram == l3.forwarder.packet_from_gateway
    replica_b.on_datagram(udp_packet(CLOUD, EDGE, 2, 1, b"down"))
    assert len(tun.take_written()) == 1
    await l3.stop()
    assert tun.closed and l3.forwarder.paths == ()
