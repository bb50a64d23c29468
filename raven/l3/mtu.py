"""What to do with a packet larger than the tunnel MTU.

- IPv4 without DF: fragment it (RFC 791), as any router would;
- IPv4 with DF, and every IPv6 packet: drop it and answer ICMP "fragmentation needed" /
  "packet too big" carrying the MTU, so the sender's path-MTU discovery adapts.
"""

from __future__ import annotations

from dataclasses import dataclass

from raven.l3.checksum import internet_checksum
from raven.l3.icmp import build_too_big
from raven.l3.packet import IPV4, IPV4_MIN_HEADER_BYTES, PacketInfo

_V4_FLAG_MF = 0x2000
_V4_FLAG_DF = 0x4000


@dataclass(frozen=True, slots=True)
class MtuVerdict:
    """The outcome for an oversized packet."""

    #: Packets to forward instead (IPv4 fragments); empty when the packet is dropped.
    packets: tuple[bytes, ...]
    #: ICMP error to hand back to the sender, or None (forbidden, or fragmented).
    reply: bytes | None


def fragment_ipv4(packet: bytes, info: PacketInfo, mtu: int) -> list[bytes]:
    """Split an IPv4 packet without DF into fragments of at most ``mtu`` bytes.

    Raises ValueError for packets this router does not fragment: DF set, IP options
    (which would need per-option copy rules), or an MTU below 68 bytes.
    """
    if info.version != IPV4 or info.dont_fragment:
        raise ValueError("only IPv4 packets without DF are fragmented")
    ihl = info.l4_offset
    if ihl != IPV4_MIN_HEADER_BYTES:
        raise ValueError("packets with IP options are not fragmented")
    chunk = (mtu - ihl) // 8 * 8
    if chunk < 8:
        raise ValueError(f"MTU {mtu} too small to fragment into")
    payload = memoryview(packet)[ihl:]
    base_offset = info.fragment_offset // 8
    out: list[bytes] = []
    for start in range(0, len(payload), chunk):
        piece = payload[start : start + chunk]
        last = start + chunk >= len(payload)
        flags = 0 if last and not info.more_fragments else _V4_FLAG_MF
        header = bytearray(packet[:ihl])
        header[2:4] = (ihl + len(piece)).to_bytes(2, "big")
        header[6:8] = (flags | (base_offset + start // 8)).to_bytes(2, "big")
        header[10:12] = b"\0\0"
        header[10:12] = internet_checksum(header).to_bytes(2, "big")
        out.append(bytes(header) + piece)
    return out


def fit_mtu(
    packet: bytes, info: PacketInfo, mtu: int, icmp_source: int | None = None
) -> MtuVerdict:
    """Decide for a packet with ``info.length > mtu`` (fragments, or drop plus ICMP)."""
    if info.version == IPV4 and not info.dont_fragment:
        try:
            return MtuVerdict(tuple(fragment_ipv4(packet, info, mtu)), None)
        except ValueError:
            return MtuVerdict((), None)
    return MtuVerdict((), build_too_big(packet, info, mtu, icmp_source))
