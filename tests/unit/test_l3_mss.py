"""MSS clamping and IPv4 fragmentation: results re-parsed and checksums verified."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from raven.l3 import clamp_mss, fit_mtu, fragment_ipv4, mss_for_mtu, parse_packet
from raven.l3.build import TCP_ACK, TCP_SYN, mss_option, tcp_packet, udp_packet
from tests.helpers.l3 import oracle_sum, tcp_checksum_ok

A4 = ipaddress.IPv4Address("10.1.0.2")
B4 = ipaddress.IPv4Address("192.168.50.7")
A6 = ipaddress.IPv6Address("fd00:1::2")
B6 = ipaddress.IPv6Address("fd00:50::7")


def mss_of(pkt: bytes) -> int:
    info = parse_packet(pkt)
    opts = pkt[info.l4_offset + 20 :]
    i = opts.index(2)
    return int.from_bytes(opts[i + 2 : i + 4], "big")


def test_mss_for_mtu() -> None:
    assert mss_for_mtu(4, 1380) == 1340
    assert mss_for_mtu(6, 1380) == 1320


def test_clamps_ipv4_syn() -> None:
    syn = tcp_packet(
        A4, B4, 40000, 9100, flags=TCP_SYN, options=mss_option(1460) + b"\x01\x03\x03\x07"
    )
    assert tcp_checksum_ok(syn)
    out = clamp_mss(syn, parse_packet(syn), 1340)
    assert out != syn and len(out) == len(syn)
    assert mss_of(out) == 1340
    assert tcp_checksum_ok(out)


def test_clamps_ipv6_syn_ack_with_odd_aligned_option() -> None:
    syn_ack = tcp_packet(
        A6, B6, 9100, 40000, flags=TCP_SYN | TCP_ACK, options=b"\x01" + mss_option(1440), data=b"z"
    )
    out = clamp_mss(syn_ack, parse_packet(syn_ack), 1320)
    assert mss_of(out) == 1320 and tcp_checksum_ok(out)


def test_leaves_alone() -> None:
    small = tcp_packet(A4, B4, 1, 2, flags=TCP_SYN, options=mss_option(1200))
    assert clamp_mss(small, parse_packet(small), 1340) is small
    ack = tcp_packet(A4, B4, 1, 2, flags=TCP_ACK, options=mss_option(1460))
    assert clamp_mss(ack, parse_packet(ack), 1340) is ack
    no_mss = tcp_packet(A4, B4, 1, 2, flags=TCP_SYN, options=b"\x01\x01\x04\x02")
    assert clamp_mss(no_mss, parse_packet(no_mss), 1340) is no_mss
    bad = tcp_packet(A4, B4, 1, 2, flags=TCP_SYN, options=b"\x08\x30" + mss_option(1460))
    assert clamp_mss(bad, parse_packet(bad), 1340) is bad
    udp = udp_packet(A4, B4, 1, 2, b"\x02\x04\x05\xb4" * 8)
    assert clamp_mss(udp, parse_packet(udp), 1340) is udp


@given(st.binary(max_size=40), st.integers(536, 9000))
def test_fuzz_options_never_break(options: bytes, max_mss: int) -> None:
    syn = tcp_packet(A4, B4, 1, 2, flags=TCP_SYN, options=options)
    out = clamp_mss(syn, parse_packet(syn), max_mss)
    assert len(out) == len(syn) and tcp_checksum_ok(out)


def test_fragment_ipv4_reassembles() -> None:
    payload = bytes(range(256)) * 6
    pkt = udp_packet(A4, B4, 1, 2, payload, dont_fragment=False)
    frags = fragment_ipv4(pkt, parse_packet(pkt), 600)
    assert len(frags) == 3
    body = b""
    for i, frag in enumerate(frags):
        info = parse_packet(frag)
        assert len(frag) <= 600 and oracle_sum(frag[:20]) == 0xFFFF
        assert info.fragment_offset == len(body)
        assert info.more_fragments == (i < 2)
        body += frag[20:]
    assert body == pkt[20:]


def test_fit_mtu() -> None:
    df = udp_packet(A4, B4, 1, 2, b"x" * 1400)
    verdict = fit_mtu(df, parse_packet(df), 1380)
    assert verdict.packets == () and verdict.reply is not None
    assert int.from_bytes(verdict.reply[26:28], "big") == 1380
    no_df = udp_packet(A4, B4, 1, 2, b"x" * 1400, dont_fragment=False)
    verdict = fit_mtu(no_df, parse_packet(no_df), 1380)
    assert len(verdict.packets) == 2 and verdict.reply is None
    v6 = udp_packet(A6, B6, 1, 2, b"x" * 1400)
    verdict = fit_mtu(v6, parse_packet(v6), 1380)
    assert verdict.packets == () and verdict.reply is not None and verdict.reply[40] == 2
