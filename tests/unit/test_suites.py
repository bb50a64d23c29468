"""Transport suites: Noise's AESGCM cipher functions checked against `cryptography` directly,
and the negotiation (raven.protocol.suites) between two sans-IO tunnel ends: both suites
carry streams, the suite byte cannot be changed in flight, a re-handshake upgrades the suite
without disturbing streams, and a suite the gateway does not accept fails with a reason."""

from __future__ import annotations

import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from raven.protocol.connection import Role, TunnelConnection
from raven.protocol.constants import MAGIC
from raven.protocol.cookie import CookieResponder
from raven.protocol.errors import HandshakeRejected, RemoteProtocolError
from raven.protocol.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    StreamDataReceived,
)
from raven.protocol.handshake import (
    INITIATION_BYTES,
    RESPONSE_BYTES,
    InitiatorHandshake,
    ReplayGuard,
    consume_initiation,
    consume_response,
    create_initiation,
    create_response,
)
from raven.protocol.limits import Limits
from raven.protocol.noise import MAX_NONCE, CipherState, HandshakeState, generate_keypair
from raven.protocol.secure_channel import SecureChannel
from raven.protocol.suites import (
    DEFAULT_SUITE,
    Suite,
    accept_suite,
    choose,
    decode_mask,
    encode_mask,
    first_suite,
    protocol_name,
    suite_by_name,
)
from tests.helpers.sansio import events, open_stream, pump

T0_NS = 1_790_000_000 * 10**9
AGENT_PRIV, AGENT_PUB = generate_keypair()
GW_PRIV, GW_PUB = generate_keypair()
LIMITS = Limits(rehandshake_after_s=60.0, keepalive_interval_s=500.0, dead_peer_timeout_s=900.0)
AES, CHACHA = Suite.AESGCM, Suite.CHACHAPOLY
KEY = bytes(range(32))

# --- the cipher functions ------------------------------------------------------------------


def test_aesgcm_cipher_state_is_aes_256_gcm_with_a_big_endian_counter() -> None:
    """Noise spec 12.3: nonce = 4 zero bytes || 64-bit big-endian n (ChaChaPoly's is
    little-endian, 12.2): each message equals `cryptography`'s AESGCM under that nonce."""
    state = CipherState(KEY, "AESGCM")
    reference = AESGCM(KEY)
    for n in range(3):
        ad, plaintext = b"ad%d" % n, b"message %d" % n
        nonce = bytes(4) + n.to_bytes(8, "big")
        assert state.encrypt_with_ad(ad, plaintext) == reference.encrypt(nonce, plaintext, ad)
    state.set_nonce(0x0102030405060708)
    nonce = bytes.fromhex("000000000102030405060708")
    assert state.encrypt_with_ad(b"", b"x") == reference.encrypt(nonce, b"x", b"")
    # the same key and counter under ChaChaPoly: little-endian, as before
    chacha = CipherState(KEY, "ChaChaPoly")
    chacha.set_nonce(1)
    assert chacha.encrypt_with_ad(b"", b"x") == ChaCha20Poly1305(KEY).encrypt(
        struct.pack("<4xQ", 1), b"x", b""
    )


def test_aesgcm_decrypt_into_and_rekey_follow_the_spec() -> None:
    sender, receiver = CipherState(KEY, "AESGCM"), CipherState(KEY, "AESGCM")
    ciphertext = sender.encrypt_with_ad(b"", b"payload")
    buffer = memoryview(bytearray(64))
    assert receiver.decrypt_with_ad_into(b"", ciphertext, buffer) == 7
    assert bytes(buffer[:7]) == b"payload"
    # REKEY(k) = first 32 bytes of ENCRYPT(k, 2^64-1, empty, 32 zero bytes), big-endian nonce
    expected = AESGCM(KEY).encrypt(bytes(4) + MAX_NONCE.to_bytes(8, "big"), bytes(32), b"")[:32]
    sender.rekey()
    sender.set_nonce(0)
    assert sender.encrypt_with_ad(b"", b"after") == AESGCM(expected).encrypt(
        bytes(12), b"after", b""
    )
    receiver.rekey()
    receiver.set_nonce(0)
    assert receiver.decrypt_with_ad(b"", AESGCM(expected).encrypt(bytes(12), b"x", b"")) == b"x"


