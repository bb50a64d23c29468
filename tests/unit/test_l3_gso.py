"""Software TCP segmentation and super-packets on the router and forwarder."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cloud_gateway.l3 import L3Router
from edge_agent.tun import TunForwarder
from raven.l3 import parse_packet
from raven.l3.build import TCP_ACK, tcp_packet, udp_packet
from raven.l3.gso import MAX_SUPER_PACKET_BYTES, complete_checksum, segment_tcp, split_super_packet
from raven.transport.tun import MemoryTun, write_packet
from tests.helpers.l3 import Sink, oracle_sum, tcp_checksum_ok

A4 = ipaddress.IPv4Address("10.1.0.2")
B4 = ipaddress.IPv4Address("192.168.50.7")
A6 = ipaddress.IPv6Address("fd00:1::2")
B6 = ipaddress.IPv6Address("fd00:50::7")
SITE = [ipaddress.ip_network("192.168.50.0/24"), ipaddress.ip_network("fd00:50::/64")]
FIN, PSH, CWR = 0x01, 0x08, 0x80


def reassemble(pieces: list[bytes]) -> tuple[int, bytes]:
    first = parse_packet(pieces[0])
    seq0 = int.from_bytes(pieces[0][first.l4_offset + 4 : first.l4_offset + 8], "big")
    data = b""
    for p in pieces:
        info = parse_packet(p)
        thl = (p[info.l4_offset + 12] >> 4) * 4
        seq = int.from_bytes(p[info.l4_offset + 4 : info.l4_offset + 8], "big")
        assert seq == (seq0 + len(data)) & 0xFFFFFFFF
        data += p[info.l4_offset + thl :]
    return seq0, data


@pytest.mark.parametrize(("src", "dst"), [(A4, B4), (A6, B6)])
def test_segment_tcp_cuts_and_fixes_everything(
    src: ipaddress.IPv4Address | ipaddress.IPv6Address,
    dst: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    payload = bytes(range(256)) * 40  # 10240 bytes
    flags = TCP_ACK | PSH | FIN | CWR
    big = tcp_packet(
        src,
        dst,
        40000,
        5201,
        flags=flags,
        data=payload,
        seq=0xFFFFF000,
        options=b"\x01\x01\x08\x0a" + bytes(8),
    )
    pieces = segment_tcp(big, parse_packet(big), 1328)
    assert len(pieces) == 8
    for i, p in enumerate(pieces):
        info = parse_packet(p)  # lengths consistent
        assert tcp_checksum_ok(p)
        if src.version == 4:
            assert oracle_sum(p[:20]) == 0xFFFF and int.from_bytes(p[4:6], "big") == i
        f = p[info.l4_offset + 13]
        assert bool(f & (FIN | PSH)) == (i == 7) and bool(f & CWR) == (i == 0) and f & TCP_ACK
    seq0, data = reassemble(pieces)
    assert seq0 == 0xFFFFF000 and data == payload  # the sequence number wrapped


def test_segment_tcp_leaves_small_packets_and_refuses_others() -> None:
    small = tcp_packet(A4, B4, 1, 2, data=b"x" * 100)
    assert segment_tcp(small, parse_packet(small), 1000) == [small]
    udp = udp_packet(A4, B4, 1, 2, b"x" * 3000)
    with pytest.raises(ValueError):
        segment_tcp(udp, parse_packet(udp), 1000)
    with pytest.raises(ValueError):
        segment_tcp(small, parse_packet(small), 0)


@given(st.integers(1, 6000), st.integers(64, 1500), st.booleans())
def test_segment_tcp_fuzz(size: int, mss: int, v6: bool) -> None:
    src, dst = (A6, B6) if v6 else (A4, B4)
    payload = bytes(i % 251 for i in range(size))
    big = tcp_packet(src, dst, 1, 2, data=payload, seq=7)
    pieces = segment_tcp(big, parse_packet(big), mss)
    assert all(tcp_checksum_ok(p) for p in pieces)
    assert reassemble(pieces) == (7, payload)
    assert all(len(p) - (len(big) - size) <= mss for p in pieces)


def test_split_super_packet_keeps_whole_segments() -> None:
    big = tcp_packet(A4, B4, 1, 2, data=b"z" * 65000)  # 65040 bytes, over the datagram limit
    pieces = split_super_packet(big, parse_packet(big), 1380, MAX_SUPER_PACKET_BYTES)
    assert len(pieces) == 2 and all(len(p) <= MAX_SUPER_PACKET_BYTES for p in pieces)
    assert (len(pieces[0]) - 40) % 1340 == 0
    assert reassemble(pieces)[1] == b"z" * 65000


def test_complete_checksum_from_partial() -> None:
    pkt = bytearray(tcp_packet(A4, B4, 1, 2, data=b"partial"))
    info = parse_packet(bytes(pkt))
    from raven.l3.gso import partial_tcp_checksum

    partial_tcp_checksum(pkt, info)  # what the kernel hands over with NEEDS_CSUM
    assert not tcp_checksum_ok(bytes(pkt))
    complete_checksum(pkt, info.l4_offset, 16, 6)
    assert tcp_checksum_ok(bytes(pkt))


def test_write_packet_segments_for_a_device_without_offload() -> None:
    big = tcp_packet(A4, B4, 1, 2, data=b"q" * 5000)
    plain, offloading = MemoryTun(), MemoryTun(offload=True)
    assert write_packet(plain, big, parse_packet(big), 1380)
    assert [len(p) for p in plain.written] == [1380, 1380, 1380, 1020]  # 3 x 1340 + 980
    assert write_packet(offloading, big, parse_packet(big), 1380)
    assert list(offloading.written) == [big]


async def test_router_and_forwarder_carry_super_packets() -> None:
    gw_tun, ag_tun = MemoryTun(offload=True), MemoryTun()  # the agent's TUN has no offload
    router = L3Router(gw_tun, CollectorRegistry(), None, 1380)
    fwd = TunForwarder(ag_tun, CollectorRegistry(), SITE, 1380)
    sink = Sink()
    down = sink.packets
    port = router.attach_agent("site-a", SITE, sink)
    port.set_routes(SITE)
    up = Sink()
    fwd.add_path(up)
    await router.start()
    await fwd.start()
    big = tcp_packet(A4, B4, 1, 2, data=b"d" * 20000)
    gw_tun.inject(big)
    assert down == [big]  # one datagram, not 15
    fwd.packet_from_gateway(down[0])
    assert reassemble(ag_tun.take_written())[1] == b"d" * 20000  # software GSO on write
    huge = tcp_packet(A6, B6, 1, 2, data=b"h" * 65000)
    gw_tun.inject(huge)
    assert [len(p) <= MAX_SUPER_PACKET_BYTES for p in down[1:]] == [True, True]
    # Without offload on the reading side, an oversized packet is "too big", never sent.
    ag_tun.inject(tcp_packet(B4, A4, 2, 1, data=b"u" * 5000))
    assert up.packets == [] and parse_packet(ag_tun.take_written()[0]).protocol == 1
