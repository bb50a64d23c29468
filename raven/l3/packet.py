"""IPv4 and IPv6 header parsing with bounds checks.

:func:`parse_packet` takes the bytes of one IP packet (as read from a TUN device
or carried by a tunnel datagram) and returns a :class:`PacketInfo`, or raises
:class:`MalformedPacket`. Any input either parses or raises that one error.
Addresses are plain ints (fast to mask for routing); the ``*_address``
properties give :mod:`ipaddress` objects.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from functools import partial
from typing import NamedTuple, cast

IPV4 = 4
IPV6 = 6
PROTO_HOPOPT = 0
PROTO_ICMP = 1
PROTO_TCP = 6
PROTO_UDP = 17
PROTO_IPV6_ROUTE = 43
PROTO_IPV6_FRAG = 44
PROTO_AH = 51
PROTO_ICMPV6 = 58
PROTO_IPV6_NONXT = 59
PROTO_IPV6_OPTS = 60

IPV4_MIN_HEADER_BYTES = 20
IPV6_HEADER_BYTES = 40
TCP_MIN_HEADER_BYTES = 20
#: The TCP header's flags byte: its offset from the header's start (RFC 9293 3.1: after the
#: ports, sequence and acknowledgement numbers and the data offset byte), and the flags in it.
TCP_FLAGS_AT = 13
TCP_FIN, TCP_SYN, TCP_PSH, TCP_CWR = 0x01, 0x02, 0x08, 0x80
#: The smallest MTU every IPv6 link has (RFC 8200 section 5).
IPV6_MIN_MTU = 1280
#: Every IPv4 host accepts datagrams of this size (RFC 791); ICMP errors stay within it.
IPV4_MIN_REASSEMBLY_BYTES = 576
#: IPv6 extension headers walked at most; a longer chain is refused as malformed.
MAX_IPV6_EXTENSION_HEADERS = 8

_V4_FLAG_DF = 0x4000
_V4_FLAG_MF = 0x2000
_V4_OFFSET_MASK = 0x1FFF
_V6_EXTENSIONS = frozenset({PROTO_HOPOPT, PROTO_IPV6_ROUTE, PROTO_IPV6_OPTS, PROTO_AH})


class MalformedPacket(ValueError):
    """The bytes are not a well-formed IPv4/IPv6 packet; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_V4 = struct.Struct("!BxHxxHxBxxII")  # ver/ihl, total length, flags/offset, protocol, src, dst
_V6 = struct.Struct("!4xHBxQQQQ")  # payload length, next header, src (2 x u64), dst (2 x u64)


class PacketInfo(NamedTuple):
    """What the L3 path needs from an IP header (a NamedTuple: built once per packet, fast)."""

    #: 4 or 6.
    version: int
    #: Source and destination addresses as integers (32 or 128 bits).
    src: int
    dst: int
    #: Total packet length in bytes (always ``len(packet)``: trailing bytes are refused).
    length: int
    #: Upper-layer protocol (for IPv6: after the extension headers).
    protocol: int
    #: Offset of the upper-layer header (the payload of a non-first fragment).
    l4_offset: int
    #: Fragment offset in bytes (0 for unfragmented packets and first fragments).
    fragment_offset: int = 0
    #: More fragments follow.
    more_fragments: bool = False
    #: IPv4 DF bit; always True for IPv6 (routers never fragment IPv6).
    dont_fragment: bool = True
    #: The first fragment (or whole packet) of a TCP segment with SYN set: its MSS is
    #: clamped on the way through (decided here, once, for both sides' TUN paths).
    tcp_syn: bool = False

    @property
    def src_address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return _address(self.version, self.src)

    @property
    def dst_address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return _address(self.version, self.dst)

    @property
    def is_fragment(self) -> bool:
        return self.fragment_offset != 0 or self.more_fragments

    @property
    def header_bytes(self) -> int:
        """IPv4: the header length (IHL); IPv6: the fixed header plus extension headers."""
        return self.l4_offset


