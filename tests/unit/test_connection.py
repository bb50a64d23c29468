"""TunnelConnection: two of them back to back, handshake to close, with a hand-driven clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.connection import HANDSHAKE_TIMEOUT_REASON, Role, TunnelConnection
from raven.protocol.errors import LocalProtocolError
from raven.protocol.events import (
    ConnectionTerminated,
    DatagramReceived,
    HandshakeCompleted,
    PongReceived,
    RegistrationAnswered,
    RegistrationReceived,
    StreamDataReceived,
    StreamOpened,
    StreamReset,
)
from raven.protocol.frames import FrameType
from raven.protocol.handshake import ReplayGuard
from raven.protocol.lifecycle import TunnelState
from raven.protocol.noise import generate_keypair
from raven.protocol.secure_channel import SecureChannel
from raven.protocol.suites import Suite, preamble
from tests.helpers.sansio import (
    AGENT_PUB,
    GW_PRIV,
    GW_PUB,
    LIMITS,
    T0_NS,
    connected,
    events,
    holds_aead,
    make_agent,
    make_gateway,
    open_stream,
    pump,
)


def read_all(conn: TunnelConnection, sid: int) -> bytes:
    data = b"".join(
        e.data for e in events(conn) if isinstance(e, StreamDataReceived) and e.stream_id == sid
    )
    conn.consume_stream_data(sid, len(data))
    return data


def test_handshake_then_streams_and_datagrams() -> None:
    agent, gateway = connected()
    assert agent.handshake_complete and gateway.handshake_complete
    assert gateway.remote_static == AGENT_PUB
    sid = open_stream(agent, gateway)
    gateway.send_stream_data(sid, b"GET /metrics HTTP/1.1\r\nHost: edge-gpu-1:9400\r\n\r\n")
    pump(agent, gateway)
    assert read_all(agent, sid).startswith(b"GET /metrics")
    body = b"# HELP x\n" * 50_000  # more than one window: credit must flow back
    sent = 0
    got = b""
    while len(got) < len(body):
        room = min(agent.send_capacity(sid), len(body) - sent)
        if room:
            agent.send_stream_data(sid, body[sent : sent + room])
            sent += room
        pump(agent, gateway)
        got += read_all(gateway, sid)
    assert got == body
    assert agent.send_datagram(b"\x45" + bytes(59))
    pump(agent, gateway)
    assert events(gateway) == [DatagramReceived(b"\x45" + bytes(59))]
    stats = agent.stats
    assert stats.wire.bytes_sent > len(body) and stats.wire.records_sent >= 7
    assert stats.frames_sent["data"] >= 1 and gateway.stats.frames_received["data"] >= 1
    assert gateway.stats.wire.bytes_received == stats.wire.bytes_sent
    assert stats.wire is agent._channel.stats  # the channel's own counters, not a copy


def test_registration_through_the_tunnel() -> None:
    agent, gateway = connected()
    agent.register(["edge-gpu-1", "edge-gpu-2"], ["10.20.0.0/16"])
    pump(agent, gateway)
    assert events(gateway) == [
        RegistrationReceived(("edge-gpu-1", "edge-gpu-2"), ("10.20.0.0/16",))
    ]
    gateway.answer_registration(["edge-gpu-1"], [], [("edge-gpu-2", "not authorised")])
    gateway.answer_registration(["edge-gpu-1"], [], [("10.20.0.0/16", "not authorised")])
    pump(agent, gateway)
    assert events(agent)[0] == RegistrationAnswered(
        ("edge-gpu-1",), (), (("edge-gpu-2", "not authorised"),)
    )


def test_data_to_send_respects_max_bytes() -> None:
    agent, gateway = connected(replace(LIMITS, stream_window_bytes=1024 * 1024))
    sid = open_stream(agent, gateway)
    gateway.send_stream_data(sid, bytes(1024 * 1024))
    chunk = gateway.data_to_send(max_bytes=100_000)
    assert 100_000 <= len(chunk) < 100_000 + 2 * 65_600
    assert gateway.has_data_to_send
    agent.receive_data(chunk + gateway.data_to_send(), 0.0)
    assert len(read_all(agent, sid)) == 1024 * 1024
    assert not gateway.has_data_to_send


def test_rekey_through_the_connection() -> None:
    agent, gateway = connected(replace(LIMITS, rekey_after_records=5))
    sid = open_stream(agent, gateway)
    payload = bytes(range(256)) * 200
    total = b""
    for _ in range(40):
        gateway.send_stream_data(sid, payload[: gateway.send_capacity(sid)])
        pump(agent, gateway)
        total += read_all(agent, sid)
    assert gateway.stats.wire.rekeys_sent >= 5 and agent.stats.wire.rekeys_received >= 5
    assert total == (payload * 40)[: len(total)] and len(total) > 40 * 5000


def test_unknown_agent_key_is_rejected_without_raising() -> None:
    agent = TunnelConnection(
        SecureChannel(
            role=Role.INITIATOR,
            static_private=generate_keypair()[0],
            limits=LIMITS,
            now=0.0,
            remote_static=GW_PUB,
            wall_time_ns=T0_NS,
        )
    )
    gateway = make_gateway()
    gateway.receive_data(agent.data_to_send(), 0.0)
    assert events(gateway) == [ConnectionTerminated(CloseCode.AUTH_FAILED, "unknown_key", False)]
    assert gateway.closed and gateway.data_to_send() == b"" and gateway.get_timer() is None
    gateway.receive_data(b"more garbage", 0.0)  # ignored, never raises
    assert events(gateway) == []


def test_replayed_initiation_is_rejected() -> None:
    guard = ReplayGuard()
    agent = make_agent()
    first = agent.data_to_send()
    gateway = make_gateway(replay_guard=guard)
    gateway.receive_data(first, 0.0)
    agent.receive_data(gateway.data_to_send(), 0.0)
    gateway.receive_data(agent.data_to_send(), 0.0)  # the agent's first record
    assert events(gateway) == [HandshakeCompleted(AGENT_PUB)]
    again = make_gateway(replay_guard=guard)
    again.receive_data(first, 0.0)
    assert events(again) == [ConnectionTerminated(CloseCode.AUTH_FAILED, "replay", False)]


def test_session_counts_only_after_key_confirmation() -> None:
    """Message 1 alone (e.g. replayed at another replica, whose replay guard never saw
    it) is answered but never completes: no HandshakeCompleted, so no registry entry
    replaces the live session; it ends as "unconfirmed" at the handshake deadline."""
    agent = make_agent()
    recorded = agent.data_to_send()
    replica = make_gateway()  # its own, empty replay guard
    replica.receive_data(recorded, 1.0)
    assert replica.data_to_send()  # message 2 goes out (it cannot know yet)
    assert not replica.handshake_complete and events(replica) == []
    replica.open_stream("edge-gpu-1", 9400)  # queued: nothing goes out before confirmation
    with pytest.raises(LocalProtocolError):
        replica.go_away(CloseCode.DRAINED)  # nothing to drain yet
    assert replica.state is TunnelState.HANDSHAKING and replica.data_to_send() == b""
    replica.handle_timer(1.0 + LIMITS.handshake_timeout_s)
    assert events(replica)[-1] == ConnectionTerminated(CloseCode.AUTH_FAILED, "unconfirmed", False)
    assert replica.data_to_send() == b""  # nothing sealed for an unconfirmed peer


def test_initiator_confirms_with_an_empty_record_at_once() -> None:
    agent, gateway = make_agent(), make_gateway()
    gateway.receive_data(agent.data_to_send(), 0.0)
    agent.receive_data(gateway.data_to_send(), 0.0)
    assert events(agent) == [HandshakeCompleted(GW_PUB)]
    assert not gateway.handshake_complete
    gateway.receive_data(agent.data_to_send(), 0.0)  # no frame queued: a keepalive record
    assert gateway.handshake_complete
    assert events(gateway) == [HandshakeCompleted(AGENT_PUB)]


def test_wrong_gateway_key_fails_the_handshake() -> None:
    agent = make_agent(gateway_pub=generate_keypair()[1])
    gateway = make_gateway()
    pump(agent, gateway)
    [terminated] = events(gateway)
    assert isinstance(terminated, ConnectionTerminated) and terminated.code is CloseCode.AUTH_FAILED
    assert not agent.handshake_complete


def test_handshake_timeout() -> None:
    gateway = make_gateway(now=10.0)
    assert gateway.get_timer() == 10.0 + LIMITS.handshake_timeout_s
    gateway.handle_timer(12.0)
    assert events(gateway) == []
    gateway.handle_timer(10.0 + LIMITS.handshake_timeout_s)
    assert events(gateway) == [
        ConnectionTerminated(CloseCode.AUTH_FAILED, HANDSHAKE_TIMEOUT_REASON, False)
    ]


def test_garbage_record_closes_with_a_close_frame() -> None:
    agent, gateway = connected()
    sid = open_stream(agent, gateway)
    gateway.send_datagram(b"\x45hello")
    wire = bytearray(gateway.data_to_send())
    wire[-1] ^= 1  # break the tag
    agent.receive_data(bytes(wire), 1.0)
    reset, terminated = events(agent)
    assert isinstance(reset, StreamReset) and isinstance(terminated, ConnectionTerminated)
    assert (reset.stream_id, reset.code, reset.by_peer) == (sid, StreamCode.TUNNEL_CLOSED, False)
    assert terminated.code is CloseCode.AUTH_FAILED and not terminated.by_peer
    gateway.receive_data(agent.data_to_send(), 1.0)  # the CLOSE record
    *resets, closed = events(gateway)
    assert resets == [StreamReset(sid, StreamCode.TUNNEL_CLOSED, terminated.reason, False)]
    assert closed == ConnectionTerminated(CloseCode.AUTH_FAILED, terminated.reason, True)
    assert gateway.closed and agent.closed


def test_protocol_error_in_frames_closes_cleanly() -> None:
    agent, gateway = connected()
    gateway._channel.seal(
        bytes([0xEE]) + bytes(7), 0.0
    )  # a frame type nobody knows, sealed properly
    agent.receive_data(gateway.data_to_send(), 0.0)
    [terminated] = events(agent)
    assert terminated == ConnectionTerminated(
        CloseCode.PROTOCOL_ERROR, "unknown frame type 238", False
    )
    gateway.receive_data(agent.data_to_send(), 0.0)
    assert events(gateway) == [
        ConnectionTerminated(CloseCode.PROTOCOL_ERROR, "unknown frame type 238", True)
    ]


@pytest.mark.parametrize("silent", ["agent", "gateway"])
def test_keepalive_and_dead_peer_on_both_sides(silent: str) -> None:
    agent, gateway = connected()
    sid = open_stream(agent, gateway)
    now = 0.0
    # both alive: pings flow, RTT is measured, nobody dies
    for _ in range(10):
        now += LIMITS.keepalive_interval_s
        agent.handle_timer(now)
        gateway.handle_timer(now)
        pump(agent, gateway, now)
    assert any(isinstance(e, PongReceived) for e in events(agent))
    assert agent.rtt_s == 0.0 and not agent.closed and not gateway.closed
    # now one side goes silent: the other declares it dead within dead_peer_timeout_s
    live = gateway if silent == "agent" else agent
    start = now
    while not live.closed:
        timer = live.get_timer()
        assert timer is not None
        now = timer
        live.handle_timer(now)
        live.data_to_send()  # written into the void
    assert now - start <= LIMITS.dead_peer_timeout_s
    reset, terminated = [e for e in events(live) if not isinstance(e, PongReceived)]
    assert isinstance(terminated, ConnectionTerminated)
    assert terminated.code is CloseCode.KEEPALIVE_TIMEOUT
    assert reset == StreamReset(sid, StreamCode.TUNNEL_CLOSED, terminated.reason, False)


def test_drain_through_the_connection() -> None:
    agent, gateway = connected()
    sid = open_stream(agent, gateway)
    gateway.go_away(CloseCode.DRAINED, "rolling update")
    assert gateway.draining
    pump(agent, gateway)
    assert agent.draining
    with pytest.raises(LocalProtocolError):
        agent.open_stream("gw", 1)
    agent.send_stream_data(sid, b"tail")
    agent.end_stream(sid)
    gateway.end_stream(sid)
    pump(agent, gateway)
    assert read_all(gateway, sid) == b"tail"
    assert gateway.open_streams == 0
    gateway.close(CloseCode.DRAINED, "done")
    pump(agent, gateway)
    assert events(agent)[-1] == ConnectionTerminated(CloseCode.DRAINED, "done", True)


def test_streams_queued_before_the_handshake_go_out_after_it() -> None:
    agent, gateway = make_agent(), make_gateway()
    sid = agent.open_stream("gateway", 10264)
    assert agent.send_datagram(b"\x45early")
    assert gateway.get_timer() == LIMITS.handshake_timeout_s
    pump(agent, gateway)
    evs = events(gateway)
    assert evs == [
        HandshakeCompleted(AGENT_PUB),
        StreamOpened(sid, "gateway", 10264),
        DatagramReceived(b"\x45early"),
    ]
    assert gateway.get_timer() == LIMITS.keepalive_interval_s


def _session() -> tuple[TunnelConnection, bytes]:
    """An agent after the handshake, and the gateway's wire bytes of a short session."""
    agent, gateway = make_agent(), make_gateway()
    pump(agent, gateway)
    events(agent)
    gateway.open_stream("edge-gpu-1", 80)
    gateway.send_datagram(b"\x45abc")
    gateway.answer_registration(["edge-gpu-1"], [], [("edge-gpu-2", "not authorised")])
    gateway.go_away(CloseCode.DRAINED, "bye")
    return agent, gateway.data_to_send()


