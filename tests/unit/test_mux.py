"""Multiplexer: two of them wired back to back with payloads and a hand-driven clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import (
    MAX_FRAME_PAYLOAD_BYTES,
    MAX_RECORD_PAYLOAD_BYTES,
)
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import (
    ConnectionTerminated,
    DatagramReceived,
    GoAwayReceived,
    PongReceived,
    RegistrationAnswered,
    RegistrationReceived,
    StreamClosed,
    StreamDataReceived,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamReset,
)
from raven.protocol.frame_backlog import CONTROL_FRAMES_PER_CALL
from raven.protocol.frames import (
    CreditFrame,
    DataFrame,
    EndFrame,
    OpenFrame,
    PingFrame,
    RegisterFrame,
    RegisterResultFrame,
    ResetFrame,
    encode_frame,
    parse_frames,
)
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from raven.protocol.registration import encode_register_result
from raven.protocol.streams import StreamState
from tests.helpers.mux import LIMITS, Pair, feed, received
from tests.helpers.sansio import events

# --------------------------------------------------------------------------- streams


def test_open_data_both_ways_half_close_and_close() -> None:
    pair = Pair()
    sid = pair.open()
    assert sid == 2  # responder ids are even
    assert pair.gateway.send_capacity(sid) == LIMITS.stream_window_bytes
    pair.gateway.send_stream_data(sid, b"GET /metrics HTTP/1.1\r\n\r\n")
    pair.gateway.end_stream(sid)
    pair.pump()
    evs = events(pair.agent)
    assert received(evs, sid) == b"GET /metrics HTTP/1.1\r\n\r\n"
    assert evs[-1] == StreamEnded(sid)
    assert pair.agent.stream_state(sid) is StreamState.HALF_CLOSED_REMOTE
    body = bytes(range(256)) * 1000
    sent = 0
    got = b""
    while sent < len(body) or len(got) < len(body):
        room = pair.agent.send_capacity(sid)
        if room and sent < len(body):
            pair.agent.send_stream_data(sid, body[sent : sent + room])
            sent += min(room, len(body) - sent)
        pair.pump()
        chunk = received(events(pair.gateway), sid)
        got += chunk
        pair.gateway.consume_stream_data(sid, len(chunk))
    assert got == body
    pair.agent.end_stream(sid)
    pair.pump()
    assert events(pair.gateway)[-2:] == [StreamEnded(sid), StreamClosed(sid)]
    assert events(pair.agent)[-1:] == [StreamClosed(sid)]
    assert pair.agent.open_streams == pair.gateway.open_streams == 0
    assert pair.agent.buffered_bytes == pair.gateway.buffered_bytes == 0


def test_agent_opens_with_odd_ids() -> None:
    pair = Pair()
    first = pair.agent.open_stream("gw", 1)
    second = pair.agent.open_stream("gw", 2)
    assert (first, second) == (1, 3)


def test_refuse() -> None:
    pair = Pair()
    sid = pair.gateway.open_stream("edge-gpu-9", 22)
    pair.pump()
    events(pair.agent)
    pair.agent.refuse_stream(sid, StreamCode.PORT_NOT_ALLOWED, "port 22 not allowed")
    pair.pump()
    assert events(pair.gateway) == [
        StreamRefused(sid, StreamCode.PORT_NOT_ALLOWED, "port 22 not allowed")
    ]
    assert pair.gateway.open_streams == pair.agent.open_streams == 0
    with pytest.raises(LocalProtocolError):
        pair.agent.refuse_stream(sid, StreamCode.OK)


def test_reset_mid_stream_and_late_frames_are_ignored() -> None:
    pair = Pair()
    sid = pair.open()
    pair.agent.send_stream_data(sid, b"x" * 1000)
    pair.flush(pair.agent, pair.gateway)
    pair.gateway.reset_stream(sid, StreamCode.CANCELLED, "scrape timeout")
    pair.gateway.reset_stream(sid, StreamCode.CANCELLED)  # idempotent
    assert pair.gateway.buffered_bytes == 0  # the stream's unread bytes are released
    pair.agent.send_stream_data(sid, b"late")  # crosses the RESET on the wire
    pair.pump()
    assert events(pair.agent)[-1] == StreamReset(
        sid, StreamCode.CANCELLED, "scrape timeout", by_peer=True
    )
    assert pair.gateway.open_streams == pair.agent.open_streams == 0
    assert pair.gateway.stats.streams_reset == {"cancelled": 1}
    pair.gateway.consume_stream_data(sid, 1000)  # the application catching up: ignored
    assert pair.agent.send_capacity(sid) == 0
    with pytest.raises(LocalProtocolError):
        pair.agent.send_stream_data(sid, b"x")


def test_send_beyond_capacity_is_a_local_error() -> None:
    pair = Pair()
    sid = pair.open()
    with pytest.raises(LocalProtocolError, match="credit"):
        pair.gateway.send_stream_data(sid, bytes(LIMITS.stream_window_bytes + 1))
    opening = pair.gateway.open_stream("n", 1)
    with pytest.raises(LocalProtocolError):
        pair.gateway.send_stream_data(opening, b"early")  # not accepted yet


def test_stalled_stream_stops_only_itself() -> None:
    """The agent's reader of one stream stalls; another stream keeps moving."""
    pair = Pair()
    stalled, moving = pair.open("a", 1), pair.open("b", 2)
    progress = {stalled: 0, moving: 0}
    chunk = bytes(8192)
    for _ in range(200):
        for sid in (stalled, moving):
            room = pair.gateway.send_capacity(sid)
            if room:
                pair.gateway.send_stream_data(sid, chunk[: min(room, len(chunk))])
        pair.pump()
        for event in events(pair.agent):
            if isinstance(event, StreamDataReceived):
                progress[event.stream_id] += len(event.data)
                if event.stream_id == moving:  # only this reader consumes
                    pair.agent.consume_stream_data(moving, len(event.data))
        events(pair.gateway)
    assert progress[stalled] == LIMITS.stream_window_bytes  # exactly one window, then stop
    assert pair.gateway.send_capacity(stalled) == 0
    assert progress[moving] >= 200 * len(chunk) - LIMITS.stream_window_bytes
    assert progress[moving] > 20 * progress[stalled]
    assert pair.agent.buffered_bytes == LIMITS.stream_window_bytes


