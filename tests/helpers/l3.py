"""Oracles and stand-ins for the L3 tests: the Internet checksum the slow obvious way, a TCP
checksum check, a packet sink for the router, an ``ip`` command that records its arguments."""

from __future__ import annotations

from collections.abc import Sequence

from raven.l3 import parse_packet
from raven.l3.packet import PROTO_TCP


def oracle_sum(data: bytes) -> int:
    """RFC 1071, the slow obvious way."""
    if len(data) % 2:
        data += b"\0"
    total = 0
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
        total = (total & 0xFFFF) + (total >> 16)
    return total


def tcp_checksum_ok(pkt: bytes) -> bool:
    info = parse_packet(pkt)
    seg = pkt[info.l4_offset :]
    if info.version == 4:
        pseudo = pkt[12:20] + bytes((0, PROTO_TCP)) + len(seg).to_bytes(2, "big")
    else:
        pseudo = pkt[8:40] + len(seg).to_bytes(4, "big") + bytes((0, 0, 0, PROTO_TCP))
    return oracle_sum(pseudo + seg) == 0xFFFF


class Sink:
    def __init__(self, accept: bool = True) -> None:
        self.packets: list[bytes] = []
        self.accept = accept

    def __call__(self, packet: bytes) -> bool:
        if self.accept:
            self.packets.append(packet)
        return self.accept


class FakeIp:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    async def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.commands.append(list(argv))
        if argv[3] == "del" and "fd00:bad::/64" in argv:
            return 2, "RTNETLINK answers: Operation not permitted"
        return 0, ""