def test_one_byte_at_a_time() -> None:
    agent, wire = _session()
    agent.receive_data(wire, 0.0)
    expected = events(agent)
    assert [type(e).__name__ for e in expected] == [
        "StreamOpened",
        "RegistrationAnswered",
        "GoAwayReceived",
        "DatagramReceived",  # control frames go first
    ]
    agent, wire = _session()
    for i in range(len(wire)):
        agent.receive_data(wire[i : i + 1], 0.0)
    assert events(agent) == expected


@given(st.binary(max_size=400), st.integers(1, 50), st.booleans())
def test_fuzz_gateway_receive_data_never_raises(data: bytes, step: int, magic: bool) -> None:
    gateway = make_gateway()
    if magic:
        data = preamble(Suite.CHACHAPOLY) + data
    for i in range(0, len(data), step):
        gateway.receive_data(data[i : i + step], 0.0)
    for event in events(gateway):
        assert isinstance(event, ConnectionTerminated)


@given(st.data())
def test_fuzz_agent_receive_data_never_raises(data: st.DataObject) -> None:
    agent, wire = _session()
    mutated = bytearray(wire)
    for _ in range(data.draw(st.integers(0, 3))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    mutated += data.draw(st.binary(max_size=100))
    step = data.draw(st.integers(1, 200))
    for i in range(0, len(mutated), step):
        agent.receive_data(bytes(mutated[i : i + step]), 0.0)
    evs = events(agent)
    if mutated == wire:
        assert not agent.closed
    terminated = [e for e in evs if isinstance(e, ConnectionTerminated)]
    assert len(terminated) <= 1


def _exchange_in_flight(
    agent: TunnelConnection, gateway: TunnelConnection, sid: int, now: float, tag: bytes
) -> None:
    """Data both ways, delivered one wire chunk at a time in each direction, so records
    sealed before, during and after a key switch are all in flight together."""
    agent.send_stream_data(sid, tag + b"-up")
    gateway.send_stream_data(sid, tag + b"-down")
    for _ in range(10):
        up, down = agent.data_to_send(), gateway.data_to_send()
        if up:
            gateway.receive_data(up, now)
        if down:
            agent.receive_data(down, now)
    assert read_all(gateway, sid) == tag + b"-up"
    assert read_all(agent, sid) == tag + b"-down"


def test_periodic_rehandshake_renews_the_keys_without_disturbing_streams() -> None:
    """Every rehandshake_after_s the agent runs a new handshake inside the session (fresh
    Diffie-Hellman: post-compromise security); data keeps flowing across the switch and
    no stream, event or timer notices."""
    limits = replace(
        LIMITS, rehandshake_after_s=60.0, keepalive_interval_s=500.0, dead_peer_timeout_s=900.0
    )
    agent, gateway = connected(limits)
    sid = open_stream(agent, gateway)
    events(agent), events(gateway)
    first = agent._channel.handshake_hash
    assert agent.get_timer() == 60.0
    for round_ in range(1, 4):
        now = 60.0 * round_ + 0.5
        agent.handle_timer(now)  # due: message 1 goes out inside the session
        gateway.handle_timer(now)
        # data sealed right after message 1 (old key) and after the switch (new key)
        _exchange_in_flight(agent, gateway, sid, now, b"round%d" % round_)
        assert events(agent) == events(gateway) == []
        assert agent.stats.wire.rehandshakes == gateway.stats.wire.rehandshakes == round_
    _exchange_in_flight(agent, gateway, sid, 200.0, b"after")  # all on the newest keys
    assert agent._channel.handshake_hash == gateway._channel.handshake_hash != first
    assert not agent.closed and not gateway.closed
    assert agent.send_capacity(sid) > 0


def test_rehandshake_from_a_key_removed_meanwhile_closes_the_tunnel() -> None:
    limits = replace(LIMITS, rehandshake_after_s=60.0, dead_peer_timeout_s=900.0)
    allowed = {"yes": True}
    agent = make_agent(limits)
    gateway = TunnelConnection(
        SecureChannel(
            role=Role.RESPONDER,
            static_private=GW_PRIV,
            limits=limits,
            now=0.0,
            authorize=lambda key: allowed["yes"],
        )
    )
    pump(agent, gateway)
    events(agent), events(gateway)
    allowed["yes"] = False
    agent.handle_timer(60.0)
    pump(agent, gateway, 60.0)
    terminated = [e for e in events(gateway) if isinstance(e, ConnectionTerminated)]
    assert terminated and terminated[0].code is CloseCode.AUTH_FAILED


def test_trimmed_connections_keep_working_and_release_their_aead_objects() -> None:
    """trim() between records (what the adapter does on a quiet keepalive) drops each
    side's AEAD objects and buffers; the next record makes them again, on the same keys
    and nonces, so the peer notices nothing."""
    agent, gateway = connected()
    for _ in range(3):
        for conn in (agent, gateway):
            conn.trim()
            channel = conn._channel
            assert channel._sender is not None and channel._receiver is not None
            assert channel._sender._cipher._aead is None
            assert channel._receiver._cipher._aead is None
            assert channel.output.used == 0
        sid = open_stream(agent, gateway)
        agent.send_stream_data(sid, b"x" * 70_000)
        pump(agent, gateway)
        assert read_all(gateway, sid) == b"x" * 70_000
        agent.end_stream(sid)
        gateway.end_stream(sid)
        pump(agent, gateway)
        events(agent), events(gateway)
    assert agent.open_streams == 0 and gateway.open_streams == 0


def test_trim_if_quiet_releases_only_a_tunnel_quiet_since_its_last_pong() -> None:
    """The idle policy the adapter applies after each write and at each PONG: trim when no
    stream is open and nothing moved since the last keepalive round trip; a stream opened
    (or a datagram) in between keeps the AEADs until the next quiet period."""
    agent, gateway = connected()
    gateway.trim_if_quiet(pong=True)  # the first PONG starts a quiet period
    sid = open_stream(agent, gateway)
    gateway.trim_if_quiet(pong=True)  # a stream is open: nothing released
    assert holds_aead(gateway)
    sid2 = open_stream(agent, gateway)
    for stream_id in (sid, sid2):
        gateway.end_stream(stream_id)
        agent.end_stream(stream_id)
    pump(agent, gateway)
    events(agent), events(gateway)
    assert gateway.open_streams == 0
    gateway.trim_if_quiet()  # all closed, but one was opened since the last PONG
    assert holds_aead(gateway)
    gateway.trim_if_quiet(pong=True)  # this PONG saw it: the next period starts...
    assert holds_aead(gateway)
    gateway.trim_if_quiet()  # ...and the next write in it finds nothing moved
    assert not holds_aead(gateway)
    agent.send_datagram(b"\x45" + bytes(19))
    pump(agent, gateway)
    events(gateway)
    gateway.trim_if_quiet(pong=True)  # a datagram moved in the last period: kept
    assert holds_aead(gateway)
    gateway.trim_if_quiet(pong=True)
    assert not holds_aead(gateway)


def test_an_idle_registered_tunnel_holds_no_queues_lists_or_scratch_of_its_own() -> None:
    """What each idle tunnel would otherwise carry, times every agent a gateway holds: the
    received-frame backlog's deque (~760 B), the registration's three lists, record scratch
    buffers (one shared empty view until a record needs one) and per-tunnel copies of the
    frame labels its stats are keyed by."""
    agent, gateway = connected()
    agent.register(["edge-1"], [])
    pump(agent, gateway)
    events(gateway)
    gateway.answer_registration(["edge-1"], [])
    pump(agent, gateway)
    events(agent)
    for conn in (agent, gateway):
        conn.trim()
        mux, channel = conn._mux, conn._channel
        assert mux.backlog.pending is None
        assert mux._registration._parts is None
        assert channel._sender is not None and channel._receiver is not None
        assert channel._sender._plain is channel._receiver._scratch  # the shared empty one
        assert len(channel._sender._plain) == 0
    labels = [k for conn in (agent, gateway) for k in conn.stats.frames_received]
    assert "register" in labels or "register_result" in labels
    for label in labels:  # one string per frame type, shared by every tunnel
        assert any(label is t.label for t in FrameType)
