"""SecureChannel: two channels wired back to back with a hand-driven clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode
from raven.protocol.constants import MAGIC, MAX_RECORD_PAYLOAD_BYTES
from raven.protocol.errors import HandshakeRejected, LocalProtocolError, RemoteProtocolError
from raven.protocol.handshake import INITIATION_BYTES, ReplayGuard
from raven.protocol.limits import Limits
from raven.protocol.noise import generate_keypair
from raven.protocol.secure_channel import ChannelState, Role, SecureChannel
from raven.protocol.suites import Suite, preamble

T0_NS = 1_790_000_000 * 10**9
AGENT_PRIV, AGENT_PUB = generate_keypair()
GW_PRIV, GW_PUB = generate_keypair()


def make_pair(
    limits: Limits | None = None,
    *,
    now: float = 100.0,
    wall_time_ns: int = T0_NS,
    authorize: object = None,
    replay_guard: ReplayGuard | None = None,
    agent_priv: bytes = AGENT_PRIV,
    gateway_pub: bytes = GW_PUB,
    agent_psk: bytes = bytes(32),
    gateway_psk: bytes = bytes(32),
) -> tuple[SecureChannel, SecureChannel]:
    limits = limits or Limits()
    agent = SecureChannel(
        role=Role.INITIATOR,
        static_private=agent_priv,
        limits=limits,
        now=now,
        remote_static=gateway_pub,
        wall_time_ns=wall_time_ns,
        psk=agent_psk,
    )
    gateway = SecureChannel(
        role=Role.RESPONDER,
        static_private=GW_PRIV,
        limits=limits,
        now=now,
        authorize=(lambda key: key == AGENT_PUB) if authorize is None else authorize,  # type: ignore[arg-type]
        replay_guard=replay_guard,
        psk=gateway_psk,
    )
    return agent, gateway


def handshake(agent: SecureChannel, gateway: SecureChannel, now: float = 100.0) -> None:
    assert gateway.receive_data(agent.data_to_send(), now) == []
    assert agent.receive_data(gateway.data_to_send(), now) == []
    assert agent.handshake_complete and not gateway.handshake_complete
    # the agent's first record (an empty keepalive, queued by itself) confirms the keys
    assert gateway.receive_data(agent.data_to_send(), now) == [b""]
    assert gateway.handshake_complete


def test_handshake_completes_and_exposes_keys() -> None:
    agent, gateway = make_pair(now=5.0)
    assert agent.handshake_deadline == 5.0 + Limits().handshake_timeout_s
    assert gateway.handshake_deadline == 5.0 + Limits().handshake_timeout_s
    first = agent.data_to_send()
    assert first.startswith(MAGIC + bytes([Suite.CHACHAPOLY]))  # the default suite
    assert int.from_bytes(first[5:7], "big") == INITIATION_BYTES == len(first) - 7
    assert agent.data_to_send() == b""
    assert not gateway.handshake_complete and gateway.remote_static is None
    gateway.receive_data(first, 5.0)
    assert gateway.state is ChannelState.AWAIT_CONFIRMATION and gateway.has_keys
    assert not gateway.handshake_complete
    assert gateway.remote_static == AGENT_PUB
    assert gateway.handshake_deadline == 5.0 + Limits().handshake_timeout_s
    assert not agent.handshake_complete
    agent.receive_data(gateway.data_to_send(), 5.5)
    assert agent.handshake_complete and agent.handshake_deadline is None
    assert gateway.receive_data(agent.data_to_send(), 5.6) == [b""]
    assert gateway.handshake_complete and gateway.handshake_deadline is None
    assert agent.remote_static == GW_PUB
    assert agent.handshake_hash == gateway.handshake_hash is not None
    assert agent.local_static == AGENT_PUB
    assert agent.state is gateway.state is ChannelState.ESTABLISHED


def test_records_both_ways_and_stats() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    payloads = [bytes([i % 256]) * (i * 37) for i in range(200)]
    for p in payloads:
        agent.seal(p, 101.0)
    wire = agent.data_to_send()
    assert gateway.receive_data(wire, 101.0) == payloads
    gateway.seal(b"pong", 101.0)
    gateway.seal(b"", 101.0)
    assert agent.receive_data(gateway.data_to_send(), 101.0) == [b"pong", b""]
    # + the agent's key-confirmation record
    assert agent.stats.records_sent == 201 == gateway.stats.records_received
    assert gateway.stats.records_sent == 2 == agent.stats.records_received
    assert agent.stats.bytes_sent == gateway.stats.bytes_received
    assert gateway.stats.bytes_sent == agent.stats.bytes_received


def test_largest_record_and_oversize_refused() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    big = bytes(range(256)) * 255 + bytes(MAX_RECORD_PAYLOAD_BYTES - 256 * 255)
    assert len(big) == MAX_RECORD_PAYLOAD_BYTES
    agent.seal(big, 100.0)
    wire = agent.data_to_send()
    assert len(wire) == 2 + 65535
    assert gateway.receive_data(wire, 100.0) == [big]
    with pytest.raises(LocalProtocolError):
        agent.seal(big + b"x", 100.0)


def test_one_byte_at_a_time() -> None:
    agent, gateway = make_pair()
    wire = agent.data_to_send()
    for i in range(len(wire)):
        assert gateway.receive_data(wire[i : i + 1], 100.0) == []
        assert gateway.has_keys == (i == len(wire) - 1)
    wire = gateway.data_to_send()
    for i in range(len(wire)):
        agent.receive_data(wire[i : i + 1], 100.0)
    assert agent.handshake_complete
    wire = agent.data_to_send()
    for i in range(len(wire)):
        assert not gateway.handshake_complete
        gateway.receive_data(wire[i : i + 1], 100.0)
    assert gateway.handshake_complete
    agent.seal(b"hello", 100.0)
    agent.seal(b"world" * 100, 100.0)
    wire = agent.data_to_send()
    got: list[bytes] = []
    for i in range(len(wire)):
        got += gateway.receive_data(wire[i : i + 1], 100.0)
    assert got == [b"hello", b"world" * 100]


def test_response_and_records_in_one_chunk() -> None:
    agent, gateway = make_pair()
    agent.receive_data(b"", 100.0)
    first = agent.data_to_send()
    gateway.receive_data(first, 100.0)
    with pytest.raises(LocalProtocolError):  # a responder seals only after confirmation
        gateway.seal(b"early", 100.0)
    agent.receive_data(gateway.data_to_send(), 100.0)
    agent.seal(b"first", 100.0)
    agent.seal(b"second", 100.0)
    # confirmation record + two records in one chunk
    assert gateway.receive_data(agent.data_to_send(), 100.0) == [b"", b"first", b"second"]


def test_arbitrary_split_points() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    payloads = [bytes([n]) * (n * 301) for n in range(1, 60)]
    for p in payloads:
        agent.seal(p, 100.0)
    wire = agent.data_to_send()
    got: list[bytes] = []
    step = 1
    pos = 0
    while pos < len(wire):
        got += gateway.receive_data(wire[pos : pos + step], 100.0)
        pos += step
        step = step * 3 % 7919 + 1
    assert got == payloads


def test_rekey_by_record_count() -> None:
    agent, gateway = make_pair(Limits(rekey_after_records=10))
    handshake(agent, gateway)
    got: list[bytes] = []
    for i in range(95):
        agent.seal(i.to_bytes(2, "big"), 100.0)
        if i % 7 == 0:
            got += gateway.receive_data(agent.data_to_send(), 100.0)
    got += gateway.receive_data(agent.data_to_send(), 100.0)
    assert got == [i.to_bytes(2, "big") for i in range(95)]
    assert agent.stats.rekeys_sent == 9 == gateway.stats.rekeys_received
    # key-update records count as records
    assert agent.stats.records_sent == 1 + 95 + 9 == gateway.stats.records_received


def test_records_read_one_at_a_time_key_updates_included() -> None:
    """A read of exactly one whole record is opened without the message splitter: frames,
    and key updates (counted, the key turned) alike."""
    agent, gateway = make_pair(Limits(rekey_after_records=3))
    handshake(agent, gateway)
    got: list[bytes] = []
    for i in range(10):
        agent.seal(bytes([i]) * (i + 1), 100.0)
        wire = agent.data_to_send()
        while wire:  # each record in a read of its own
            end = 2 + int.from_bytes(wire[:2], "big")
            got += gateway.receive_data(wire[:end], 100.0)
            wire = wire[end:]
    assert got == [bytes([i]) * (i + 1) for i in range(10)]
    assert agent.stats.rekeys_sent == gateway.stats.rekeys_received == 3
    assert agent.stats.records_sent == gateway.stats.records_received == 1 + 10 + 3


def test_rekey_by_time() -> None:
    agent, gateway = make_pair(Limits(rekey_after_s=60.0), now=100.0)
    handshake(agent, gateway, now=100.0)
    agent.seal(b"a", 159.9)
    assert agent.stats.rekeys_sent == 0
    agent.seal(b"b", 160.0)
    assert agent.stats.rekeys_sent == 1
    agent.seal(b"c", 219.0)
    assert agent.stats.rekeys_sent == 1
    agent.seal(b"d", 220.0)
    assert agent.stats.rekeys_sent == 2
    assert gateway.receive_data(agent.data_to_send(), 220.0) == [b"a", b"b", b"c", b"d"]
    assert gateway.stats.rekeys_received == 2
    # the other direction keeps its own key schedule
    assert gateway.stats.rekeys_sent == 0
    gateway.seal(b"back", 221.0)
    assert gateway.stats.rekeys_sent == 1
    assert agent.receive_data(gateway.data_to_send(), 221.0) == [b"back"]


def test_rekeyed_key_differs_so_old_key_cannot_read() -> None:
    agent, gateway = make_pair(Limits(rekey_after_records=1))
    handshake(agent, gateway)
    agent.seal(b"x", 100.0)
    first = agent.data_to_send()
    agent.seal(b"x", 100.0)
    second = agent.data_to_send()
    # the second record is preceded by a key update and encrypted under a new key at nonce 0
    assert second[-len(first) :] != first
    assert gateway.receive_data(first + second, 100.0) == [b"x", b"x"]


def test_tampered_record_fails_authentication() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    agent.seal(b"secret frames", 100.0)
    wire = bytearray(agent.data_to_send())
    wire[5] ^= 0x01
    with pytest.raises(RemoteProtocolError) as info:
        gateway.receive_data(bytes(wire), 100.0)
    assert info.value.code is CloseCode.AUTH_FAILED
    assert gateway.state is ChannelState.FAILED
    with pytest.raises(LocalProtocolError):
        gateway.receive_data(b"more", 100.0)
    # the sending direction still works, e.g. for a CLOSE frame
    gateway.seal(b"close", 100.0)
    assert agent.receive_data(gateway.data_to_send(), 100.0) == [b"close"]


def test_replayed_or_reordered_record_rejected() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    agent.seal(b"one", 100.0)
    one = agent.data_to_send()
    assert gateway.receive_data(one, 100.0) == [b"one"]
    with pytest.raises(RemoteProtocolError) as info:
        gateway.receive_data(one, 100.0)
    assert info.value.code is CloseCode.AUTH_FAILED
    agent2, gateway2 = make_pair()
    handshake(agent2, gateway2)
    agent2.seal(b"one", 100.0)
    agent2.data_to_send()
    agent2.seal(b"two", 100.0)
    with pytest.raises(RemoteProtocolError):
        gateway2.receive_data(agent2.data_to_send(), 100.0)  # record 0 skipped


def test_short_record_length_rejected_before_body() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    with pytest.raises(RemoteProtocolError):
        gateway.receive_data(b"\x00\x05", 100.0)


@pytest.mark.parametrize(
    ("start", "words"),
    [
        (b"GET /metrics HTTP/1.1\r\n", "HTTP client"),
        (b"POST / HTTP/1.1\r\n", "HTTP client"),
        (b"\x16\x03\x01\x02\x00", "TLS client"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "SSH client"),
        (b"ZVN9\x00\x6d", "expected magic"),
    ],
)
def test_bad_magic_named(start: bytes, words: str) -> None:
    _, gateway = make_pair()
    with pytest.raises(RemoteProtocolError) as info:
        gateway.receive_data(start, 100.0)
    assert not isinstance(info.value, HandshakeRejected)
    assert words in str(info.value)


def test_bad_magic_fed_byte_by_byte_waits_for_four_bytes() -> None:
    _, gateway = make_pair()
    for b in b"GET":
        assert gateway.receive_data(bytes([b]), 100.0) == []
    with pytest.raises(RemoteProtocolError, match="HTTP client"):
        gateway.receive_data(b" ", 100.0)


def test_wrong_initiation_length_rejected_early() -> None:
    _, gateway = make_pair()
    with pytest.raises(HandshakeRejected) as info:
        gateway.receive_data(MAGIC + b"\x01\xff\xff", 100.0)
    assert info.value.reason == "malformed"


def test_unknown_agent_key_rejected_and_nothing_sent() -> None:
    agent, gateway = make_pair(authorize=lambda key: False)
    with pytest.raises(HandshakeRejected) as info:
        gateway.receive_data(agent.data_to_send(), 100.0)
    assert info.value.reason == "unknown_key"
    assert info.value.code is CloseCode.AUTH_FAILED
    assert gateway.data_to_send() == b""
    assert not gateway.handshake_complete


def test_wrong_gateway_key_rejected() -> None:
    _, other_pub = generate_keypair()
    agent, gateway = make_pair(gateway_pub=other_pub)
    with pytest.raises(HandshakeRejected) as info:
        gateway.receive_data(agent.data_to_send(), 100.0)
    assert info.value.reason == "bad_mac1"  # mac1 is keyed by the gateway's public key
    assert gateway.data_to_send() == b""


def test_replayed_initiation_rejected_with_shared_guard() -> None:
    guard = ReplayGuard()
    agent, gateway = make_pair(replay_guard=guard)
    wire = agent.data_to_send()
    gateway.receive_data(wire, 100.0)
    assert gateway.has_keys
    _, gateway2 = make_pair(replay_guard=guard)
    with pytest.raises(HandshakeRejected) as info:
        gateway2.receive_data(wire, 100.0)
    assert info.value.reason == "replay"
    # a new connection with a newer timestamp is fine
    agent3, gateway3 = make_pair(replay_guard=guard, wall_time_ns=T0_NS + 1)
    handshake(agent3, gateway3)


def test_psk_mismatch_detected_by_initiator() -> None:
    agent, gateway = make_pair(agent_psk=bytes(32), gateway_psk=b"\x01" * 32)
    gateway.receive_data(agent.data_to_send(), 100.0)
    with pytest.raises(HandshakeRejected) as info:
        agent.receive_data(gateway.data_to_send(), 100.0)
    assert info.value.reason == "decrypt_failed"


def test_configured_psk_works() -> None:
    agent, gateway = make_pair(agent_psk=b"\x07" * 32, gateway_psk=b"\x07" * 32)
    handshake(agent, gateway)


def test_tampered_response_rejected() -> None:
    agent, gateway = make_pair()
    gateway.receive_data(agent.data_to_send(), 100.0)
    wire = bytearray(gateway.data_to_send())
    wire[-1] ^= 0x80
    with pytest.raises(HandshakeRejected):
        agent.receive_data(bytes(wire), 100.0)


def test_seal_before_handshake_is_local_error() -> None:
    agent, gateway = make_pair()
    with pytest.raises(LocalProtocolError):
        agent.seal(b"x", 100.0)
    with pytest.raises(LocalProtocolError):
        gateway.seal(b"x", 100.0)


def test_initiator_needs_remote_key_and_time() -> None:
    with pytest.raises(ValueError, match="remote_static"):
        SecureChannel(role=Role.INITIATOR, static_private=AGENT_PRIV, limits=Limits(), now=0.0)
    with pytest.raises(ValueError, match="wall_time_ns"):
        SecureChannel(
            role=Role.INITIATOR,
            static_private=AGENT_PRIV,
            limits=Limits(),
            now=0.0,
            remote_static=GW_PUB,
        )


def test_input_buffer_holds_at_most_one_partial_record() -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    payload = bytes(60000)
    for _ in range(5):
        agent.seal(payload, 100.0)
    wire = agent.data_to_send()
    cut = len(wire) - 100
    assert len(gateway.receive_data(wire[:cut], 100.0)) == 4
    assert len(gateway.held) < 2 + 65535
    assert gateway.receive_data(wire[cut:], 100.0) == [payload]
    assert len(gateway.held) == 0


def test_bytes_to_send_tracks_queue() -> None:
    agent, gateway = make_pair()
    assert agent.output.used == 4 + 1 + 2 + INITIATION_BYTES
    handshake(agent, gateway)
    agent.seal(b"abc", 100.0)
    assert agent.output.used == 2 + 1 + 3 + 16
    agent.data_to_send()
    assert agent.output.used == 0


# -- fuzz: any bytes either work or raise RemoteProtocolError --------------------------------

_VALID_START = make_pair()[0].data_to_send()


def _feed_responder(chunks: list[bytes]) -> SecureChannel:
    _, gateway = make_pair()
    try:
        for chunk in chunks:
            gateway.receive_data(chunk, 100.0)
    except RemoteProtocolError as exc:
        assert isinstance(exc.code, CloseCode)
        assert gateway.state is ChannelState.FAILED
        assert gateway.data_to_send() == b""  # nothing useful goes back
    else:
        assert gateway.state is not ChannelState.FAILED
    return gateway


@given(st.lists(st.binary(max_size=200), max_size=5))
def test_fuzz_responder_any_bytes(chunks: list[bytes]) -> None:
    _feed_responder(chunks)


@given(st.binary(max_size=300), st.integers(1, 40))
def test_fuzz_responder_after_magic(data: bytes, step: int) -> None:
    wire = preamble(Suite.CHACHAPOLY) + data
    _feed_responder([wire[i : i + step] for i in range(0, len(wire), step)])


def test_a_genuine_initiation_then_garbage_in_one_read_gets_no_answer() -> None:
    """Message 2 was queued by the initiation and still went out after the garbage that
    followed it in the same read failed the channel (found by the fuzz test below)."""
    gateway = _feed_responder([_VALID_START + b"\x00\x00"])  # a record length of 0
    assert gateway.state is ChannelState.FAILED
    assert gateway.stats.bytes_sent == 0


@given(st.integers(0, len(_VALID_START)), st.binary(max_size=150))
def test_fuzz_responder_valid_prefix_then_garbage(cut: int, data: bytes) -> None:
    gateway = _feed_responder([_VALID_START[:cut] + data])
    # only the genuine initiation, whole, completes a handshake
    if gateway.handshake_complete:
        assert (_VALID_START[:cut] + data).startswith(_VALID_START)


@given(st.lists(st.binary(max_size=120), max_size=4))
def test_fuzz_established_channel_any_bytes(chunks: list[bytes]) -> None:
    agent, gateway = make_pair()
    handshake(agent, gateway)
    try:
        for chunk in chunks:
            assert gateway.receive_data(chunk, 100.0) == []  # no forged record decrypts
    except RemoteProtocolError:
        assert gateway.state is ChannelState.FAILED


@given(st.binary(max_size=100))
def test_fuzz_initiator_any_response(data: bytes) -> None:
    agent, _ = make_pair()
    try:
        agent.receive_data(data, 100.0)
    except RemoteProtocolError:
        assert not agent.handshake_complete
    else:
        assert not agent.handshake_complete


def test_initiator_talking_to_an_http_server_gets_a_hint() -> None:
    agent, _ = make_pair()
    with pytest.raises(HandshakeRejected, match="really a Raven tunnel port") as info:
        agent.receive_data(b"HTTP/1.1 400 Bad Request\r\n\r\n", 100.0)
    assert info.value.reason == "malformed"


def test_responder_without_authorize_is_refused() -> None:
    import pytest as _pytest

    with _pytest.raises(ValueError, match="authorize"):
        SecureChannel(role=Role.RESPONDER, static_private=GW_PRIV, limits=Limits(), now=0.0)


def test_an_agent_of_the_previous_wire_version_is_told_apart_from_garbage() -> None:
    """RVN1 (before mac1/mac2) gets unsupported_version with a line an operator can act on,
    not 'not a Raven tunnel client'."""
    channel = SecureChannel(
        role=Role.RESPONDER,
        static_private=GW_PRIV,
        limits=Limits(),
        now=0.0,
        authorize=lambda _key: True,
        replay_guard=ReplayGuard(),
    )
    with pytest.raises(HandshakeRejected) as caught:
        channel.receive_data(b"RVN1" + (109).to_bytes(2, "big") + bytes(109), 0.0)
    assert caught.value.reason == "unsupported_version"
    assert "same Raven release" in str(caught.value)