def test_round_robin_is_fair_between_busy_streams() -> None:
    limits = replace(LIMITS, stream_window_bytes=4 * 1024 * 1024)
    pair = Pair(limits)
    ids = [pair.open(f"n{i}", 80) for i in range(3)]
    # one stream has a lot queued before the others have anything
    pair.gateway.send_stream_data(ids[0], bytes(3 * 1024 * 1024))
    pair.gateway.send_stream_data(ids[1], bytes(256 * 1024))
    pair.gateway.send_stream_data(ids[2], bytes(256 * 1024))
    counts = dict.fromkeys(ids, 0)
    for _ in range(8):  # 8 payloads of ~64 KiB: 512 KiB in all
        payload = pair.gateway.next_payload()
        assert payload is not None
        for frame in parse_frames(payload):
            if isinstance(frame, DataFrame):
                counts[frame.stream_id] += len(frame.data)
    spread = max(counts.values()) - min(counts.values())
    assert spread <= limits.max_frame_payload_bytes, counts
    while (payload := pair.gateway.next_payload()) is not None:  # everything drains
        for frame in parse_frames(payload):
            if isinstance(frame, DataFrame):
                counts[frame.stream_id] += len(frame.data)
    assert list(counts.values()) == [3 * 1024 * 1024, 256 * 1024, 256 * 1024]


def test_one_bulk_stream_fills_each_record_with_one_frame() -> None:
    pair = Pair(Limits())
    sid = pair.open()
    pair.gateway.send_stream_data(sid, bytes(Limits().stream_window_bytes))
    sizes = []
    while (payload := pair.gateway.next_payload()) is not None:
        (frame,) = parse_frames(payload)
        assert isinstance(frame, DataFrame)
        sizes.append(len(frame.data))
    assert sizes[:-1] == [Limits().max_frame_payload_bytes] * (len(sizes) - 1)


def test_control_frames_go_before_data() -> None:
    pair = Pair(replace(LIMITS, stream_window_bytes=1024 * 1024))
    sid = pair.open()
    pair.gateway.send_stream_data(sid, bytes(500_000))
    pair.gateway.reset_stream(pair.gateway.open_stream("x", 1), StreamCode.CANCELLED)
    payload = pair.gateway.next_payload()
    assert payload is not None
    frames = parse_frames(payload)
    assert [type(f) for f in frames[:3]] == [OpenFrame, CreditFrame, ResetFrame]
    assert isinstance(frames[-1], DataFrame)


