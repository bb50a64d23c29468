"""Recording TCP traffic off the wire in a namespace (root): an ``AF_PACKET`` raw socket on one
interface, what an attacker on the path between an agent and the gateway sees.

:class:`PacketCapture` opens the socket inside the namespace (it keeps that namespace) with a
large receive buffer, so packets queue in the kernel while the test does other things;
:meth:`PacketCapture.streams` reads everything queued and reassembles, per TCP connection,
the bytes sent to one port (segments ordered by sequence number, retransmissions dropped).
:func:`handshake_message_1` finds a tunnel's first handshake message in such a stream by its
framing (docs/protocol-handshake.md: ``MAGIC`` (``"RVN2"``), the suite byte, u16 length,
message 1), never by a fixed size.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from raven.protocol.constants import MAGIC
from raven.protocol.suites import PREAMBLE_BYTES
from tests.helpers.e2e.netns import Netns, run_in_netns

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
ETH_HEADER = 14
IPPROTO_TCP = 6
#: Kernel memory for packets queued before they are read (SO_RCVBUFFORCE: root only).
CAPTURE_BUFFER_BYTES = 32 << 20
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux's value; Python may lack it
_LENGTH = struct.Struct(">H")


@dataclass(frozen=True)
class Flow:
    """One direction of a TCP connection."""

    src: str
    sport: int
    dst: str
    dport: int


@dataclass
class Segments:
    """The segments of one flow, by sequence number."""

    by_seq: dict[int, bytes] = field(default_factory=dict)

    def add(self, seq: int, payload: bytes) -> None:
        if len(payload) > len(self.by_seq.get(seq, b"")):
            self.by_seq[seq] = payload

    def stream(self) -> bytes:
        """The bytes from the first captured segment on, as far as they are contiguous."""
        out = bytearray()
        start: int | None = None
        for seq in sorted(self.by_seq):
            if start is None:
                start = seq
            offset = seq - start
            payload = self.by_seq[seq]
            if offset > len(out):
                break  # a hole: a segment was not captured
            out += payload[len(out) - offset :]
        return bytes(out)


def parse_tcp(frame: bytes) -> tuple[Flow, int, bytes] | None:
    """An Ethernet frame -> (flow, sequence number, payload) for IPv4 TCP, else None."""
    if len(frame) < ETH_HEADER + 20 or struct.unpack_from(">H", frame, 12)[0] != ETH_P_IP:
        return None
    ip = frame[ETH_HEADER:]
    ihl = (ip[0] & 0x0F) * 4
    total = struct.unpack_from(">H", ip, 2)[0]
    if ip[9] != IPPROTO_TCP or len(ip) < ihl + 20:
        return None
    sport, dport, seq = struct.unpack_from(">HHI", ip, ihl)
    doff = (ip[ihl + 12] >> 4) * 4
    flow = Flow(socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport)
    return flow, seq, bytes(ip[ihl + doff : total])


class PacketCapture:
    """Every packet on ``ifname`` in ``ns`` from now on, queued in the kernel until read."""

    def __init__(self, ns: Netns, ifname: str) -> None:
        def open_socket() -> socket.socket:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, CAPTURE_BUFFER_BYTES)
            sock.bind((ifname, ETH_P_ALL))
            return sock

        self.sock = run_in_netns(ns.name, open_socket)
        self.sock.setblocking(False)
        self._segments: dict[Flow, Segments] = {}
        self.packets = 0

    def streams(self, dport: int) -> dict[Flow, bytes]:
        """Read what is queued; the bytes each connection sent to ``dport`` so far."""
        while True:
            try:
                frame = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            self.packets += 1
            parsed = parse_tcp(frame)
            if parsed is None or parsed[0].dport != dport or not parsed[2]:
                continue
            flow, seq, payload = parsed
            self._segments.setdefault(flow, Segments()).add(seq, payload)
        return {flow: segs.stream() for flow, segs in self._segments.items()}

    def close(self) -> None:
        self.sock.close()


def handshake_message_1(stream: bytes) -> bytes | None:
    """``MAGIC ‖ suite ‖ u16 length ‖ message 1`` at the start of a tunnel connection's bytes,
    taken by its length prefix; None when ``stream`` is not (yet) a whole one."""
    head = PREAMBLE_BYTES + _LENGTH.size
    if not stream.startswith(MAGIC) or len(stream) < head:
        return None
    (length,) = _LENGTH.unpack_from(stream, PREAMBLE_BYTES)
    if len(stream) < head + length:
        return None
    return stream[: head + length]
