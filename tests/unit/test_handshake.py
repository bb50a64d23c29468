"""The tunnel handshake (IKpsk2): initiator and responder back to back."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode
from raven.protocol.constants import TIMESTAMP_BYTES
from raven.protocol.cookie import MAC_BYTES, append_macs, mac1_key
from raven.protocol.errors import HandshakeRejected, LocalProtocolError, RemoteProtocolError
from raven.protocol.handshake import (
    INITIATION_BYTES,
    NOISE_INITIATION_BYTES,
    PROTOCOL_VERSION,
    RESPONSE_BYTES,
    InitiatorHandshake,
    ReplayGuard,
    ResponderHandshake,
    consume_initiation,
    consume_response,
    create_initiation,
    create_response,
    parse_tai64n,
    tai64n,
)
from raven.protocol.noise import HandshakeState, generate_keypair
from raven.protocol.suites import Suite, prologue, protocol_name

AGENT_PRIV, AGENT_PUB = generate_keypair()
GW_PRIV, GW_PUB = generate_keypair()
T0 = 1_790_000_000_123_456_789

CHACHA = Suite.CHACHAPOLY


def known(key: bytes) -> bool:
    return key == AGENT_PUB


def initiate(
    wall_time_ns: int = T0,
    *,
    static_private: bytes = AGENT_PRIV,
    remote_static: bytes = GW_PUB,
    psk: bytes = bytes(32),
    ephemeral_private: bytes | None = None,
) -> tuple[InitiatorHandshake, bytes]:
    return create_initiation(
        static_private=static_private,
        remote_static=remote_static,
        wall_time_ns=wall_time_ns,
        psk=psk,
        ephemeral_private=ephemeral_private,
    )


def respond(
    message: bytes,
    guard: ReplayGuard | None = None,
    *,
    authorize: Callable[[bytes], bool] = known,
    psk: bytes = bytes(32),
) -> ResponderHandshake:
    return consume_initiation(
        message,
        static_private=GW_PRIV,
        authorize=authorize,
        replay_guard=guard if guard is not None else ReplayGuard(),
        psk=psk,
    )


def remac(noise_message: bytes | bytearray) -> bytes:
    """A Noise message 1 with a valid mac1 for GW_PUB (anyone who knows the gateway's
    public key can make one): reaches the checks behind mac1."""
    return append_macs(bytes(noise_message[:NOISE_INITIATION_BYTES]), mac1_key(GW_PUB), None)


def test_full_handshake_and_transport_keys_pair_up() -> None:
    pending, msg1 = create_initiation(
        static_private=AGENT_PRIV, remote_static=GW_PUB, wall_time_ns=T0
    )
    assert len(msg1) == INITIATION_BYTES
    guard = ReplayGuard()
    accepted = consume_initiation(msg1, static_private=GW_PRIV, authorize=known, replay_guard=guard)
    assert accepted.remote_static == AGENT_PUB
    assert accepted.version == PROTOCOL_VERSION
    assert parse_tai64n(accepted.timestamp) == T0
    assert guard.last(AGENT_PUB) == tai64n(T0)
    msg2, gw_keys = create_response(accepted)
    assert len(msg2) == RESPONSE_BYTES
    agent_keys = consume_response(pending, msg2)
    assert agent_keys.remote_static == GW_PUB and gw_keys.remote_static == AGENT_PUB
    assert agent_keys.handshake_hash == gw_keys.handshake_hash
    ct = agent_keys.send.encrypt_with_ad(b"", b"to gateway")
    assert gw_keys.receive.decrypt_with_ad(b"", ct) == b"to gateway"
    ct = gw_keys.send.encrypt_with_ad(b"", b"to agent")
    assert agent_keys.receive.decrypt_with_ad(b"", ct) == b"to agent"


def test_handshake_is_plain_noise_ikpsk2_with_our_prologue() -> None:
    """A generic Noise IKpsk2 responder (with our prologue) reads our initiation."""
    _, msg1 = initiate()
    responder = HandshakeState.initialize(
        protocol_name(CHACHA),
        initiator=False,
        prologue=prologue(CHACHA),
        s=GW_PRIV,
        psks=[bytes(32)],
    )
    payload = responder.read_message(msg1[:NOISE_INITIATION_BYTES])  # then mac1, mac2
    assert payload == tai64n(T0) + bytes([PROTOCOL_VERSION])
    assert responder.remote_static == AGENT_PUB


def test_replay_of_same_initiation_rejected() -> None:
    guard = ReplayGuard()
    _, msg1 = initiate()
    respond(msg1, guard)
    with pytest.raises(HandshakeRejected) as info:
        respond(msg1, guard)
    assert info.value.reason == "replay"
    assert info.value.code is CloseCode.AUTH_FAILED


def test_timestamps_must_strictly_increase() -> None:
    guard = ReplayGuard()
    respond(initiate(T0)[1], guard)
    for older in (T0, T0 - 1, T0 - 10**9):
        with pytest.raises(HandshakeRejected) as info:
            respond(initiate(older)[1], guard)
        assert info.value.reason == "replay"
    respond(initiate(T0 + 1)[1], guard)
    assert guard.last(AGENT_PUB) == tai64n(T0 + 1)


def test_replay_guard_is_per_key() -> None:
    guard = ReplayGuard()
    other_priv, other_pub = generate_keypair()
    respond(initiate(T0)[1], guard)
    respond(
        initiate(T0 - 5, static_private=other_priv)[1],
        guard,
        authorize=lambda key: key in (AGENT_PUB, other_pub),
    )
    assert len(guard) == 2
    guard.forget(other_pub)
    assert guard.last(other_pub) is None


def test_unknown_key_rejected_and_not_recorded() -> None:
    guard = ReplayGuard()
    stranger_priv, stranger_pub = generate_keypair()
    with pytest.raises(HandshakeRejected) as info:
        respond(initiate(static_private=stranger_priv)[1], guard)
    assert info.value.reason == "unknown_key"
    assert guard.last(stranger_pub) is None and len(guard) == 0


def test_initiation_for_another_gateway_key_is_bad_mac1() -> None:
    guard = ReplayGuard()
    _, wrong_pub = generate_keypair()
    with pytest.raises(HandshakeRejected) as info:
        respond(initiate(remote_static=wrong_pub)[1], guard)
    assert info.value.reason == "bad_mac1"
    assert len(guard) == 0


def test_wrong_gateway_key_behind_a_valid_mac1_is_decrypt_failed() -> None:
    guard = ReplayGuard()
    _, wrong_pub = generate_keypair()
    with pytest.raises(HandshakeRejected) as info:
        respond(remac(initiate(remote_static=wrong_pub)[1]), guard)
    assert info.value.reason == "decrypt_failed"
    assert len(guard) == 0


@pytest.mark.parametrize("position", [0, 108, NOISE_INITIATION_BYTES + MAC_BYTES - 1])
def test_tampered_noise_message_or_mac1_is_bad_mac1(position: int) -> None:
    _, msg1 = initiate()
    tampered = bytearray(msg1)
    tampered[position] ^= 0x40
    with pytest.raises(HandshakeRejected) as info:
        respond(bytes(tampered))
    assert info.value.reason == "bad_mac1"


@pytest.mark.parametrize("position", [0, 31, 32, 60, 79, 80, 95, NOISE_INITIATION_BYTES - 1])
def test_tampered_initiation_rejected_and_not_recorded(position: int) -> None:
    guard = ReplayGuard()
    _, msg1 = initiate()
    tampered = bytearray(msg1)
    tampered[position] ^= 0x40
    with pytest.raises(HandshakeRejected) as info:
        respond(remac(tampered), guard)
    assert info.value.reason in ("decrypt_failed", "malformed")
    assert len(guard) == 0
    # the genuine message still goes through: the tampered copy did not burn its timestamp
    respond(msg1, guard)


def test_low_order_ephemeral_is_malformed() -> None:
    _, msg1 = initiate()
    with pytest.raises(HandshakeRejected) as info:
        respond(remac(bytes(32) + msg1[32:]))
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("size", [0, 1, 32, INITIATION_BYTES - 1, INITIATION_BYTES + 1, 4096])
def test_wrong_size_initiation_is_malformed(size: int) -> None:
    with pytest.raises(HandshakeRejected) as info:
        respond(bytes(size))
    assert info.value.reason == "malformed"


def test_other_protocol_version_rejected() -> None:
    # build an initiation with the next version by hand, with the same Noise handshake
    state = HandshakeState.initialize(
        protocol_name(CHACHA),
        initiator=True,
        prologue=prologue(CHACHA),
        s=AGENT_PRIV,
        rs=GW_PUB,
        psks=[bytes(32)],
    )
    msg1 = remac(state.write_message(tai64n(T0) + bytes([PROTOCOL_VERSION + 1])))
    guard = ReplayGuard()
    with pytest.raises(HandshakeRejected) as info:
        respond(msg1, guard)
    assert info.value.reason == "unsupported_version"
    assert len(guard) == 0


def test_response_checks() -> None:
    pending, msg1 = initiate()
    msg2, _ = create_response(respond(msg1))
    with pytest.raises(HandshakeRejected) as info:
        consume_response(pending, msg2[:-1])
    assert info.value.reason == "malformed"
    tampered = bytearray(msg2)
    tampered[40] ^= 1
    with pytest.raises(HandshakeRejected) as info:
        consume_response(pending, bytes(tampered))
    assert info.value.reason == "decrypt_failed"


def test_psk_must_match() -> None:
    pending, msg1 = initiate(psk=b"\x01" * 32)
    accepted = respond(msg1, psk=b"\x02" * 32)  # psk2: responder cannot tell yet
    msg2, _ = create_response(accepted)
    with pytest.raises(HandshakeRejected) as info:
        consume_response(pending, msg2)
    assert info.value.reason == "decrypt_failed"


def test_fixed_ephemeral_gives_deterministic_messages() -> None:
    e_priv, _ = generate_keypair()
    _, a = initiate(ephemeral_private=e_priv)
    _, b = initiate(ephemeral_private=e_priv)
    assert a == b
    _, c = initiate()
    assert c[:32] != a[:32]


def test_out_of_order_use_is_local_error() -> None:
    pending, msg1 = initiate()
    accepted = respond(msg1)
    msg2, _ = create_response(accepted)
    with pytest.raises(LocalProtocolError):
        create_response(accepted)
    consume_response(pending, msg2)
    with pytest.raises(LocalProtocolError):
        consume_response(pending, msg2)


def test_tai64n_round_trip_and_order() -> None:
    assert len(tai64n(0)) == TIMESTAMP_BYTES
    assert tai64n(0).hex() == "400000000000000a00000000"
    for ns in (0, 1, 999_999_999, 10**9, T0):
        assert parse_tai64n(tai64n(ns)) == ns
    assert tai64n(T0) < tai64n(T0 + 1) < tai64n(T0 + 10**9)
    with pytest.raises(ValueError):
        tai64n(-1)
    with pytest.raises(RemoteProtocolError):
        parse_tai64n(b"\x00" * 12)
    with pytest.raises(RemoteProtocolError):
        parse_tai64n(b"\x40" + b"\x00" * 7 + b"\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError):
        parse_tai64n(b"short")


@given(st.binary(max_size=300))
def test_any_bytes_as_initiation_rejected_cleanly(data: bytes) -> None:
    guard = ReplayGuard()
    with pytest.raises(HandshakeRejected):
        respond(data, guard)
    assert len(guard) == 0


@given(st.integers(0, NOISE_INITIATION_BYTES + MAC_BYTES - 1), st.integers(1, 255))
def test_any_single_byte_flip_rejected(position: int, mask: int) -> None:
    """Any flip in the Noise message or mac1 (mac2 counts only under load)."""
    _, msg1 = initiate()
    tampered = bytearray(msg1)
    tampered[position] ^= mask
    with pytest.raises(HandshakeRejected):
        respond(bytes(tampered))


def test_replay_guard_follows_a_confirmed_clock_back_when_no_session_is_live() -> None:
    live = {"yes": True}
    guard = ReplayGuard(live=lambda _key: live["yes"])
    key = bytes(32)
    ahead, back = tai64n(2_000_000_000 * 10**9), tai64n(1_900_000_000 * 10**9)
    guard.record(key, ahead)
    assert not guard.is_fresh(key, back)  # a live session: strict
    live["yes"] = False
    assert guard.is_fresh(key, back)  # none: the handshake may go on (to be confirmed)
    guard.confirm(key, back)
    assert guard.last(key) == back
    assert ReplayGuard().is_fresh(key, back) and not _strict(key, ahead).is_fresh(key, back)


def _strict(key: bytes, timestamp: bytes) -> ReplayGuard:
    guard = ReplayGuard()  # no live() given: always strict
    guard.record(key, timestamp)
    return guard


def test_every_rejection_reason_in_the_protocol_is_a_known_metric_label() -> None:
    """The gateway counts a rejection under its reason only when the reason is listed in
    HANDSHAKE_REJECTIONS (anything else becomes ``bad_record``): a new reason must be listed."""
    import ast
    from pathlib import Path

    from raven.protocol.errors import HANDSHAKE_REJECTIONS

    root = Path(__file__).resolve().parents[2] / "raven" / "protocol"
    found: set[str] = set()
    for module in root.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "HandshakeRejected"
                and len(node.args) == 2
            ):
                reason = node.args[1]
                assert isinstance(reason, ast.Constant), f"{module.name}: reason not a literal"
                found.add(reason.value)
    assert {"malformed", "bad_mac1", "replay", "cookie_required"} <= found
    assert found <= HANDSHAKE_REJECTIONS, found - HANDSHAKE_REJECTIONS