def test_window_overrun_resets_only_that_stream() -> None:
    pair = Pair()
    victim, other = pair.open("a", 1), pair.open("b", 2)
    window = LIMITS.stream_window_bytes
    big = encode_frame(DataFrame(victim, bytes(window // 2)))
    for _ in range(2):
        pair.agent.receive_payload(big, 0.0)  # exactly the window: fine
    pair.agent.receive_payload(encode_frame(DataFrame(victim, b"!")), 0.0)
    evs = events(pair.agent)
    assert evs[-1] == StreamReset(
        victim, StreamCode.PROTOCOL_ERROR, "stream window exceeded", by_peer=False
    )
    assert pair.agent.buffered_bytes == 0
    assert not pair.agent.closed
    pair.gateway.send_stream_data(other, b"still fine")
    pair.pump()
    assert received(events(pair.agent), other) == b"still fine"
    assert StreamReset(
        victim, StreamCode.PROTOCOL_ERROR, "stream window exceeded", by_peer=True
    ) in events(pair.gateway)


def test_max_streams_refuses_busy() -> None:
    pair = Pair(LIMITS, gateway_limits=replace(LIMITS, max_streams=2))
    ids = [pair.agent.open_stream("gw", 80) for _ in range(3)]
    pair.pump()
    assert [type(e) for e in events(pair.gateway)] == [StreamOpened, StreamOpened]
    assert events(pair.agent) == [StreamRefused(ids[2], StreamCode.BUSY, "too many streams")]
    # the gateway's own opens beyond its limit are refused locally
    local = pair.gateway.open_stream("n", 1)
    assert events(pair.gateway) == [StreamRefused(local, StreamCode.BUSY, "too many streams")]


def test_tunnel_buffered_bytes_bound_streams_either_side_opened() -> None:
    """The receive windows of a tunnel's streams sum to at most max_tunnel_buffered_bytes,
    whether we opened them (the gateway's scrapes) or the peer did: windows shrink near
    the cap (16 KiB kept for each stream max_streams still allows), then BUSY."""
    kib = 1024
    cap = 160 * kib
    limits = replace(LIMITS, stream_window_bytes=64 * kib, max_streams=4)
    pair = Pair(limits, gateway_limits=replace(limits, max_tunnel_buffered_bytes=cap))
    ours = [pair.gateway.open_stream("n", 80) for _ in range(3)]
    pair.pump()
    for sid in ours:
        pair.agent.accept_stream(sid)
    theirs = pair.agent.open_stream("gw", 80)  # the peer's stream shares the same cap
    pair.pump()
    events(pair.agent)
    assert [type(e) for e in events(pair.gateway)].count(StreamOpened) == 1
    pair.gateway.accept_stream(theirs)
    pair.pump()
    capacities = [pair.agent.send_capacity(sid) for sid in [*ours, theirs]]
    assert capacities == [64 * kib, 64 * kib, 16 * kib, 16 * kib]
    for sid, capacity in zip([*ours, theirs], capacities, strict=True):
        pair.agent.send_stream_data(sid, bytes(capacity))  # the peer sends all it may
    pair.pump()
    events(pair.gateway)
    assert pair.gateway.buffered_bytes == cap
    more = pair.gateway.open_stream("n", 80)
    assert events(pair.gateway) == [StreamRefused(more, StreamCode.BUSY, "too many streams")]
    pair.gateway.reset_stream(ours[0], StreamCode.CANCELLED)  # frees its 64 KiB
    again = pair.gateway.open_stream("n", 80)
    pair.pump()
    assert StreamOpened(again, "n", 80) in events(pair.agent)


# --------------------------------------------------------------------------- stream id rules


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (OpenFrame(1, "n", 1), "wrong parity"),  # the gateway's peer opens odd ids, not even
        (DataFrame(9, b"x"), "never opened"),
        (CreditFrame(8, 5), "never opened"),
        (EndFrame(4), "never opened"),
    ],
)
def test_stream_id_violations(
    frame: DataFrame | OpenFrame | CreditFrame | EndFrame, message: str
) -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError, match=message):
        pair.agent.receive_payload(encode_frame(frame), 0.0)


