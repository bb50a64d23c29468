"""The Internet checksum (RFC 1071) and the TCP/UDP/ICMPv6 pseudo-header sums."""

from __future__ import annotations

from raven.l3.packet import IPV4


def ones_sum(data: bytes | bytearray | memoryview, initial: int = 0) -> int:
    """Ones'-complement sum of ``data`` as big-endian 16-bit words, plus ``initial``.

    The result is in ``0..0xffff``; it is 0 only when everything summed was zero.
    Uses 2**16 == 1 (mod 0xffff): the folded sum of the words is the number mod 0xffff.
    """
    value = int.from_bytes(data, "big")
    if len(data) & 1:
        value <<= 8
    folded = value % 0xFFFF
    if folded == 0 and value:
        folded = 0xFFFF
    total = folded + initial
    return (total & 0xFFFF) + (total >> 16)


def internet_checksum(data: bytes | bytearray | memoryview, initial: int = 0) -> int:
    """The checksum field value for ``data`` (with its own checksum field zeroed)."""
    return ~ones_sum(data, initial) & 0xFFFF


def pseudo_header_sum(version: int, src: int, dst: int, protocol: int, length: int) -> int:
    """Ones'-complement sum of the IPv4 (RFC 793) or IPv6 (RFC 8200 8.1) pseudo-header."""
    if version == IPV4:
        header = (
            src.to_bytes(4, "big")
            + dst.to_bytes(4, "big")
            + bytes((0, protocol))
            + length.to_bytes(2, "big")
        )
    else:
        header = (
            src.to_bytes(16, "big")
            + dst.to_bytes(16, "big")
            + length.to_bytes(4, "big")
            + bytes((0, 0, 0, protocol))
        )
    return ones_sum(header)
