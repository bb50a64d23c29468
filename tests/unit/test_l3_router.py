"""The gateway router with a MemoryTun and recording sends: routing, cryptokey, drops, routes."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cloud_gateway.l3 import L3Router
from raven.l3 import parse_packet
from raven.l3.build import TCP_SYN, mss_option, tcp_packet, udp_packet
from raven.transport.netconfig import NetConfig
from raven.transport.tun import MemoryTun
from tests.helpers import sample
from tests.helpers.l3 import FakeIp, Sink

CLOUD = ipaddress.IPv4Address("10.1.0.2")
EDGE = ipaddress.IPv4Address("192.168.50.7")
CLOUD6 = ipaddress.IPv6Address("fd00:1::2")
EDGE6 = ipaddress.IPv6Address("fd00:50::7")
net = ipaddress.ip_network


async def make(mtu: int = 1380) -> tuple[L3Router, MemoryTun, CollectorRegistry]:
    reg = CollectorRegistry()
    tun = MemoryTun()
    router = L3Router(tun, reg, None, mtu)
    await router.start()
    return router, tun, reg


async def test_routes_by_longest_prefix_and_counts() -> None:
    router, tun, reg = await make()
    wide, narrow = Sink(), Sink()
    a = router.attach_agent("wide", [net("192.168.0.0/16")], wide)
    b = router.attach_agent("narrow", [net("192.168.50.0/24"), net("fd00:50::/64")], narrow)
    a.set_routes([net("192.168.0.0/16")])
    b.set_routes([net("192.168.50.0/24"), net("fd00:50::/64")])
    p1 = udp_packet(CLOUD, EDGE, 1, 2, b"to-narrow")
    p2 = udp_packet(CLOUD, ipaddress.IPv4Address("192.168.7.1"), 1, 2, b"to-wide")
    p3 = udp_packet(CLOUD6, EDGE6, 1, 2, b"v6")
    for p in (p1, p2, p3):
        tun.inject(p)
    assert narrow.packets == [p1, p3] and wide.packets == [p2]
    assert sample(reg, "raven_l3_packets_total", direction="to_agent", agent="narrow") == 2
    assert sample(reg, "raven_l3_bytes_total", direction="to_agent", agent="wide") == len(p2)
    assert router.routes() == {
        net("192.168.0.0/16"): ["wide"],
        net("192.168.50.0/24"): ["narrow"],
        net("fd00:50::/64"): ["narrow"],
    }
    await router.stop()


async def test_no_route_drops_and_answers_unreachable() -> None:
    _, tun, reg = await make()
    pkt = udp_packet(CLOUD, EDGE, 1, 2, b"nowhere")
    tun.inject(pkt)
    assert sample(reg, "raven_l3_drops_total", reason="no_route") == 1
    (icmp,) = tun.take_written()
    info = parse_packet(icmp)
    assert info.dst_address == CLOUD and icmp[20] == 3 and icmp[21] == 0


async def test_newest_port_wins_and_refcounted_routes() -> None:
    router, tun, _ = await make()
    old, new = Sink(), Sink()
    p_old = router.attach_agent("site", [net("192.168.50.0/24")], old)
    p_old.set_routes([net("192.168.50.0/24")])
    p_new = router.attach_agent("site", [net("192.168.50.0/24")], new)
    p_new.set_routes([net("192.168.50.0/24")])
    tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"a"))
    assert len(new.packets) == 1 and not old.packets
    p_new.detach()
    p_new.detach()  # idempotent
    tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"b"))
    assert len(old.packets) == 1
    assert router.ports == frozenset({p_old})


async def test_set_routes_refuses_unauthorised() -> None:
    router, _, _ = await make()
    port = router.attach_agent("site", [net("192.168.50.0/24")], Sink())
    routed = port.set_routes([net("192.168.50.128/25"), net("192.168.0.0/16"), net("10.0.0.0/8")])
    assert routed == frozenset({net("192.168.50.128/25")})
    assert list(router.routes()) == [net("192.168.50.128/25")]


async def test_cryptokey_routing_on_packets_from_agent() -> None:
    router, tun, reg = await make()
    port = router.attach_agent("site", [net("192.168.50.0/24"), net("192.168.60.0/24")], Sink())
    port.set_routes([net("192.168.50.0/24")])  # 60.0/24 authorised but not registered
    good = udp_packet(EDGE, CLOUD, 1, 2, b"ok")
    port.packet_from_agent(good)
    assert tun.take_written() == [good]
    for src in ("10.1.0.9", "192.168.60.1", "192.168.51.1"):
        port.packet_from_agent(udp_packet(ipaddress.IPv4Address(src), CLOUD, 1, 2, b"spoof"))
    port.packet_from_agent(udp_packet(ipaddress.IPv6Address("fd00:66::1"), CLOUD6, 1, 2, b"x"))
    port.packet_from_agent(b"\x45garbage")
    assert tun.take_written() == []
    assert sample(reg, "raven_l3_drops_total", reason="spoofed_source") == 4
    assert sample(reg, "raven_l3_drops_total", reason="malformed") == 1
    assert sample(reg, "raven_l3_packets_total", direction="from_agent", agent="site") == 1
    port.detach()
    port.packet_from_agent(good)
    assert tun.take_written() == []
    assert sample(reg, "raven_l3_drops_total", reason="spoofed_source") == 5
    with pytest.raises(RuntimeError):
        port.set_routes([net("192.168.50.0/24")])


async def test_full_tunnel_queue_is_a_counted_drop() -> None:
    router, tun, reg = await make()
    port = router.attach_agent("site", [net("192.168.50.0/24")], Sink(accept=False))
    port.set_routes([net("192.168.50.0/24")])
    for _ in range(5):
        tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"x"))
    assert sample(reg, "raven_l3_drops_total", reason="tunnel_queue_full") == 5
    assert sample(reg, "raven_l3_packets_total", direction="to_agent", agent="site") == 0


async def test_tun_write_failure_is_a_counted_drop() -> None:
    reg = CollectorRegistry()
    tun = MemoryTun(capacity=2)
    router = L3Router(tun, reg, None, 1380)
    port = router.attach_agent("site", [net("192.168.50.0/24")], Sink())
    port.set_routes([net("192.168.50.0/24")])
    for _ in range(3):
        port.packet_from_agent(udp_packet(EDGE, CLOUD, 1, 2, b"x"))
    assert tun.write_drops == 1
    assert sample(reg, "raven_l3_drops_total", reason="tun_write_failed") == 1


async def test_mtu_icmp_fragmentation_and_mss() -> None:
    router, tun, reg = await make(mtu=1280)
    sink = Sink()
    port = router.attach_agent("site", [net("192.168.50.0/24"), net("fd00:50::/64")], sink)
    port.set_routes([net("192.168.50.0/24"), net("fd00:50::/64")])
    tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"x" * 1400))  # DF: too big
    tun.inject(udp_packet(CLOUD6, EDGE6, 1, 2, b"x" * 1400))
    replies = tun.take_written()
    assert [r[20] if r[0] >> 4 == 4 else r[40] for r in replies] == [3, 2]
    assert sample(reg, "raven_l3_drops_total", reason="too_big") == 2
    tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"x" * 1400, dont_fragment=False))
    assert [len(p) for p in sink.packets] == [1276, 172]  # 1408 bytes of UDP: 1256 + 152
    sink.packets.clear()
    tun.inject(tcp_packet(CLOUD, EDGE, 1, 2, flags=TCP_SYN, options=mss_option(1460)))
    (syn,) = sink.packets
    assert int.from_bytes(syn[42:44], "big") == 1240
    syn_ack = tcp_packet(EDGE6, CLOUD6, 2, 1, flags=TCP_SYN | 0x10, options=mss_option(1440))
    port.packet_from_agent(syn_ack)
    (written,) = tun.take_written()
    assert int.from_bytes(written[62:64], "big") == 1220


async def test_icmp_is_rate_limited() -> None:
    reg = CollectorRegistry()
    tun = MemoryTun()
    router = L3Router(tun, reg, None, 1380, icmp_burst=3, icmp_rate_per_s=1, clock=lambda: 0.0)
    await router.start()
    for _ in range(10):
        tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"x"))
    assert len(tun.take_written()) == 3
    assert sample(reg, "raven_l3_drops_total", reason="no_route") == 10


async def test_kernel_routes_follow_ports() -> None:
    ip = FakeIp()
    netconfig = NetConfig(runner=ip)
    router = L3Router(MemoryTun("raven0"), CollectorRegistry(), netconfig, 1380)
    await router.start()
    pfx = net("192.168.50.0/24")
    a = router.attach_agent("site", [pfx, net("fd00:50::/64")], Sink())
    b = router.attach_agent("site", [pfx], Sink())
    a.set_routes([pfx, net("fd00:50::/64")])
    b.set_routes([pfx])
    await netconfig.settle()
    assert ip.commands == [
        ["ip", "-4", "route", "replace", "192.168.50.0/24", "dev", "raven0"],
        ["ip", "-6", "route", "replace", "fd00:50::/64", "dev", "raven0"],
    ]
    ip.commands.clear()
    a.detach()  # b still carries 192.168.50.0/24: only the v6 route goes
    await netconfig.settle()
    assert ip.commands == [["ip", "-6", "route", "del", "fd00:50::/64", "dev", "raven0"]]
    ip.commands.clear()
    b.set_routes([])
    await router.stop()
    assert ip.commands == [["ip", "-4", "route", "del", "192.168.50.0/24", "dev", "raven0"]]
    assert netconfig.failures == 0


async def test_route_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    ip = FakeIp()
    netconfig = NetConfig(runner=ip)
    router = L3Router(MemoryTun("raven0"), CollectorRegistry(), netconfig, 1380)
    port = router.attach_agent("site", [net("fd00:bad::/64")], Sink())
    port.set_routes([net("fd00:bad::/64")])
    port.detach()
    await netconfig.settle()
    assert netconfig.failures == 1
    assert "route change failed" in caplog.text


async def test_configure_commands() -> None:
    ip = FakeIp()
    await NetConfig(runner=ip).configure(
        "raven0", 1380, ["10.99.0.1/24", "fd00:99::1/64"], [net("10.1.0.0/24")]
    )
    assert ip.commands == [
        ["ip", "link", "set", "dev", "raven0", "mtu", "1380", "up"],
        ["ip", "-4", "addr", "replace", "10.99.0.1/24", "dev", "raven0"],
        ["ip", "-6", "addr", "replace", "fd00:99::1/64", "dev", "raven0"],
        ["ip", "-4", "route", "replace", "10.1.0.0/24", "dev", "raven0"],
    ]


async def test_gateway_setup_from_tun_config() -> None:
    from cloud_gateway.l3.setup import start_gateway_l3
    from raven.config.common import TunConfig

    ip = FakeIp()
    reg = CollectorRegistry()
    tun = MemoryTun("raven0")
    cfg = TunConfig(
        enabled=True, name="raven0", mtu=1380, addresses=["10.99.0.1/24"], routes=["10.98.0.0/16"]
    )
    l3 = await start_gateway_l3(cfg, reg, tun=tun, netconfig=NetConfig(runner=ip))
    assert ip.commands[0] == ["ip", "link", "set", "dev", "raven0", "mtu", "1380", "up"]
    assert ip.commands[-1] == ["ip", "-4", "route", "replace", "10.98.0.0/16", "dev", "raven0"]
    sink = Sink()
    port = l3.attach("site-a", ["192.168.50.0/24"], sink)  # strings, as the registry keeps them
    l3.ports["tunnel"] = port
    assert port.set_routes(["192.168.50.0/24", "10.0.0.0/8"]) == frozenset({net("192.168.50.0/24")})
    tun.inject(udp_packet(CLOUD, EDGE, 1, 2, b"x"))
    assert len(sink.packets) == 1
    await l3.stop()
    assert tun.closed and not port.attached and not l3.ports
    assert ip.commands[-1] == ["ip", "-4", "route", "del", "192.168.50.0/24", "dev", "raven0"]


async def test_gateway_setup_closes_tun_when_configuration_fails() -> None:
    from cloud_gateway.l3.setup import start_gateway_l3
    from raven.config.common import TunConfig
    from raven.transport.netconfig import NetConfigError

    async def failing(argv: Sequence[str]) -> tuple[int, str]:
        return 2, "RTNETLINK answers: Operation not permitted"

    tun = MemoryTun("raven0")
    with pytest.raises(NetConfigError, match="Operation not permitted"):
        await start_gateway_l3(
            TunConfig(enabled=True),
            CollectorRegistry(),
            tun=tun,
            netconfig=NetConfig(runner=failing),
        )
    assert tun.closed


@given(st.binary(max_size=120), st.sampled_from([4, 6]))
def test_fuzz_garbage_is_counted_never_raised(data: bytes, version: int) -> None:
    reg = CollectorRegistry()
    tun = MemoryTun()
    router = L3Router(tun, reg, None, 1380)
    tun.start(router._from_tun)
    port = router.attach_agent("site", [net("0.0.0.0/0"), net("::/0")], Sink())
    port.set_routes([net("0.0.0.0/0"), net("::/0")])
    mangled = bytes([(version << 4) | (data[0] & 0x0F), *data[1:]]) if data else data
    for packet in (data, mangled):
        tun.inject(packet)
        port.packet_from_agent(packet)
    outcomes = sum(
        reg.get_sample_value("raven_l3_drops_total", {"reason": r}) or 0
        for r in ("malformed", "no_route", "too_big", "spoofed_source")
    )
    carried = sum(
        reg.get_sample_value("raven_l3_packets_total", {"direction": d, "agent": "site"}) or 0
        for d in ("to_agent", "from_agent")
    )
    assert outcomes + carried == 4