def test_reused_stream_id_is_a_protocol_error() -> None:
    pair = Pair()
    pair.agent.receive_payload(encode_frame(OpenFrame(4, "n", 1)), 0.0)
    with pytest.raises(RemoteProtocolError, match="reused"):
        pair.agent.receive_payload(encode_frame(OpenFrame(2, "n", 1)), 0.0)


def test_data_before_accept_is_a_protocol_error() -> None:
    pair = Pair()
    sid = pair.gateway.open_stream("n", 1)
    pair.pump()
    with pytest.raises(RemoteProtocolError, match="recv_data"):
        pair.gateway.receive_payload(encode_frame(DataFrame(sid, b"x")), 0.0)


# --------------------------------------------------------------------------- datagrams


def test_datagrams_and_their_limits() -> None:
    limits = replace(LIMITS, max_queued_datagrams=3, max_datagram_bytes=1500)
    pair = Pair(limits)
    packets = [bytes([0x45]) + bytes(i) for i in range(1, 4)]
    assert all(pair.agent.send_datagram(p) for p in packets)
    assert not pair.agent.send_datagram(b"\x45")  # queue full: dropped, never blocks
    assert not pair.agent.send_datagram(bytes(1501))  # oversize
    assert pair.agent.stats.datagrams_dropped == {"queue_full": 1, "oversize": 1}
    pair.pump()
    assert events(pair.gateway) == [DatagramReceived(p) for p in packets]
    small = Multiplexer(initiator=False, limits=replace(limits, max_datagram_bytes=10), now=0.0)
    big = Multiplexer(initiator=True, limits=limits, now=0.0)
    small.confirm(0.0)
    big.confirm(0.0)
    assert big.send_datagram(bytes(11))
    payload = big.next_payload()
    assert payload is not None
    small.receive_payload(payload, 0.0)
    assert events(small) == []
    assert small.stats.datagrams_dropped == {"oversize_received": 1}


def test_largest_datagrams_go_out_even_beside_busy_streams() -> None:
    pair = Pair(Limits())
    sid = pair.open()
    pair.gateway.send_stream_data(sid, bytes(500_000))
    assert not pair.gateway.send_datagram(bytes(MAX_FRAME_PAYLOAD_BYTES + 1))  # cannot fit a record
    assert pair.gateway.stats.datagrams_dropped == {"oversize": 1}
    assert pair.gateway.send_datagram(bytes(MAX_FRAME_PAYLOAD_BYTES))
    assert pair.gateway.send_datagram(bytes(40_000))
    pair.pump()
    sizes = [len(e.data) for e in events(pair.agent) if isinstance(e, DatagramReceived)]
    assert sizes == [MAX_FRAME_PAYLOAD_BYTES, 40_000]


def test_datagrams_do_not_starve_streams() -> None:
    pair = Pair(replace(LIMITS, max_queued_datagrams=10_000))
    sid = pair.open()
    pair.gateway.send_stream_data(sid, bytes(60_000))
    for _ in range(2000):
        pair.gateway.send_datagram(bytes(1000))
    payload = pair.gateway.next_payload()
    assert payload is not None
    data = sum(len(f.data) for f in parse_frames(payload) if isinstance(f, DataFrame))
    assert data >= MAX_RECORD_PAYLOAD_BYTES // 4


# --------------------------------------------------------------------------- keepalive


def test_keepalive_ping_measures_rtt() -> None:
    pair = Pair()
    assert pair.agent.get_timer() == LIMITS.keepalive_interval_s
    pair.now = LIMITS.keepalive_interval_s
    pair.agent.handle_timer(pair.now)
    pair.flush(pair.agent, pair.gateway)
    pair.now += 0.25
    pair.flush(pair.gateway, pair.agent)
    assert events(pair.agent) == [PongReceived(0.25)]
    assert pair.agent.rtt_s == 0.25
    assert pair.agent.stats.frames_sent["ping"] == 1
    assert pair.gateway.stats.frames_sent["pong"] == 1
    assert pair.agent.get_timer() == 2 * LIMITS.keepalive_interval_s


