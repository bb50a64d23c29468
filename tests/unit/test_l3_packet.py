"""IP header parsing: fields, every refusal, fuzz (parses or MalformedPacket), checksums."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.l3 import MalformedPacket, PacketInfo, parse_packet
from raven.l3.build import TCP_SYN, icmp_echo, ip_packet, tcp_packet, udp_packet
from raven.l3.checksum import internet_checksum, ones_sum, pseudo_header_sum
from raven.l3.packet import PROTO_ICMPV6, PROTO_TCP, PROTO_UDP
from tests.helpers.l3 import oracle_sum

A4 = ipaddress.IPv4Address("10.1.0.2")
B4 = ipaddress.IPv4Address("192.168.50.7")
A6 = ipaddress.IPv6Address("fd00:1::2")
B6 = ipaddress.IPv6Address("fd00:50::7")


def test_ipv4_udp_fields() -> None:
    pkt = udp_packet(A4, B4, 1234, 53, b"hello")
    info = parse_packet(pkt)
    assert (info.version, info.src_address, info.dst_address) == (4, A4, B4)
    assert (info.length, info.protocol, info.l4_offset) == (len(pkt), PROTO_UDP, 20)
    assert info.dont_fragment and not info.is_fragment


def test_ipv6_tcp_fields_through_extension_headers() -> None:
    inner = tcp_packet(A6, B6, 40000, 9100, flags=TCP_SYN)[40:]
    hop_by_hop = bytes((PROTO_TCP, 0)) + b"\x01\x04\0\0\0\0"  # next=TCP, 8 bytes, PadN
    pkt = ip_packet(A6, B6, 0, hop_by_hop + inner)
    info = parse_packet(pkt)
    assert (info.version, info.protocol, info.l4_offset) == (6, PROTO_TCP, 48)
    assert info.src_address == A6 and info.dst_address == B6
    assert info.tcp_syn


def test_ipv6_non_first_fragment() -> None:
    frag = bytes((PROTO_UDP, 0)) + (64 | 1).to_bytes(2, "big") + b"\0\0\0\1"
    info = parse_packet(ip_packet(A6, B6, 44, frag + b"x" * 16))
    assert info.fragment_offset == 64 and info.more_fragments and info.is_fragment
    assert info.protocol == PROTO_UDP and info.l4_offset == 48


def test_ipv4_fragment_flags() -> None:
    pkt = bytearray(udp_packet(A4, B4, 1, 2, b"x" * 8, dont_fragment=False))
    pkt[6:8] = (0x2000 | 3).to_bytes(2, "big")
    info = parse_packet(bytes(pkt))
    assert info.fragment_offset == 24 and info.more_fragments and not info.dont_fragment


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"\x50" + bytes(39), "version 5"),
        (b"\x45" + bytes(10), "shorter than a header"),
        (b"\x44\0\0\x14" + bytes(16), "header length 16"),
        (b"\x46\0\0\x14" + bytes(16), "beyond total length"),
        (b"\x45\0\0\x15" + bytes(16), "total length 21"),
        (b"\x60" + bytes(20), "shorter than a header"),
        (b"\x60\0\0\0\0\x05" + bytes(34), "payload length 5"),
        (b"\x60\0\0\0\0\x02\0\0" + bytes(32) + b"\x06\x00", "beyond the packet"),
        (b"\x60\0\0\0\0\x01\0\0" + bytes(32) + b"\x06", "truncated"),
        (b"\x60\0\0\0\0\x04\x2c\0" + bytes(32) + b"\x06\0\0\0", "fragment header truncated"),
    ],
)
def test_refusals(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedPacket, match=reason):
        parse_packet(data)


def test_too_many_extension_headers() -> None:
    chain = b"".join(bytes((60, 0)) + bytes(6) for _ in range(9))
    with pytest.raises(MalformedPacket, match="too many"):
        parse_packet(ip_packet(A6, B6, 60, chain))


@pytest.mark.parametrize(
    "pkt",
    [
        udp_packet(A4, B4, 1, 2, b"abc"),
        tcp_packet(A6, B6, 1, 2, data=b"xyz"),
        icmp_echo(A4, B4, 1, 1),
    ],
)
def test_every_truncation_is_refused(pkt: bytes) -> None:
    for n in range(len(pkt)):
        with pytest.raises(MalformedPacket):
            parse_packet(pkt[:n])
    assert parse_packet(pkt).length == len(pkt)


def tcp_syn_reference(data: bytes, info: PacketInfo) -> bool:
    """What ``tcp_syn`` means, read from the bytes: the first fragment (or whole packet) of
    a TCP segment whose flags byte is inside the packet and has SYN set."""
    if info.protocol != PROTO_TCP or info.fragment_offset:
        return False
    flags_at = info.l4_offset + 13
    return flags_at < info.length and bool(data[flags_at] & 0x02)


@given(st.binary(max_size=200))
def test_fuzz_any_bytes_parse_or_malformed(data: bytes) -> None:
    try:
        info = parse_packet(data)
    except MalformedPacket:
        return
    assert info.length == len(data)
    assert info.l4_offset <= info.length
    assert info.tcp_syn == tcp_syn_reference(data, info)


@given(
    st.sampled_from(
        [
            udp_packet(A4, B4, 1, 2, b"payload"),
            tcp_packet(A6, B6, 3, 4, flags=TCP_SYN),
            ip_packet(A6, B6, 0, bytes((44, 0)) + bytes(6) + bytes((6, 0, 0, 0)) + bytes(20)),
        ]
    ),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=6),
)
def test_fuzz_mutated_packets(base: bytes, flips: list[tuple[int, int]]) -> None:
    data = bytearray(base)
    for at, value in flips:
        if at < len(data):
            data[at] = value
    try:
        info = parse_packet(bytes(data))
    except MalformedPacket:
        return
    assert info.l4_offset <= info.length == len(data)


@given(st.binary(max_size=300), st.integers(0, 0xFFFF))
def test_ones_sum_matches_rfc1071(data: bytes, initial: int) -> None:
    expected = oracle_sum(data) + initial
    expected = (expected & 0xFFFF) + (expected >> 16)
    got = ones_sum(data, initial)
    # 0 and 0xffff are the same number in ones' complement; only all-zero input gives 0.
    assert got == expected or {got, expected} == {0, 0xFFFF}
    if any(data) or initial:
        assert got != 0


def test_built_packets_have_valid_checksums() -> None:
    for src, dst in ((A4, B4), (A6, B6)):
        pkt = udp_packet(src, dst, 5, 6, b"odd-length")
        info = parse_packet(pkt)
        seg = pkt[info.l4_offset :]
        pseudo = pseudo_header_sum(info.version, info.src, info.dst, PROTO_UDP, len(seg))
        total = oracle_sum(seg) + pseudo
        assert (total & 0xFFFF) + (total >> 16) == 0xFFFF
    assert internet_checksum(udp_packet(A4, B4, 5, 6, b"")[:20]) == 0
    echo6 = icmp_echo(A6, B6, 7, 1)
    assert parse_packet(echo6).protocol == PROTO_ICMPV6


@given(st.integers(0, 255), st.booleans(), st.integers(0, 3))
def test_tcp_syn_is_the_syn_flag_of_a_first_fragment(flags: int, v6: bool, offset: int) -> None:
    src, dst = (A6, B6) if v6 else (A4, B4)
    pkt = bytearray(tcp_packet(src, dst, 40000, 9100, flags=flags))
    if not v6 and offset:  # a later fragment of the segment: its bytes are no TCP header
        pkt[6:8] = offset.to_bytes(2, "big")
    info = parse_packet(pkt)
    assert info.tcp_syn == (bool(flags & TCP_SYN) and not (offset and not v6))
    assert info.tcp_syn == tcp_syn_reference(bytes(pkt), info)