def test_cipher_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown Noise cipher"):
        CipherState(KEY, "AES128")
    with pytest.raises(ValueError, match="only 25519"):
        HandshakeState.initialize("Noise_NN_25519_AESGCM_SHA256", initiator=True)


def test_noise_ikpsk2_aesgcm_handshake_round_trip() -> None:
    name = "Noise_IKpsk2_25519_AESGCM_BLAKE2s"
    psk = bytes([7]) * 32
    initiator = HandshakeState.initialize(
        name, initiator=True, prologue=b"p", s=AGENT_PRIV, rs=GW_PUB, psks=[psk]
    )
    responder = HandshakeState.initialize(
        name, initiator=False, prologue=b"p", s=GW_PRIV, psks=[psk]
    )
    assert responder.read_message(initiator.write_message(b"one")) == b"one"
    assert initiator.read_message(responder.write_message(b"two")) == b"two"
    assert initiator.get_handshake_hash() == responder.get_handshake_hash()
    i_send, i_recv = initiator.split()
    r_recv, r_send = responder.split()
    assert i_send.cipher == r_send.cipher == "AESGCM"
    assert r_recv.decrypt_with_ad(b"", i_send.encrypt_with_ad(b"", b"up")) == b"up"
    assert i_recv.decrypt_with_ad(b"", r_send.encrypt_with_ad(b"", b"down")) == b"down"
    # the same keys under the ChaChaPoly name give another handshake: no cross-talk
    chacha = HandshakeState.initialize(
        name.replace("AESGCM", "ChaChaPoly"), initiator=False, prologue=b"p", s=GW_PRIV, psks=[psk]
    )
    other = HandshakeState.initialize(
        name, initiator=True, prologue=b"p", s=AGENT_PRIV, rs=GW_PUB, psks=[psk]
    )
    with pytest.raises(RemoteProtocolError):
        chacha.read_message(other.write_message(b""))


# --- suite helpers ---------------------------------------------------------------------------


def test_suite_names_masks_and_choice() -> None:
    assert protocol_name(AES) == b"Noise_IKpsk2_25519_AESGCM_BLAKE2s"
    assert protocol_name(CHACHA) == b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"
    assert suite_by_name("aes-256-gcm") is AES and AES.label == "aes-256-gcm"
    with pytest.raises(ValueError, match="chacha20-poly1305, aes-256-gcm"):
        suite_by_name("aes")
    assert decode_mask(encode_mask([AES, CHACHA])) == {AES, CHACHA}
    assert decode_mask(0b1111_1110) == {AES}  # bits of future suites are ignored
    assert choose((AES, CHACHA), {CHACHA}) is CHACHA
    assert choose((AES,), {CHACHA}) is None
    assert first_suite((AES, CHACHA), None) is DEFAULT_SUITE  # nothing known: the default
    assert first_suite((AES, CHACHA), {AES, CHACHA}) is AES
    assert first_suite((AES,), None) is AES  # forced: the gateway will say no if it must


# --- the negotiation, sans-IO ---------------------------------------------------------------


def make_agent(suites: tuple[Suite, ...], peer: frozenset[Suite] | None = None) -> TunnelConnection:
    return TunnelConnection(
        SecureChannel(
            role=Role.INITIATOR,
            static_private=AGENT_PRIV,
            limits=LIMITS,
            now=0.0,
            remote_static=GW_PUB,
            wall_time_ns=T0_NS,
            suites=suites,
            peer_suites=peer,
        )
    )


def make_gateway(accepted: tuple[Suite, ...] = (CHACHA, AES)) -> TunnelConnection:
    return TunnelConnection(
        SecureChannel(
            role=Role.RESPONDER,
            static_private=GW_PRIV,
            limits=LIMITS,
            now=0.0,
            authorize=lambda key: key == AGENT_PUB,
            suites=accepted,
        )
    )


def exchange(agent: TunnelConnection, gateway: TunnelConnection, sid: int, tag: bytes) -> None:
    """Data both ways, one wire chunk per direction at a time (records of old and new
    keys in flight together); both ends read exactly what the other sent."""
    agent.send_stream_data(sid, tag + b"-up")
    gateway.send_stream_data(sid, tag + b"-down")
    for _ in range(10):
        up, down = agent.data_to_send(), gateway.data_to_send()
        if up:
            gateway.receive_data(up, 0.0)
        if down:
            agent.receive_data(down, 0.0)
    for conn, expected in ((gateway, tag + b"-up"), (agent, tag + b"-down")):
        data = b"".join(e.data for e in events(conn) if isinstance(e, StreamDataReceived))
        conn.consume_stream_data(sid, len(data))
        assert data == expected