@pytest.mark.parametrize("side", ["agent", "gateway"])
def test_dead_peer_is_detected_and_streams_reset(side: str) -> None:
    pair = Pair()
    s1, s2 = pair.open("a", 1), pair.open("b", 2)
    mux = getattr(pair, side)
    now = 0.0
    while not mux.closed:  # the peer is silent: run timers only
        timer = mux.get_timer()
        assert timer is not None
        now = timer
        mux.handle_timer(now)
    assert now == LIMITS.dead_peer_timeout_s
    evs = events(mux)
    assert evs == [
        StreamReset(s1, StreamCode.TUNNEL_CLOSED, "nothing heard from the peer for 15s", False),
        StreamReset(s2, StreamCode.TUNNEL_CLOSED, "nothing heard from the peer for 15s", False),
        ConnectionTerminated(
            CloseCode.KEEPALIVE_TIMEOUT, "nothing heard from the peer for 15s", False
        ),
    ]
    assert mux.get_timer() is None
    with pytest.raises(LocalProtocolError):
        mux.open_stream("x", 1)


def test_live_peer_is_never_declared_dead() -> None:
    pair = Pair()
    for _ in range(20):
        for mux in (pair.agent, pair.gateway):
            timer = mux.get_timer()
            assert timer is not None
            pair.now = max(pair.now, timer)
            mux.handle_timer(pair.now)
        pair.pump()
    assert pair.now > 3 * LIMITS.dead_peer_timeout_s
    assert not pair.agent.closed and not pair.gateway.closed


# --------------------------------------------------------------------------- drain and close


def test_go_away_drains() -> None:
    pair = Pair()
    sid = pair.open()
    pair.gateway.go_away(CloseCode.DRAINED, "shutting down", now=0.0)
    with pytest.raises(LocalProtocolError, match="draining"):
        pair.gateway.open_stream("n", 1)
    pair.pump()
    assert events(pair.agent) == [GoAwayReceived(CloseCode.DRAINED, "shutting down")]
    assert pair.agent.draining
    with pytest.raises(LocalProtocolError, match="draining"):
        pair.agent.open_stream("n", 1)
    # the open stream still finishes
    pair.gateway.send_stream_data(sid, b"last scrape")
    pair.gateway.end_stream(sid)
    pair.pump()
    assert received(events(pair.agent), sid) == b"last scrape"
    pair.agent.end_stream(sid)
    pair.pump()
    assert events(pair.gateway)[-1] == StreamClosed(sid)
    assert pair.gateway.open_streams == 0


def test_open_crossing_go_away_is_refused_draining() -> None:
    pair = Pair()
    pair.gateway.go_away(CloseCode.DRAINED, "", now=0.0)
    sid = pair.agent.open_stream("gw", 80)  # the agent has not seen GOAWAY yet
    pair.pump()
    assert StreamRefused(sid, StreamCode.DRAINING, "tunnel is draining") in events(pair.agent)


def test_drain_timeout_resets_remaining_streams() -> None:
    pair = Pair()
    sid = pair.open()
    pair.gateway.go_away(CloseCode.DRAINED, "", now=1.0)
    pair.pump()
    assert pair.gateway.get_timer() == LIMITS.keepalive_interval_s
    now = 1.0 + LIMITS.drain_timeout_s
    pair.gateway._keepalive.last_received = now  # pretend the peer stayed alive
    pair.gateway.handle_timer(now)
    assert events(pair.gateway) == [StreamReset(sid, StreamCode.DRAINING, "drain timeout", False)]
    pair.pump()
    assert events(pair.agent)[-1] == StreamReset(
        sid, StreamCode.DRAINING, "drain timeout", by_peer=True
    )


def test_close_resets_streams_on_both_sides() -> None:
    pair = Pair()
    sid = pair.open()
    pair.agent.close(CloseCode.NORMAL, "bye")
    assert events(pair.agent) == [
        StreamReset(sid, StreamCode.TUNNEL_CLOSED, "bye", False),
        ConnectionTerminated(CloseCode.NORMAL, "bye", False),
    ]
    pair.pump()
    assert events(pair.gateway) == [
        StreamReset(sid, StreamCode.TUNNEL_CLOSED, "bye", False),
        ConnectionTerminated(CloseCode.NORMAL, "bye", True),
    ]
    assert not pair.agent.send_datagram(b"x")
    assert pair.agent.next_payload() is None


