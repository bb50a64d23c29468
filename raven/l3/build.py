"""Builders of well-formed IPv4/IPv6 packets (UDP, TCP, ICMP echo) with valid checksums.

For tests, the demo and the e2e checks (a spoofed packet is one of these with a chosen
source). Addresses are :mod:`ipaddress` objects; both must be of the same family.
"""

from __future__ import annotations

import ipaddress

from raven.l3.checksum import internet_checksum, pseudo_header_sum
from raven.l3.packet import PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

TCP_SYN = 0x02
TCP_ACK = 0x10


def ip_packet(
    src: IPAddress,
    dst: IPAddress,
    protocol: int,
    payload: bytes,
    *,
    ttl: int = 64,
    dont_fragment: bool = True,
    identification: int = 0,
) -> bytes:
    """An IP packet around ``payload`` (whose checksum, if any, must already be right)."""
    if src.version != dst.version:
        raise ValueError("source and destination families differ")
    if src.version == 4:
        total = 20 + len(payload)
        header = bytearray(
            bytes((0x45, 0))
            + total.to_bytes(2, "big")
            + identification.to_bytes(2, "big")
            + (0x4000 if dont_fragment else 0).to_bytes(2, "big")
            + bytes((ttl, protocol, 0, 0))
            + src.packed
            + dst.packed
        )
        header[10:12] = internet_checksum(header).to_bytes(2, "big")
        return bytes(header) + payload
    return (
        bytes((0x60, 0, 0, 0))
        + len(payload).to_bytes(2, "big")
        + bytes((protocol, ttl))
        + src.packed
        + dst.packed
        + payload
    )


def _with_checksum(
    src: IPAddress, dst: IPAddress, protocol: int, segment: bytearray, at: int
) -> bytes:
    pseudo = pseudo_header_sum(src.version, int(src), int(dst), protocol, len(segment))
    checksum = internet_checksum(segment, pseudo)
    if protocol == PROTO_UDP and checksum == 0:
        checksum = 0xFFFF
    segment[at : at + 2] = checksum.to_bytes(2, "big")
    return bytes(segment)


def udp_packet(
    src: IPAddress,
    dst: IPAddress,
    sport: int,
    dport: int,
    data: bytes,
    *,
    dont_fragment: bool = True,
) -> bytes:
    """A UDP datagram in an IP packet."""
    segment = bytearray(
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + (8 + len(data)).to_bytes(2, "big")
        + b"\0\0"
        + data
    )
    body = _with_checksum(src, dst, PROTO_UDP, segment, 6)
    return ip_packet(src, dst, PROTO_UDP, body, dont_fragment=dont_fragment)


def tcp_packet(
    src: IPAddress,
    dst: IPAddress,
    sport: int,
    dport: int,
    *,
    flags: int = TCP_ACK,
    options: bytes = b"",
    data: bytes = b"",
    seq: int = 1,
    ack: int = 0,
) -> bytes:
    """A TCP segment in an IP packet; ``options`` is padded to 4 bytes with NOPs."""
    options = options + b"\x01" * (-len(options) % 4)
    offset = (20 + len(options)) // 4
    segment = bytearray(
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + seq.to_bytes(4, "big")
        + ack.to_bytes(4, "big")
        + bytes((offset << 4, flags))
        + (65535).to_bytes(2, "big")
        + b"\0\0\0\0"
        + options
        + data
    )
    return ip_packet(src, dst, PROTO_TCP, _with_checksum(src, dst, PROTO_TCP, segment, 16))


def mss_option(mss: int) -> bytes:
    """The TCP MSS option (kind 2, length 4)."""
    return bytes((2, 4)) + mss.to_bytes(2, "big")


def icmp_echo(src: IPAddress, dst: IPAddress, ident: int, seq: int, data: bytes = b"") -> bytes:
    """An ICMP / ICMPv6 echo request."""
    if src.version == 4:
        body = bytearray(bytes((8, 0, 0, 0)) + ident.to_bytes(2, "big") + seq.to_bytes(2, "big"))
        body += data
        body[2:4] = internet_checksum(body).to_bytes(2, "big")
        return ip_packet(src, dst, PROTO_ICMP, bytes(body))
    body = bytearray(bytes((128, 0, 0, 0)) + ident.to_bytes(2, "big") + seq.to_bytes(2, "big"))
    body += data
    return ip_packet(src, dst, PROTO_ICMPV6, _with_checksum(src, dst, PROTO_ICMPV6, body, 2))
