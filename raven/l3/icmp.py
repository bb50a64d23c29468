"""ICMP errors the L3 path sends back to a packet's source.

- IPv4 "destination unreachable, fragmentation needed" (type 3 code 4, RFC 1191) with
  the next-hop MTU, and "network unreachable" (type 3 code 0);
- ICMPv6 "packet too big" (type 2, RFC 4443/8201) and "no route" (type 1 code 0).

The builders return None where RFC 1122 / RFC 4443 2.4(e) forbid an error: about an
ICMP error, a non-first fragment, or a packet from or to a multicast, broadcast or
unspecified address. :class:`IcmpRateLimiter` bounds how many are sent (time is an
argument: this module reads no clock).
"""

from __future__ import annotations

from raven.l3.checksum import internet_checksum, pseudo_header_sum
from raven.l3.packet import (
    IPV4,
    IPV4_MIN_REASSEMBLY_BYTES,
    IPV6_HEADER_BYTES,
    IPV6_MIN_MTU,
    PROTO_ICMP,
    PROTO_ICMPV6,
    PacketInfo,
)

ICMP_DEST_UNREACHABLE = 3
ICMP_CODE_NET_UNREACHABLE = 0
ICMP_CODE_FRAG_NEEDED = 4
ICMPV6_DEST_UNREACHABLE = 1
ICMPV6_CODE_NO_ROUTE = 0
ICMPV6_PACKET_TOO_BIG = 2
#: ICMPv4 types that are errors (no error is ever sent about one of these).
_ICMP_ERROR_TYPES = frozenset({3, 4, 5, 11, 12})
#: Hop limit / TTL of the errors we originate.
ICMP_TTL = 64
_ICMP_HEADER_BYTES = 8
_V4_HEADER_BYTES = 20


def _may_answer(packet: bytes | bytearray | memoryview, info: PacketInfo) -> bool:
    if info.fragment_offset:
        return False
    if info.version == IPV4:
        if info.src == 0 or info.src >> 28 == 0xE or info.dst >> 28 == 0xE:
            return False
        if info.src == 0xFFFFFFFF or info.dst == 0xFFFFFFFF:
            return False
        if info.protocol == PROTO_ICMP:
            type_at = info.l4_offset
            return type_at < info.length and packet[type_at] not in _ICMP_ERROR_TYPES
        return True
    if info.src == 0 or info.src >> 120 == 0xFF or info.dst >> 120 == 0xFF:
        return False
    if info.protocol == PROTO_ICMPV6:
        type_at = info.l4_offset
        return type_at < info.length and packet[type_at] >= 128  # 0..127 are errors
    return True


def _ipv4_error(
    packet: bytes | bytearray | memoryview, info: PacketInfo, code: int, word: int, source: int
) -> bytes:
    quoted = bytes(packet[: IPV4_MIN_REASSEMBLY_BYTES - _V4_HEADER_BYTES - _ICMP_HEADER_BYTES])
    body = bytes((ICMP_DEST_UNREACHABLE, code, 0, 0)) + word.to_bytes(4, "big") + quoted
    checksum = internet_checksum(body)
    body = body[:2] + checksum.to_bytes(2, "big") + body[4:]
    total = _V4_HEADER_BYTES + len(body)
    header = bytearray(
        bytes((0x45, 0))
        + total.to_bytes(2, "big")
        + bytes((0, 0, 0, 0, ICMP_TTL, PROTO_ICMP, 0, 0))
        + source.to_bytes(4, "big")
        + info.src.to_bytes(4, "big")
    )
    header[10:12] = internet_checksum(header).to_bytes(2, "big")
    return bytes(header) + body


def _ipv6_error(
    packet: bytes | bytearray | memoryview,
    info: PacketInfo,
    *,
    icmp_type: int,
    code: int,
    word: int,
    source: int,
) -> bytes:
    room = IPV6_MIN_MTU - IPV6_HEADER_BYTES - _ICMP_HEADER_BYTES
    quoted = bytes(packet[:room])
    length = _ICMP_HEADER_BYTES + len(quoted)
    body = bytes((icmp_type, code, 0, 0)) + word.to_bytes(4, "big") + quoted
    checksum = internet_checksum(body, pseudo_header_sum(6, source, info.src, PROTO_ICMPV6, length))
    body = body[:2] + checksum.to_bytes(2, "big") + body[4:]
    header = (
        bytes((0x60, 0, 0, 0))
        + length.to_bytes(2, "big")
        + bytes((PROTO_ICMPV6, ICMP_TTL))
        + source.to_bytes(16, "big")
        + info.src.to_bytes(16, "big")
    )
    return header + body


def build_too_big(
    packet: bytes | bytearray | memoryview, info: PacketInfo, mtu: int, source: int | None = None
) -> bytes | None:
    """ICMP "fragmentation needed" / ICMPv6 "packet too big" for ``packet``, or None.

    ``mtu`` is the largest packet the path takes; ``source`` the address the error
    comes from (default: the packet's destination, which every stack accepts).
    """
    if not _may_answer(packet, info):
        return None
    src = info.dst if source is None else source
    if info.version == IPV4:
        return _ipv4_error(packet, info, ICMP_CODE_FRAG_NEEDED, mtu & 0xFFFF, src)
    return _ipv6_error(
        packet,
        info,
        icmp_type=ICMPV6_PACKET_TOO_BIG,
        code=0,
        word=max(mtu, IPV6_MIN_MTU),
        source=src,
    )


def build_unreachable(
    packet: bytes | bytearray | memoryview, info: PacketInfo, source: int | None = None
) -> bytes | None:
    """ICMP "network unreachable" / ICMPv6 "no route to destination", or None."""
    if not _may_answer(packet, info):
        return None
    src = info.dst if source is None else source
    if info.version == IPV4:
        return _ipv4_error(packet, info, ICMP_CODE_NET_UNREACHABLE, 0, src)
    return _ipv6_error(
        packet,
        info,
        icmp_type=ICMPV6_DEST_UNREACHABLE,
        code=ICMPV6_CODE_NO_ROUTE,
        word=0,
        source=src,
    )


class IcmpRateLimiter:
    """Token bucket: at most ``burst`` errors at once, refilled at ``rate_per_s``."""

    def __init__(self, rate_per_s: float = 100.0, burst: int = 50) -> None:
        if rate_per_s <= 0 or burst <= 0:
            raise ValueError("rate_per_s and burst must be positive")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last: float | None = None

    def allow(self, now: float) -> bool:
        """Take one token at time ``now`` (monotonic seconds); False when none is left."""
        if self._last is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