# --------------------------------------------------------------------------- registration


def test_registration_of_ten_thousand_nodes() -> None:
    pair = Pair()
    nodes = [f"edge-gpu-{i}.site-{i % 50}.example" for i in range(10_000)]
    prefixes = ["10.20.0.0/16", "fd00:20::/64"]
    pair.agent.register(nodes, prefixes)
    pair.pump()
    assert pair.agent.stats.frames_sent["register"] > 3
    assert events(pair.gateway) == [RegistrationReceived(tuple(nodes), tuple(prefixes))]
    refused = tuple((n, "not authorised for this agent") for n in nodes[5000:])
    answer = encode_register_result(nodes[:5000], prefixes[:1], refused, pair.gateway.chunk_bytes)
    pair.gateway.answer_registration(answer)
    pair.pump()
    assert events(pair.agent) == [
        RegistrationAnswered(tuple(nodes[:5000]), tuple(prefixes[:1]), refused)
    ]
    # a new registration replaces the old set as a whole
    pair.agent.register(nodes[:2], [])
    pair.pump()
    assert events(pair.gateway) == [RegistrationReceived(tuple(nodes[:2]), ())]


def test_registration_roles_and_limits() -> None:
    pair = Pair(replace(LIMITS, max_registration_entries=10))
    with pytest.raises(LocalProtocolError):
        pair.gateway.register(["n"], [])
    with pytest.raises(LocalProtocolError):
        pair.agent.answer_registration(encode_register_result(["n"], [], []))
    with pytest.raises(LocalProtocolError):
        pair.agent.register([f"n{i}" for i in range(11)], [])
    with pytest.raises(RemoteProtocolError, match="REGISTER sent"):
        pair.agent.receive_payload(encode_frame(RegisterFrame(("n",), (), True)), 0.0)
    with pytest.raises(RemoteProtocolError, match="REGISTER_RESULT sent"):
        pair.gateway.receive_payload(encode_frame(RegisterResultFrame((), (), (), True)), 0.0)
    chunk = encode_frame(RegisterFrame(tuple(f"n{i}" for i in range(6)), (), False))
    pair.gateway.receive_payload(chunk, 0.0)
    with pytest.raises(RemoteProtocolError, match="max_registration_entries") as info:
        pair.gateway.receive_payload(chunk, 0.0)
    assert info.value.code is CloseCode.LIMIT_EXCEEDED


UNBUDGETED = replace(LIMITS, max_control_frames_per_s=1e9, max_control_bytes_per_s=1e12)


def _terminated(mux: Multiplexer) -> ConnectionTerminated:
    terminated = [e for e in events(mux) if isinstance(e, ConnectionTerminated)]
    assert len(terminated) == 1, "the tunnel was not closed"
    return terminated[0]


def test_ping_flood_without_reading_hits_the_control_limit() -> None:
    pair = Pair(UNBUDGETED)
    pings = encode_frame(PingFrame(bytes(8))) * 4000
    for _ in range(100):
        feed(pair.gateway, pings, 0.0)
    terminated = _terminated(pair.gateway)
    assert terminated.code is CloseCode.LIMIT_EXCEEDED and "control frames" in terminated.reason


def test_refusals_and_registration_answers_count_against_the_control_limit() -> None:
    """Replies the application gives to the peer's frames (refusals, registration
    answers) fill the same bounded queue as PONGs: a peer that opens streams the
    gateway refuses, and never reads, gets the tunnel closed."""
    pair = Pair(replace(UNBUDGETED, max_streams=1 << 20))
    for round_ in range(40):
        base = round_ * 8000
        opens = (encode_frame(OpenFrame(base + i, "edge-x-1", 80)) for i in range(1, 8001, 2))
        feed(pair.gateway, b"".join(opens), 0.0)
        for event in events(pair.gateway):
            if isinstance(event, StreamOpened) and not pair.gateway.closed:
                pair.gateway.refuse_stream(event.stream_id, StreamCode.UNKNOWN_NODE, "unknown")
            if isinstance(event, ConnectionTerminated):
                assert event.code is CloseCode.LIMIT_EXCEEDED
                return
    raise AssertionError("refusals were queued without bound")


