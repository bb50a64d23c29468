"""tests/helpers/e2e/capture.py without a network: frames parsed, TCP segments reassembled in
sequence order (out of order, retransmitted, with a hole), and a tunnel's message 1 found by its
framing in a real agent's first bytes."""

from __future__ import annotations

import socket
import struct

from raven import keys
from raven.protocol.constants import MAGIC
from raven.protocol.limits import Limits
from raven.protocol.suites import PREAMBLE_BYTES
from tests.helpers.e2e.capture import ETH_P_IP, Flow, Segments, handshake_message_1, parse_tcp
from tests.helpers.sansio import initiator

SRC, DST = "10.200.2.2", "10.96.0.2"


def frame(seq: int, payload: bytes, *, dport: int = 10262, proto: int = 6) -> bytes:
    """An Ethernet frame carrying one IPv4 TCP segment (checksums left zero: not checked)."""
    tcp = struct.pack(">HHIIBBHHH", 40000, dport, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, proto, 0,
                     socket.inet_aton(SRC), socket.inet_aton(DST))  # fmt: skip
    return b"\x02" * 6 + b"\x04" * 6 + struct.pack(">H", ETH_P_IP) + ip + tcp + b"\x00" * 6


def first_bytes() -> bytes:
    """What a real agent writes first on a tunnel connection."""
    gateway = keys.public_key(keys.generate_private_key())
    return initiator(keys.generate_private_key(), gateway, Limits()).data_to_send()


def test_a_frame_gives_its_flow_sequence_and_payload_without_the_ethernet_padding() -> None:
    parsed = parse_tcp(frame(1000, b"RVN1"))
    assert parsed == (Flow(SRC, 40000, DST, 10262), 1000, b"RVN1")
    assert parse_tcp(frame(1000, b"x", proto=17)) is None  # not TCP
    assert parse_tcp(b"\x00" * 60) is None  # not IPv4


def test_message_1_is_taken_by_its_length_prefix_from_reordered_segments() -> None:
    sent = first_bytes() + b"\x00\x11" + b"r" * 17  # then a record follows on the wire
    segs = Segments()
    for seq, chunk in ((7, sent[7:50]), (0, sent[:7]), (50, sent[50:]), (7, sent[7:50])):
        segs.add(5000 + seq, chunk)
    message = handshake_message_1(segs.stream())
    assert message is not None and message.startswith(MAGIC)
    (length,) = struct.unpack_from(">H", message, PREAMBLE_BYTES)  # after magic and suite
    assert len(message) == PREAMBLE_BYTES + 2 + length
    assert sent.startswith(message) and sent[len(message) :] == b"\x00\x11" + b"r" * 17


def test_a_hole_or_a_short_stream_gives_no_message() -> None:
    sent = first_bytes()
    segs = Segments()
    segs.add(0, sent[:10])
    segs.add(20, sent[20:])  # bytes 10..19 were not captured
    assert segs.stream() == sent[:10]
    assert handshake_message_1(segs.stream()) is None
    assert handshake_message_1(sent[:-1]) is None
    assert handshake_message_1(b"GET / HTTP/1.1\r\n" + sent) is None
    assert handshake_message_1(sent) == sent
