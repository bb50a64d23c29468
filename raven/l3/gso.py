"""TCP segmentation offload in software, and the checksum helpers GSO needs.

With offloads on (see :class:`raven.transport.tun.LinuxTun`), the kernel hands the TUN reader
TCP "super-packets" of up to 64 KiB: one IP header, one TCP header, many segments' worth of
payload. They cross the tunnel as one datagram (one record, one encryption, one syscall
instead of ~45) and the far kernel cuts them up again. Where the far side cannot (no offload,
or the packet is larger than the tunnel's datagram limit), :func:`segment_tcp` does it here.
"""

from __future__ import annotations

from raven.l3.checksum import internet_checksum, ones_sum, pseudo_header_sum
from raven.l3.packet import (
    IPV4,
    PROTO_TCP,
    PROTO_UDP,
    TCP_CWR,
    TCP_FIN,
    TCP_FLAGS_AT,
    TCP_PSH,
    PacketInfo,
)


def is_gso_candidate(info: PacketInfo) -> bool:
    """A whole (unfragmented) TCP packet: the only kind sent as a super-packet."""
    return info.protocol == PROTO_TCP and not info.is_fragment


def tcp_header_bytes(packet: bytes | bytearray | memoryview, info: PacketInfo) -> int:
    """Length of the TCP header (data offset), or 0 if it does not fit the packet."""
    at = info.l4_offset + 12
    if at >= info.length:
        return 0
    size = (packet[at] >> 4) * 4
    return size if size >= 20 and info.l4_offset + size <= info.length else 0


def segment_tcp(packet: bytes, info: PacketInfo, max_payload: int) -> list[bytes]:
    """Cut a TCP packet into packets carrying at most ``max_payload`` bytes each.

    Sequence numbers advance, FIN and PSH stay on the last piece and CWR on the first, IPv4
    ids count up, lengths and checksums (IPv4 header, TCP) are recomputed. A packet that
    needs no cutting comes back alone and unchanged. Raises ValueError for a packet that is
    not a whole TCP segment or for ``max_payload`` < 1.
    """
    if not is_gso_candidate(info) or max_payload < 1:
        raise ValueError("only whole TCP packets are segmented")
    thl = tcp_header_bytes(packet, info)
    if not thl:
        raise ValueError("TCP header does not fit the packet")
    tcp = info.l4_offset
    headers = tcp + thl
    payload = memoryview(packet)[headers:]
    if len(payload) <= max_payload:
        return [packet]
    seq = int.from_bytes(packet[tcp + 4 : tcp + 8], "big")
    flags = packet[tcp + TCP_FLAGS_AT]
    ident = int.from_bytes(packet[4:6], "big") if info.version == IPV4 else 0
    out: list[bytes] = []
    starts = range(0, len(payload), max_payload)
    for i, start in enumerate(starts):
        piece = payload[start : start + max_payload]
        seg = bytearray(packet[:headers])
        seg += piece
        last = start + max_payload >= len(payload)
        seg[tcp + 4 : tcp + 8] = ((seq + start) & 0xFFFFFFFF).to_bytes(4, "big")
        cleared = (0 if last else TCP_FIN | TCP_PSH) | (0 if i == 0 else TCP_CWR)
        seg[tcp + TCP_FLAGS_AT] = flags & ~cleared
        if info.version == IPV4:
            seg[2:4] = len(seg).to_bytes(2, "big")
            seg[4:6] = ((ident + i) & 0xFFFF).to_bytes(2, "big")
            seg[10:12] = b"\0\0"
            seg[10:12] = internet_checksum(memoryview(seg)[:tcp]).to_bytes(2, "big")
        else:
            seg[4:6] = (len(seg) - 40).to_bytes(2, "big")
        seg[tcp + 16 : tcp + 18] = b"\0\0"
        pseudo = pseudo_header_sum(info.version, info.src, info.dst, PROTO_TCP, len(seg) - tcp)
        seg[tcp + 16 : tcp + 18] = internet_checksum(memoryview(seg)[tcp:], pseudo).to_bytes(
            2, "big"
        )
        out.append(bytes(seg))
    return out


def complete_checksum(
    packet: bytearray | memoryview, start: int, offset: int, protocol: int
) -> None:
    """Finish a partial checksum (CHECKSUM_PARTIAL: the field holds the pseudo-header sum)."""
    field = start + offset
    if field + 2 > len(packet):
        return
    value = ~ones_sum(memoryview(packet)[start:]) & 0xFFFF
    if protocol == PROTO_UDP and value == 0:
        value = 0xFFFF
    packet[field : field + 2] = value.to_bytes(2, "big")


def partial_tcp_checksum(packet: bytearray, info: PacketInfo) -> None:
    """Put the pseudo-header sum in the TCP checksum field, as GSO on write expects."""
    tcp = info.l4_offset
    pseudo = pseudo_header_sum(info.version, info.src, info.dst, PROTO_TCP, info.length - tcp)
    packet[tcp + 16 : tcp + 18] = pseudo.to_bytes(2, "big")


#: Largest super-packet sent as one tunnel datagram (a frame holds at most 65510 bytes).
MAX_SUPER_PACKET_BYTES = 65000


def split_super_packet(packet: bytes, info: PacketInfo, mtu: int, limit: int) -> list[bytes]:
    """Cut a TCP super-packet into pieces of at most ``limit`` bytes, each a whole number of
    ``mtu``-sized segments (so the far kernel segments them as the sender's would have).
    ``limit`` = ``mtu`` gives ordinary packets. Raises ValueError as :func:`segment_tcp`."""
    thl = tcp_header_bytes(packet, info)
    if not thl:
        raise ValueError("TCP header does not fit the packet")
    headers = info.l4_offset + thl
    mss = mtu - headers
    if mss < 1:
        raise ValueError(f"MTU {mtu} leaves no room for payload")
    per_piece = max(1, (limit - headers) // mss) * mss
    return segment_tcp(packet, info, per_piece)