def test_control_budget_closes_a_flooding_peer_and_spares_a_steady_one() -> None:
    limits = replace(LIMITS, max_control_frames_per_s=1000.0, control_burst_s=2.0)
    steady = Pair(limits)
    for tick in range(100):  # 500 pings/s for 10 s: within the budget
        steady.now = tick * 0.1
        steady.gateway.receive_payload(encode_frame(PingFrame(bytes(8))) * 50, steady.now)
        steady.pump()
    assert not steady.gateway.closed
    flood = Pair(limits)
    for tick in range(100):  # 5,000 pings/s
        flood.gateway.receive_payload(encode_frame(PingFrame(bytes(8))) * 500, tick * 0.1)
        flood.pump()
    terminated = _terminated(flood.gateway)
    assert terminated.code is CloseCode.LIMIT_EXCEEDED
    assert terminated.reason == "control budget exceeded (1000 frames/s)"
    assert flood.gateway.stats.control_budget_exceeded == 1


def test_registration_entries_count_against_the_control_budget() -> None:
    limits = replace(LIMITS, max_control_frames_per_s=1000.0, control_burst_s=2.0)
    pair = Pair(limits)
    names = tuple(f"edge-{i}" for i in range(1500))
    pair.gateway.receive_payload(encode_frame(RegisterFrame(names, (), True)), 0.0)
    assert not pair.gateway.closed  # one registration of 1,500 fits the 2,000 burst
    pair.gateway.receive_payload(encode_frame(RegisterFrame(names, (), True)), 0.1)
    assert _terminated(pair.gateway).reason == "control budget exceeded (1000 frames/s)"


def test_datagram_queue_is_bounded_in_bytes_too() -> None:
    from raven.protocol.limits import Limits
    from raven.protocol.mux import Multiplexer

    limits = Limits(max_queued_datagrams=1000, max_queued_datagram_bytes=200_000)
    mux = Multiplexer(initiator=True, limits=limits, now=0.0)
    mux.confirm(0.0)
    packet = bytes(60_000)
    accepted = [mux.send_datagram(packet) for _ in range(5)]
    assert accepted == [True, True, True, False, False]
    assert mux.stats.datagrams_dropped["queue_full"] == 2
    while mux.next_payload() is not None:  # drained: room again
        pass
    assert mux.send_datagram(packet)


def test_a_payload_of_many_opens_is_acted_on_a_bounded_number_per_call() -> None:
    """1,000 OPENs in one payload: CONTROL_FRAMES_PER_CALL of them are acted on at once,
    the rest in later resume_input calls (an adapter's later turns), in order; a frame of a
    later payload waits behind them."""
    pair = Pair(replace(LIMITS, max_streams=4096))
    gateway = pair.gateway
    opens = b"".join(encode_frame(OpenFrame(i, "edge-x-1", 80)) for i in range(1, 2001, 2))
    gateway.receive_payload(opens, 0.0)
    first = events(gateway)
    assert len(first) == CONTROL_FRAMES_PER_CALL and gateway.backlog.pending
    gateway.receive_payload(encode_frame(ResetFrame(1, StreamCode.CANCELLED, "late")), 0.0)
    calls, later = 0, events(gateway)  # that call acted on the next OPENs, not the RESET
    assert len(later) == CONTROL_FRAMES_PER_CALL
    while gateway.backlog.pending:
        gateway.resume_input(0.0)
        got = events(gateway)
        assert len([e for e in got if isinstance(e, StreamOpened)]) <= CONTROL_FRAMES_PER_CALL
        later += got
        calls += 1
    assert calls == -(-1001 // CONTROL_FRAMES_PER_CALL) - 2  # two receive_payload calls
    opened = [e.stream_id for e in first + later if isinstance(e, StreamOpened)]
    assert opened == list(range(1, 2001, 2))
    assert later[-1] == StreamReset(1, StreamCode.CANCELLED, "late", by_peer=True)


def test_closing_the_tunnel_drops_the_frames_that_wait() -> None:
    pair = Pair(replace(LIMITS, max_streams=4096))
    opens = b"".join(encode_frame(OpenFrame(i, "edge-x-1", 80)) for i in range(1, 2001, 2))
    pair.gateway.receive_payload(opens, 0.0)
    pair.gateway.close(CloseCode.NORMAL, "bye")
    assert not pair.gateway.backlog.pending
    pair.gateway.resume_input(0.0)  # nothing left to act on: a no-op