@pytest.mark.parametrize("suite", [CHACHA, AES])
def test_both_suites_complete_the_handshake_and_carry_streams(suite: Suite) -> None:
    agent, gateway = make_agent((suite,), peer=frozenset({CHACHA, AES})), make_gateway()
    first = agent.data_to_send()
    assert first[4] == suite  # the suite byte, in clear after the magic
    gateway.receive_data(first, 0.0)
    pump(agent, gateway)
    assert events(agent) == [HandshakeCompleted(GW_PUB)]
    assert events(gateway) == [HandshakeCompleted(AGENT_PUB)]
    assert agent.suite is gateway.suite is suite
    assert agent.peer_suites == {CHACHA, AES}
    assert agent._channel._sender is not None
    assert agent._channel._sender._cipher.cipher == ("AESGCM" if suite is AES else "ChaChaPoly")
    sid = open_stream(agent, gateway)
    exchange(agent, gateway, sid, b"x" * 70_000)  # several records each way
    assert agent.get_timer() != 0.0  # no upgrade pending: this is the best common suite


@pytest.mark.parametrize(("sent", "changed"), [(AES, CHACHA), (CHACHA, AES)])
def test_a_changed_suite_byte_fails_the_handshake(sent: Suite, changed: Suite) -> None:
    """The byte is in clear, but the protocol name and the prologue follow it: a changed
    byte (a downgrade attempt) makes message 1 fail to decrypt."""
    agent, gateway = make_agent((sent,)), make_gateway()
    wire = bytearray(agent.data_to_send())
    wire[4] = changed
    gateway.receive_data(bytes(wire), 0.0)
    assert gateway.closed and gateway.data_to_send() == b""
    [terminated] = events(gateway)
    assert isinstance(terminated, ConnectionTerminated)
    assert terminated.reason == "decrypt_failed"


def _message_2(accepted: tuple[Suite, ...]) -> tuple[InitiatorHandshake, bytes]:
    pending, msg1 = create_initiation(
        static_private=AGENT_PRIV, remote_static=GW_PUB, wall_time_ns=T0_NS
    )
    read = consume_initiation(
        msg1, static_private=GW_PRIV, authorize=lambda key: True, replay_guard=ReplayGuard()
    )
    return pending, create_response(read, accepted)[0]


def test_the_accepted_suites_in_message_2_are_authenticated() -> None:
    pending, msg2 = _message_2((CHACHA,))
    assert len(msg2) == RESPONSE_BYTES == 49
    tampered = bytearray(msg2)
    tampered[32] ^= 0x02  # try to flip "accepts AES" into the (encrypted) mask
    with pytest.raises(HandshakeRejected) as info:
        consume_response(pending, bytes(tampered))
    assert info.value.reason == "decrypt_failed"
    pending, msg2 = _message_2((CHACHA,))
    assert consume_response(pending, msg2).peer_suites == {CHACHA}


def test_auto_upgrades_at_once_by_a_rehandshake_without_disturbing_streams() -> None:
    """An agent that prefers AES and knows nothing of the gateway starts on the default;
    message 2 says the gateway accepts AES, so the agent re-handshakes at once (inside the
    tunnel) under the AES protocol name; a stream open across the switch never notices."""
    agent, gateway = make_agent((AES, CHACHA)), make_gateway()
    pump(agent, gateway)
    events(agent), events(gateway)
    assert agent.suite is gateway.suite is CHACHA
    assert agent.get_timer() == 0.0  # the upgrade is due now
    sid = open_stream(agent, gateway)
    agent.handle_timer(0.5)  # message 1 of the AES handshake goes out in a HANDSHAKE record
    exchange(agent, gateway, sid, b"across")
    assert agent.suite is gateway.suite is AES
    assert agent.stats.wire.rehandshakes == gateway.stats.wire.rehandshakes == 1
    exchange(agent, gateway, sid, b"after")
    assert agent.get_timer() == 60.0  # the next one is the periodic one
    # a new connection of the same agent starts on AES at once (it remembers the gateway)
    again = make_agent((AES, CHACHA), peer=agent.peer_suites)
    assert again.data_to_send()[4] == AES


