"""TCP MSS clamping: shrink the MSS option of SYNs so segments fit the tunnel MTU.

Path-MTU discovery through a tunnel depends on ICMP reaching the sender, which
firewalls often eat. Clamping the MSS of every SYN that crosses the tunnel (both
directions: SYN and SYN-ACK) makes TCP pick segments that fit from the start.
"""

from __future__ import annotations

from raven.l3.checksum import internet_checksum, pseudo_header_sum
from raven.l3.packet import (
    IPV4,
    PROTO_TCP,
    TCP_FLAGS_AT,
    TCP_MIN_HEADER_BYTES,
    TCP_SYN,
    PacketInfo,
)

_OPT_END = 0
_OPT_NOP = 1
_OPT_MSS = 2
_TCP_CHECKSUM_AT = 16


def mss_for_mtu(version: int, mtu: int) -> int:
    """The largest MSS whose segments fit ``mtu``: minus the IP and TCP headers."""
    return mtu - (40 if version == IPV4 else 60)


def _mss_option_at(packet: bytes | bytearray | memoryview, start: int, end: int) -> int | None:
    """Offset of the MSS option's value within ``packet[start:end]``, or None."""
    at = start
    while at < end:
        kind = packet[at]
        if kind == _OPT_END:
            return None
        if kind == _OPT_NOP:
            at += 1
            continue
        if at + 1 >= end:
            return None
        length = packet[at + 1]
        if length < 2 or at + length > end:
            return None  # malformed options: leave the segment alone
        if kind == _OPT_MSS:
            return at + 2 if length == 4 else None
        at += length
    return None


def clamp_mss(packet: bytes, info: PacketInfo, max_mss: int) -> bytes:
    """``packet`` with its SYN's MSS option lowered to ``max_mss`` (checksum fixed).

    Returns ``packet`` itself when nothing changes: not a TCP SYN, no MSS option, an
    MSS already small enough, or options that do not parse.
    """
    if info.protocol != PROTO_TCP or info.fragment_offset or info.more_fragments:
        return packet
    tcp = info.l4_offset
    if tcp + TCP_MIN_HEADER_BYTES > info.length or not packet[tcp + TCP_FLAGS_AT] & TCP_SYN:
        return packet
    data_offset = (packet[tcp + 12] >> 4) * 4
    if data_offset <= TCP_MIN_HEADER_BYTES or tcp + data_offset > info.length:
        return packet
    at = _mss_option_at(packet, tcp + TCP_MIN_HEADER_BYTES, tcp + data_offset)
    if at is None:
        return packet
    mss = (packet[at] << 8) | packet[at + 1]
    if mss <= max_mss:
        return packet
    out = bytearray(packet)
    out[at : at + 2] = max_mss.to_bytes(2, "big")
    out[tcp + _TCP_CHECKSUM_AT : tcp + _TCP_CHECKSUM_AT + 2] = b"\0\0"
    segment_len = info.length - tcp
    pseudo = pseudo_header_sum(info.version, info.src, info.dst, PROTO_TCP, segment_len)
    checksum = internet_checksum(memoryview(out)[tcp:], pseudo)
    out[tcp + _TCP_CHECKSUM_AT : tcp + _TCP_CHECKSUM_AT + 2] = checksum.to_bytes(2, "big")
    return bytes(out)
