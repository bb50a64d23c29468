"""ICMP "too big"/"unreachable" packets: fields and checksums checked independently."""

from __future__ import annotations

import ipaddress

import pytest

from raven.l3 import IcmpRateLimiter, build_too_big, build_unreachable, parse_packet
from raven.l3.build import icmp_echo, ip_packet, tcp_packet, udp_packet
from raven.l3.packet import PROTO_ICMP, PROTO_ICMPV6
from tests.helpers.l3 import oracle_sum

A4 = ipaddress.IPv4Address("10.1.0.2")
B4 = ipaddress.IPv4Address("192.168.50.7")
A6 = ipaddress.IPv6Address("fd00:1::2")
B6 = ipaddress.IPv6Address("fd00:50::7")


def v6_pseudo(src: bytes, dst: bytes, length: int, proto: int) -> bytes:
    return src + dst + length.to_bytes(4, "big") + bytes((0, 0, 0, proto))


def test_ipv4_fragmentation_needed() -> None:
    original = udp_packet(A4, B4, 4000, 5000, b"x" * 1400)
    reply = build_too_big(original, parse_packet(original), 1380)
    assert reply is not None
    info = parse_packet(reply)
    assert (info.src_address, info.dst_address, info.protocol) == (B4, A4, PROTO_ICMP)
    assert len(reply) == 576  # RFC 1812: as much of the original as fits in 576 bytes
    assert oracle_sum(reply[:20]) == 0xFFFF  # IP header checksum
    icmp = reply[20:]
    assert (icmp[0], icmp[1]) == (3, 4)
    assert int.from_bytes(icmp[6:8], "big") == 1380
    assert oracle_sum(icmp) == 0xFFFF
    assert icmp[8:] == original[: len(icmp) - 8]


def test_ipv4_source_override_and_small_original() -> None:
    original = udp_packet(A4, B4, 1, 2, b"hi")
    reply = build_too_big(
        original, parse_packet(original), 600, int(ipaddress.ip_address("10.99.0.1"))
    )
    assert reply is not None
    assert parse_packet(reply).src_address == ipaddress.ip_address("10.99.0.1")
    assert reply[28:] == original


def test_ipv6_packet_too_big() -> None:
    original = tcp_packet(A6, B6, 4000, 5000, data=b"y" * 1500)
    reply = build_too_big(original, parse_packet(original), 1380)
    assert reply is not None
    info = parse_packet(reply)
    assert (info.src_address, info.dst_address, info.protocol) == (B6, A6, PROTO_ICMPV6)
    assert len(reply) == 1280
    icmp = reply[40:]
    assert (icmp[0], icmp[1]) == (2, 0)
    assert int.from_bytes(icmp[4:8], "big") == 1380
    assert oracle_sum(v6_pseudo(B6.packed, A6.packed, len(icmp), 58) + icmp) == 0xFFFF
    assert icmp[8:] == original[: len(icmp) - 8]


def test_ipv6_mtu_never_below_minimum() -> None:
    original = udp_packet(A6, B6, 1, 2, b"z" * 1300)
    reply = build_too_big(original, parse_packet(original), 1000)
    assert reply is not None
    assert int.from_bytes(reply[44:48], "big") == 1280


@pytest.mark.parametrize("src,dst", [(A4, B4), (A6, B6)])
def test_unreachable(
    src: ipaddress.IPv4Address | ipaddress.IPv6Address,
    dst: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    original = udp_packet(src, dst, 1, 2, b"q")
    reply = build_unreachable(original, parse_packet(original))
    assert reply is not None
    info = parse_packet(reply)
    icmp = reply[info.l4_offset :]
    if src.version == 4:
        assert (icmp[0], icmp[1]) == (3, 0) and oracle_sum(icmp) == 0xFFFF
    else:
        assert (icmp[0], icmp[1]) == (1, 0)
        assert oracle_sum(v6_pseudo(dst.packed, src.packed, len(icmp), 58) + icmp) == 0xFFFF


def test_no_error_about_errors_multicast_or_fragments() -> None:
    err = build_unreachable(
        udp_packet(A4, B4, 1, 2, b""), parse_packet(udp_packet(A4, B4, 1, 2, b""))
    )
    assert err is not None
    assert build_too_big(err, parse_packet(err), 576) is None  # about an ICMP error
    echo = icmp_echo(A4, B4, 1, 1, b"e" * 100)
    assert build_too_big(echo, parse_packet(echo), 100) is not None  # echo is not an error
    mcast = udp_packet(A4, ipaddress.IPv4Address("239.1.1.1"), 1, 2, b"")
    assert build_unreachable(mcast, parse_packet(mcast)) is None
    zero = udp_packet(ipaddress.IPv4Address("0.0.0.0"), B4, 1, 2, b"")
    assert build_unreachable(zero, parse_packet(zero)) is None
    err6 = build_unreachable(
        udp_packet(A6, B6, 1, 2, b""), parse_packet(udp_packet(A6, B6, 1, 2, b""))
    )
    assert err6 is not None and build_too_big(err6, parse_packet(err6), 1280) is None
    mcast6 = udp_packet(A6, ipaddress.IPv6Address("ff02::1"), 1, 2, b"")
    assert build_unreachable(mcast6, parse_packet(mcast6)) is None
    frag = bytearray(udp_packet(A4, B4, 1, 2, b"x" * 16, dont_fragment=False))
    frag[6:8] = (2).to_bytes(2, "big")
    assert build_too_big(bytes(frag), parse_packet(bytes(frag)), 576) is None
    frag6 = ip_packet(A6, B6, 44, bytes((17, 0, 0, 8, 0, 0, 0, 1)) + bytes(8))
    assert build_too_big(frag6, parse_packet(frag6), 1280) is None


def test_rate_limiter() -> None:
    limiter = IcmpRateLimiter(rate_per_s=10, burst=3)
    assert [limiter.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert limiter.allow(0.1)  # one token back after 0.1 s
    assert not limiter.allow(0.1)
    assert [limiter.allow(100.0) for _ in range(4)] == [True, True, True, False]
    with pytest.raises(ValueError):
        IcmpRateLimiter(0, 1)