def test_rehandshake_follows_the_gateway_accepting_less() -> None:
    """An agent that knew AES was accepted names it again in the next handshake; the
    gateway's list is what counts: a gateway that no longer accepts it refuses."""
    agent, gateway = make_agent((AES, CHACHA), peer=frozenset({AES})), make_gateway((CHACHA,))
    gateway.receive_data(agent.data_to_send(), 0.0)
    [terminated] = events(gateway)
    assert isinstance(terminated, ConnectionTerminated)
    assert terminated.reason == "unsupported_suite"


def test_forcing_aes_against_a_gateway_that_does_not_accept_it_fails_with_a_reason() -> None:
    agent, gateway = make_agent((AES,)), make_gateway((CHACHA,))
    with pytest.raises(HandshakeRejected) as info:
        gateway._channel.receive_data(agent.data_to_send(), 0.0)
    assert info.value.reason == "unsupported_suite"
    assert "asked for aes-256-gcm; this side accepts chacha20-poly1305" in str(info.value)
    assert gateway._channel.data_to_send() == b""  # a refused handshake gets no answer


def test_an_agent_of_the_old_format_gets_a_clear_reason() -> None:
    """Before suites, the length prefix followed the magic: its first byte is 0 (message 1
    is 141 bytes), which is never a suite."""
    with pytest.raises(HandshakeRejected, match="older than suite negotiation") as info:
        accept_suite(0, (CHACHA,))
    assert info.value.reason == "unsupported_suite"
    gateway = make_gateway()
    gateway.receive_data(MAGIC + INITIATION_BYTES.to_bytes(2, "big") + bytes(141), 0.0)
    [terminated] = events(gateway)
    assert isinstance(terminated, ConnectionTerminated)
    assert terminated.reason == "unsupported_suite"


def test_a_rehandshake_naming_a_refused_suite_closes_the_tunnel() -> None:
    """Inside the tunnel the suite byte is checked as on a new connection."""
    agent, gateway = make_agent((AES, CHACHA)), make_gateway((CHACHA,))
    pump(agent, gateway)
    assert agent.suite is CHACHA and agent.peer_suites == {CHACHA}
    assert agent.get_timer() == 60.0  # nothing better on offer: the periodic re-handshake
    agent._channel.suites.peer = frozenset({AES})  # as if the gateway had said so
    agent.handle_timer(60.0)
    pump(agent, gateway, 60.0)
    closed = [e for e in events(gateway) if isinstance(e, ConnectionTerminated)]
    assert closed and closed[0].reason == "unsupported_suite"


def test_the_fresh_message_1_after_a_cookie_reply_keeps_the_suite_of_the_preamble() -> None:
    """Under load the gateway answers message 1 with a cookie reply; the agent's fresh
    message 1 on the same connection (no preamble again) runs the suite it named."""
    cookies = CookieResponder(GW_PUB, under_load=lambda: True)
    gateway = SecureChannel(role=Role.RESPONDER, static_private=GW_PRIV, limits=LIMITS, now=0.0,
                            authorize=AGENT_PUB.__eq__, cookies=cookies,
                            suites=(CHACHA, AES))  # fmt: skip
    gateway.set_source_address(bytes([127, 0, 0, 1]))
    agent = SecureChannel(role=Role.INITIATOR, static_private=AGENT_PRIV, limits=LIMITS, now=0.0,
                          remote_static=GW_PUB, wall_time_ns=T0_NS, suites=(AES,))  # fmt: skip
    gateway.receive_data(agent.data_to_send(), 0.0)
    assert gateway.stats.cookie_replies == 1 and not gateway.has_keys
    agent.receive_data(gateway.data_to_send(), 0.0)  # the cookie reply: a fresh message 1
    gateway.receive_data(agent.data_to_send(), 0.0)
    agent.receive_data(gateway.data_to_send(), 0.0)
    assert gateway.receive_data(agent.data_to_send(), 0.0) == [b""]  # key confirmation
    assert agent.suites.current is gateway.suites.current is AES