def _address(version: int, value: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if version == IPV4:
        return ipaddress.IPv4Address(value)
    return ipaddress.IPv6Address(value)


#: ``PacketInfo(*fields)`` without the namedtuple's ``__new__`` (a Python-level function):
#: one C call per packet on the L3 path.
_info = cast("Callable[[tuple[int, int, int, int, int, int, int, bool, bool, bool]], PacketInfo]",
             partial(tuple.__new__, PacketInfo))  # fmt: skip


def parse_packet(data: bytes | bytearray | memoryview) -> PacketInfo:
    """Parse the IP header of ``data``; raises :class:`MalformedPacket`. (IPv4 is parsed
    here, not in a helper: a function call less per packet on the L3 path.)"""
    if not data:
        raise MalformedPacket("empty packet")
    version = data[0] >> 4
    if version == IPV6:
        return _parse_ipv6(data)
    if version != IPV4:
        raise MalformedPacket(f"IP version {version}")
    size = len(data)
    if size < IPV4_MIN_HEADER_BYTES:
        raise MalformedPacket(f"IPv4 packet of {size} bytes is shorter than a header")
    ver_ihl, total, flags, protocol, src, dst = _V4.unpack_from(data)
    ihl = (ver_ihl & 0x0F) * 4
    if ihl < IPV4_MIN_HEADER_BYTES:
        raise MalformedPacket(f"IPv4 header length {ihl}")
    if total != size:
        raise MalformedPacket(f"IPv4 total length {total} but {size} bytes")
    if ihl > total:
        raise MalformedPacket(f"IPv4 header length {ihl} beyond total length {total}")
    offset, more, dont = (flags & _V4_OFFSET_MASK) * 8, flags & _V4_FLAG_MF, flags & _V4_FLAG_DF
    syn = (protocol == PROTO_TCP and not offset and ihl + TCP_FLAGS_AT < total
           and data[ihl + TCP_FLAGS_AT] & TCP_SYN)  # fmt: skip
    return _info((IPV4, src, dst, total, protocol, ihl, offset, bool(more), bool(dont), bool(syn)))


def _parse_ipv6(data: bytes | bytearray | memoryview) -> PacketInfo:
    size = len(data)
    if size < IPV6_HEADER_BYTES:
        raise MalformedPacket(f"IPv6 packet of {size} bytes is shorter than a header")
    payload, protocol, src_hi, src_lo, dst_hi, dst_lo = _V6.unpack_from(data)
    if payload + IPV6_HEADER_BYTES != size:
        raise MalformedPacket(f"IPv6 payload length {payload} but {size - 40} bytes follow")
    offset = IPV6_HEADER_BYTES
    fragment_offset = 0
    more_fragments = False
    for _ in range(MAX_IPV6_EXTENSION_HEADERS):
        if protocol in _V6_EXTENSIONS:
            if offset + 2 > size:
                raise MalformedPacket("IPv6 extension header truncated")
            if protocol == PROTO_AH:
                length = (data[offset + 1] + 2) * 4
            else:
                length = (data[offset + 1] + 1) * 8
            if offset + length > size:
                raise MalformedPacket("IPv6 extension header beyond the packet")
            protocol = data[offset]
            offset += length
        elif protocol == PROTO_IPV6_FRAG:
            if offset + 8 > size:
                raise MalformedPacket("IPv6 fragment header truncated")
            field = (data[offset + 2] << 8) | data[offset + 3]
            fragment_offset = field & 0xFFF8
            more_fragments = bool(field & 1)
            protocol = data[offset]
            offset += 8
            if fragment_offset:
                break  # what follows is the middle of some other header
        else:
            break
    else:
        raise MalformedPacket("too many IPv6 extension headers")
    src, dst = (src_hi << 64) | src_lo, (dst_hi << 64) | dst_lo
    syn = protocol == PROTO_TCP and not fragment_offset and offset + TCP_FLAGS_AT < size
    syn = syn and bool(data[offset + TCP_FLAGS_AT] & TCP_SYN)
    fields = (IPV6, src, dst, size, protocol, offset, fragment_offset, more_fragments, True, syn)
    return _info(fields)
