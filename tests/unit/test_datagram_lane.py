"""The datagram lane (TunnelConnection.seal_lone_datagram, and receive_data's one-record
path): a lone L3 packet sealed into its own record and returned at once, and a read of
exactly one record of one DATAGRAM frame handed to the sink without the message splitter or
the frame queue. The lane must be invisible on the wire and in the counters: what it sends
reads like a queued datagram, it steps aside whenever order, keys or state say so, and any
mix of lane and queue delivers every packet once, in order, with both ends' counters agreeing.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode
from raven.protocol.connection import TunnelConnection
from raven.protocol.datagram_path import datagram_header, lone_datagram, split_datagrams
from raven.protocol.events import ConnectionTerminated, DatagramReceived
from raven.protocol.frames import DatagramFrame, PingFrame, encode_frame
from raven.protocol.lifecycle import TunnelState
from tests.helpers.sansio import LIMITS, connected, events, make_agent, open_stream, pump

PACKET = b"\x45" + bytes(83)  # a ping's size


def with_sink(conn: TunnelConnection) -> list[bytes]:
    got: list[bytes] = []
    conn.set_datagram_sink(got.append)
    return got


def counters(conn: TunnelConnection) -> tuple[object, ...]:
    s = conn.stats
    return (s.frames_sent, s.frames_received, s.datagrams_sent, s.datagrams_received,
            s.wire.records_sent, s.wire.records_received, s.wire.bytes_sent,
            s.wire.bytes_received)  # fmt: skip


def test_a_lone_datagram_is_a_record_of_one_datagram_frame() -> None:
    agent, gateway = connected()
    got = with_sink(gateway)
    wire = agent.seal_lone_datagram(PACKET, 1.0)
    assert wire is not None
    assert not agent.has_data_to_send  # returned, not queued
    assert gateway.receive_data(wire, 1.0) is False  # nothing else to act on
    assert got == [PACKET]
    assert events(gateway) == []


def test_the_lane_counts_exactly_what_the_queue_counts() -> None:
    lane_agent, lane_gateway = connected()
    queue_agent, queue_gateway = connected()
    with_sink(lane_gateway)
    with_sink(queue_gateway)
    before = counters(lane_agent), counters(lane_gateway)
    assert before == (counters(queue_agent), counters(queue_gateway))
    for i in range(3):
        packet = PACKET[:-1] + bytes([i])
        wire = lane_agent.seal_lone_datagram(packet, 1.0)
        assert wire is not None
        assert lane_gateway.receive_data(wire, 1.0) is False
        assert queue_agent.send_datagram(packet)
        queued = queue_agent.data_to_send()
        assert len(wire) == len(queued)  # the same record format, byte for byte in size
        assert queue_gateway.receive_data(queued, 1.0) is False  # one record, one DATAGRAM
    assert counters(lane_agent) == counters(queue_agent)
    assert counters(lane_gateway) == counters(queue_gateway)
    assert lane_agent.stats.frames_sent["datagram"] == 3
    assert lane_gateway.stats.frames_received["datagram"] == 3


def test_a_lane_record_reads_on_the_generic_path_too() -> None:
    agent, gateway = connected()  # no sink: packets are events, the lane does not take them
    wire = agent.seal_lone_datagram(PACKET, 1.0)
    assert wire is not None
    assert gateway.receive_data(wire, 1.0) is True
    assert events(gateway) == [DatagramReceived(PACKET)]
    two = agent.seal_lone_datagram(b"\x45a", 1.0), agent.seal_lone_datagram(b"\x45b", 1.0)
    got = with_sink(gateway)
    assert None not in two
    assert gateway.receive_data(b"".join(w for w in two if w), 1.0) is True  # two records
    assert got == [b"\x45a", b"\x45b"]


def test_the_lane_steps_aside_for_anything_queued_and_keeps_the_order() -> None:
    agent, gateway = connected()
    got = with_sink(gateway)
    assert agent.send_datagram(b"\x45first")  # queued, not yet taken
    assert agent.seal_lone_datagram(b"\x45second", 1.0) is None
    assert agent.send_datagram(b"\x45second")
    pump(agent, gateway)
    assert got == [b"\x45first", b"\x45second"]
    sid = open_stream(agent, gateway)
    agent.send_stream_data(sid, b"stream bytes")  # stream data waits: the lane steps aside
    assert agent.seal_lone_datagram(PACKET, 1.0) is None
    pump(agent, gateway)
    assert agent.seal_lone_datagram(PACKET, 1.0) is not None  # nothing waits any more


def test_the_lane_refuses_out_of_bounds_packets_and_leaves_the_drop_to_the_queue() -> None:
    agent, _ = connected(replace(LIMITS, max_datagram_bytes=100))
    assert agent.seal_lone_datagram(b"", 1.0) is None
    assert agent.seal_lone_datagram(bytes(101), 1.0) is None
    assert agent.seal_lone_datagram(bytes(100), 1.0) is not None
    assert not agent.send_datagram(bytes(101))
    assert agent.stats.datagrams_dropped == {"oversize": 1}
    assert agent.stats.datagrams_sent == 1


def test_the_lane_waits_for_the_handshake_and_stops_at_drain_and_close() -> None:
    agent, gateway = connected()
    assert make_agent().seal_lone_datagram(PACKET, 0.0) is None  # still handshaking
    agent.go_away(CloseCode.DRAINED, "bye")
    assert agent.seal_lone_datagram(PACKET, 1.0) is None  # draining: the queue's rules
    pump(agent, gateway)
    gateway.close(CloseCode.NORMAL, "done")
    assert gateway.seal_lone_datagram(PACKET, 1.0) is None
    assert any(isinstance(e, ConnectionTerminated) for e in events(gateway))


def test_a_key_update_due_sends_the_packet_through_the_queue_which_rekeys_first() -> None:
    agent, gateway = connected(replace(LIMITS, rekey_after_records=3))
    got = with_sink(gateway)
    sent = 0
    for i in range(8):
        packet = b"\x45" + bytes([i])
        wire = agent.seal_lone_datagram(packet, 1.0)
        if wire is None:  # the key is due: the queue sends KEY_UPDATE, then the packet
            assert agent.send_datagram(packet)
            wire = agent.data_to_send()
        else:
            sent += 1
        gateway.receive_data(wire, 1.0)
    assert got == [b"\x45" + bytes([i]) for i in range(8)]
    assert agent.stats.wire.rekeys_sent == gateway.stats.wire.rekeys_received >= 2
    assert 0 < sent < 8


def test_a_rehandshake_in_flight_sends_through_the_queue() -> None:
    limits = replace(
        LIMITS, rehandshake_after_s=60.0, keepalive_interval_s=500.0, dead_peer_timeout_s=900.0
    )
    agent, gateway = connected(limits)
    got = with_sink(gateway)
    agent.handle_timer(60.5)  # due: message 1 goes out inside the session
    assert agent.seal_lone_datagram(PACKET, 60.5) is None  # keys changing: the queue only
    assert agent.send_datagram(PACKET)
    pump(agent, gateway, 60.5)
    assert got == [PACKET]
    assert agent.stats.wire.rehandshakes == gateway.stats.wire.rehandshakes == 1
    wire = agent.seal_lone_datagram(PACKET, 61.0)  # switched: the lane again, new keys
    assert wire is not None
    assert gateway.receive_data(wire, 61.0) is False
    assert got == [PACKET, PACKET]


def test_reads_that_are_not_one_datagram_record_take_the_generic_path() -> None:
    agent, gateway = connected()
    got = with_sink(gateway)
    assert agent.send_datagram(b"\x45a")
    agent.handle_timer(agent.get_timer() or 0.0)  # a keepalive PING is due
    assert gateway.receive_data(agent.data_to_send(), 1.0) is True  # DATAGRAM + PING
    assert got == [b"\x45a"]
    assert gateway.has_data_to_send  # the PONG
    wire = agent.seal_lone_datagram(PACKET, 1.0)
    assert wire is not None
    assert gateway.receive_data(wire[:10], 1.0) is True  # a partial record: held
    assert gateway.receive_data(wire[10:], 1.0) is False  # completed: one DATAGRAM
    assert got == [b"\x45a", PACKET]


def test_a_forged_lone_record_fails_the_tunnel_as_any_record_would() -> None:
    agent, gateway = connected()
    got = with_sink(gateway)
    wire = bytearray(agent.seal_lone_datagram(PACKET, 1.0) or b"")
    wire[-1] ^= 1
    assert gateway.receive_data(bytes(wire), 1.0) is True
    assert got == []
    terminated = [e for e in events(gateway) if isinstance(e, ConnectionTerminated)]
    assert [e.code for e in terminated] == [CloseCode.AUTH_FAILED]
    assert gateway.state is TunnelState.CLOSED


def test_lone_datagram_agrees_with_split_datagrams() -> None:
    frame = encode_frame(DatagramFrame(PACKET))
    assert frame[:8] == datagram_header(len(PACKET))
    assert lone_datagram(frame) == PACKET == (split_datagrams(frame) or [b""])[0]
    assert lone_datagram(frame + frame) is None  # two frames: split_datagrams' job
    assert lone_datagram(frame[:-1]) is None
    assert lone_datagram(encode_frame(PingFrame(bytes(8)))) is None


# --------------------------------------------------------------------------- property

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("lane"), st.integers(0, 140)),
        st.tuples(st.just("queue"), st.integers(0, 140)),
        st.tuples(st.just("stream"), st.integers(1, 300)),
        st.tuples(st.just("deliver"), st.sampled_from(["whole", "split", "bytewise"])),
    ),
    max_size=40,
)


@given(_ops)
def test_any_mix_of_lane_and_queue_delivers_every_packet_once_in_order(
    ops: list[tuple[str, int | str]],
) -> None:
    limits = replace(LIMITS, max_datagram_bytes=120, rekey_after_records=4)
    agent, gateway = connected(limits)
    got = with_sink(gateway)
    sid = open_stream(agent, gateway)
    accepted: list[bytes] = []
    wire = bytearray()
    for n, (op, arg) in enumerate(ops):
        if op in ("lane", "queue"):
            size = int(arg)
            packet = (bytes([0x45, n % 256]) + bytes(size))[:size]
            sealed = agent.seal_lone_datagram(packet, 1.0) if op == "lane" else None
            if sealed is not None:
                wire += sealed  # nothing was queued before it (else the lane steps aside)
                accepted.append(packet)
            elif agent.send_datagram(packet):
                accepted.append(packet)
        elif op == "stream":
            agent.send_stream_data(sid, bytes(int(arg)))
        else:
            wire += agent.data_to_send()
            cut = {"whole": len(wire), "split": len(wire) // 2, "bytewise": 7}[str(arg)]
            for i in range(0, len(wire), max(1, cut)):
                gateway.receive_data(bytes(wire[i : i + max(1, cut)]), 1.0)
            wire.clear()
    wire += agent.data_to_send()
    gateway.receive_data(bytes(wire), 1.0)
    assert got == accepted
    assert agent.state is gateway.state is TunnelState.OPEN
    a, g = agent.stats, gateway.stats
    assert a.datagrams_sent == g.datagrams_received == len(accepted)
    assert a.frames_sent.get("datagram", 0) == g.frames_received.get("datagram", 0)
    assert (a.wire.records_sent, a.wire.bytes_sent, a.wire.rekeys_sent) == (
        g.wire.records_received, g.wire.bytes_received, g.wire.rekeys_received,
    )  # fmt: skip
    assert a.datagrams_dropped.get("oversize", 0) == sum(
        1 for op, arg in ops if op in ("lane", "queue") and not 0 < int(arg) <= 120
    )
