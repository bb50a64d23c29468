"""Noise framework objects beyond the vectors: every pattern back to back, errors, fuzz."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.noise import (
    MAX_NONCE,
    PATTERNS,
    CipherState,
    HandshakeState,
    SymmetricState,
    generate_keypair,
    hkdf,
    public_key,
    supports,
)

I_PRIV, I_PUB = generate_keypair()
R_PRIV, R_PUB = generate_keypair()
PSK_A = bytes(range(32))
PSK_B = bytes(range(32, 64))


def _name(pattern: str) -> str:
    return f"Noise_{pattern}_25519_ChaChaPoly_BLAKE2s"


def _pair(pattern: str, psks: tuple[bytes, ...] = ()) -> tuple[HandshakeState, HandshakeState]:
    base = pattern
    while base and not base[-1].isupper():
        base = base[:-1]
    pre_i, pre_r, messages = PATTERNS[base]
    i_needs_s = "s" in pre_i or any("s" in m for m in messages[0::2])
    r_needs_s = "s" in pre_r or any("s" in m for m in messages[1::2])
    initiator = HandshakeState.initialize(
        _name(pattern),
        initiator=True,
        prologue=b"prologue",
        s=I_PRIV if i_needs_s else None,
        rs=R_PUB if "s" in pre_r else None,
        psks=psks,
    )
    responder = HandshakeState.initialize(
        _name(pattern),
        initiator=False,
        prologue=b"prologue",
        s=R_PRIV if r_needs_s else None,
        rs=I_PUB if "s" in pre_i else None,
        psks=psks,
    )
    return initiator, responder


def _run(initiator: HandshakeState, responder: HandshakeState) -> None:
    sender, receiver = initiator, responder
    turn = 0
    while not initiator.handshake_complete:
        payload = f"payload {turn}".encode()
        assert receiver.read_message(sender.write_message(payload)) == payload
        sender, receiver = receiver, sender
        turn += 1
    assert responder.handshake_complete
    assert initiator.get_handshake_hash() == responder.get_handshake_hash()


ALL_PATTERNS = [
    *PATTERNS,
    "NNpsk0",
    "NNpsk2",
    "NKpsk0",
    "XXpsk3",
    "IKpsk1",
    "IKpsk2",
    "KKpsk0+psk2",
]


@pytest.mark.parametrize("pattern", ALL_PATTERNS)
def test_every_pattern_back_to_back(pattern: str) -> None:
    n_psks = pattern.count("psk")
    initiator, responder = _pair(pattern, (PSK_A,) * n_psks)
    _run(initiator, responder)
    i_send, i_recv = initiator.split()
    r_recv, r_send = responder.split()
    assert r_recv.decrypt_with_ad(b"ad", i_send.encrypt_with_ad(b"ad", b"hi")) == b"hi"
    if not initiator.one_way:
        assert i_recv.decrypt_with_ad(b"", r_send.encrypt_with_ad(b"", b"yo")) == b"yo"
    # static keys learnt where the pattern transmits or pre-shares them
    if responder.remote_static is not None:
        assert responder.remote_static == I_PUB
    if initiator.remote_static is not None:
        assert initiator.remote_static == R_PUB


@pytest.mark.parametrize("pattern", ["NNpsk0", "IKpsk2", "XXpsk3"])
def test_psk_mismatch_fails(pattern: str) -> None:
    initiator, _ = _pair(pattern, (PSK_A,))
    _, responder = _pair(pattern, (PSK_B,))
    with pytest.raises(RemoteProtocolError) as info:
        _run(initiator, responder)
    assert info.value.code is CloseCode.AUTH_FAILED


def test_prologue_mismatch_fails() -> None:
    initiator = HandshakeState.initialize(_name("NN"), initiator=True, prologue=b"a")
    responder = HandshakeState.initialize(_name("NN"), initiator=False, prologue=b"b")
    # NN message 1 carries no MAC; message 2 does
    responder.read_message(initiator.write_message(b""))
    with pytest.raises(RemoteProtocolError):
        initiator.read_message(responder.write_message(b""))


def test_supports() -> None:
    for name in ("NN", "XX", "IK", "IKpsk2", "NNpsk0+psk2", "N", "KK"):
        assert supports(_name(name))
    for bad in (
        "Noise_NN_448_ChaChaPoly_BLAKE2s",
        "Noise_NN_25519_AESGCM_SHA256",
        "Noise_XXfallback_25519_ChaChaPoly_BLAKE2s",
        "Noise_ZZ_25519_ChaChaPoly_BLAKE2s",
        "Noise_NNpsk9_25519_ChaChaPoly_BLAKE2s",
        "Noise_NN",
        "garbage",
    ):
        assert not supports(bad)


def test_initialize_checks_keys() -> None:
    with pytest.raises(ValueError, match="rs"):
        HandshakeState.initialize(_name("IK"), initiator=True, s=I_PRIV)
    with pytest.raises(ValueError, match="local static"):
        HandshakeState.initialize(_name("XX"), initiator=False)
    with pytest.raises(ValueError, match="PSK"):
        HandshakeState.initialize(_name("IKpsk2"), initiator=True, s=I_PRIV, rs=R_PUB)
    with pytest.raises(ValueError):
        HandshakeState.initialize(_name("NN"), initiator=True, s=b"short")


def test_turns_enforced() -> None:
    initiator, responder = _pair("NN")
    with pytest.raises(LocalProtocolError):
        responder.write_message(b"")
    with pytest.raises(LocalProtocolError):
        initiator.read_message(b"x" * 48)
    with pytest.raises(LocalProtocolError):
        initiator.split()
    _run(initiator, responder)
    with pytest.raises(LocalProtocolError):
        initiator.write_message(b"")


def test_short_and_oversize_messages_raise_remote_error() -> None:
    _, responder = _pair("XX")
    with pytest.raises(RemoteProtocolError):
        responder.read_message(b"\x01" * 31)
    initiator, responder = _pair("XX")
    responder.read_message(initiator.write_message(b""))
    msg2 = responder.write_message(b"")
    with pytest.raises(RemoteProtocolError):
        initiator.read_message(msg2[:70])  # static key cut short
    _, responder = _pair("NN")
    with pytest.raises(RemoteProtocolError):
        responder.read_message(bytes(65536))


def test_cipher_state_basics() -> None:
    empty = CipherState()
    assert not empty.has_key()
    assert empty.encrypt_with_ad(b"", b"clear") == b"clear"
    assert empty.decrypt_with_ad(b"", b"clear") == b"clear"
    key = bytes(range(32))
    a, b = CipherState(key), CipherState(key)
    assert a.has_key()
    ct = a.encrypt_with_ad(b"ad", b"msg")
    assert a.n == 1
    with pytest.raises(RemoteProtocolError):
        b.decrypt_with_ad(b"other ad", ct)
    assert b.n == 0  # a failed decrypt does not advance the nonce
    assert b.decrypt_with_ad(b"ad", ct) == b"msg"
    # nonce layout: 4 zero bytes + little-endian counter
    a.set_nonce(0x0102030405)
    b.set_nonce(0x0102030405)
    assert b.decrypt_with_ad(b"", a.encrypt_with_ad(b"", b"x")) == b"x"
    with pytest.raises(ValueError):
        a.set_nonce(-1)


def test_max_nonce_is_reserved() -> None:
    cs = CipherState(bytes(32))
    cs.set_nonce(MAX_NONCE - 1)
    cs.encrypt_with_ad(b"", b"last")
    with pytest.raises(LocalProtocolError):
        cs.encrypt_with_ad(b"", b"one too many")
    rx = CipherState(bytes(32))
    rx.set_nonce(MAX_NONCE)
    with pytest.raises(RemoteProtocolError):
        rx.decrypt_with_ad(b"", bytes(20))


def test_rekey_matches_spec_definition() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    key = bytes(range(32))
    cs = CipherState(key)
    cs.set_nonce(7)
    cs.rekey()
    assert cs.n == 7  # the spec leaves n alone
    expected = ChaCha20Poly1305(key).encrypt(b"\x00" * 4 + b"\xff" * 8, bytes(32), b"")[:32]
    assert cs.encrypt_with_ad(b"", b"x") == _with_nonce(expected, 7).encrypt_with_ad(b"", b"x")
    with pytest.raises(LocalProtocolError):
        CipherState().rekey()


def _with_nonce(key: bytes, n: int) -> CipherState:
    cs = CipherState(key)
    cs.set_nonce(n)
    return cs


def test_hkdf_is_hmac_blake2s() -> None:
    ck, ikm = b"c" * 32, b"input"
    temp = hmac.new(ck, ikm, hashlib.blake2s).digest()
    o1 = hmac.new(temp, b"\x01", hashlib.blake2s).digest()
    o2 = hmac.new(temp, o1 + b"\x02", hashlib.blake2s).digest()
    o3 = hmac.new(temp, o2 + b"\x03", hashlib.blake2s).digest()
    assert hkdf(ck, ikm, 2) == (o1, o2)
    assert hkdf(ck, ikm, 3) == (o1, o2, o3)


def test_symmetric_state_long_name_is_hashed() -> None:
    name33 = b"Noise_NN_25519_ChaChaPoly_BLAKE2s"
    assert len(name33) == 33
    assert SymmetricState(name33).h == hashlib.blake2s(name33).digest()
    long_name = b"Noise_NNpsk0+psk2_25519_ChaChaPoly_BLAKE2s"
    assert SymmetricState(long_name).h == hashlib.blake2s(long_name).digest()
    exact = b"x" * 20
    assert SymmetricState(exact).h == exact + bytes(12)


def test_public_key_and_low_order_point() -> None:
    assert public_key(I_PRIV) == I_PUB
    initiator, responder = _pair("NN")
    responder.read_message(initiator.write_message(b""))
    # a responder ephemeral of all zeros is a low-order point: DH output is zero
    with pytest.raises(RemoteProtocolError, match="low-order"):
        initiator.read_message(bytes(32) + bytes(16))


@given(st.sampled_from(["NN", "XX", "IK", "IKpsk2", "KK", "NK"]), st.binary(max_size=200))
def test_read_message_any_bytes_parses_or_remote_error(pattern: str, data: bytes) -> None:
    _, responder = _pair(pattern, (PSK_A,) * pattern.count("psk"))
    try:
        payload = responder.read_message(data)
    except RemoteProtocolError as exc:
        assert exc.code in (CloseCode.AUTH_FAILED, CloseCode.PROTOCOL_ERROR)
    else:
        # only MAC-less first messages (NN, XX) can be accepted: e || clear payload
        assert pattern in ("NN", "XX")
        assert payload == data[32:]
        assert responder.is_my_turn


@given(st.sampled_from(["NN", "XX", "IK", "IKpsk2"]), st.binary(max_size=200))
def test_second_message_any_bytes_parses_or_remote_error(pattern: str, data: bytes) -> None:
    initiator, responder = _pair(pattern, (PSK_A,) * pattern.count("psk"))
    responder.read_message(initiator.write_message(b""))
    with pytest.raises(RemoteProtocolError):
        initiator.read_message(data)  # every second message carries a MAC


def test_a_released_cipher_state_makes_its_aead_again_with_the_same_key_and_nonce() -> None:
    import os

    from raven.protocol.noise_crypto import CipherState

    key = os.urandom(32)
    kept, released = CipherState(key), CipherState(key)
    for i in range(4):
        if i % 2:
            released.release()
        assert released.encrypt_with_ad(b"ad", b"hello") == kept.encrypt_with_ad(b"ad", b"hello")
    kept.rekey()
    released.release()
    released.rekey()
    assert released.encrypt_with_ad(b"", b"after rekey") == kept.encrypt_with_ad(
        b"", b"after rekey"
    )
    empty = CipherState()
    empty.release()
    assert empty.encrypt_with_ad(b"", b"plain") == b"plain"  # no key: unchanged, as before


def test_x25519_from_the_rust_functions_is_cryptographys_public_x25519() -> None:
    """noise_crypto calls cryptography's Rust X25519 functions directly (not the public
    classmethods, whose first call imports the whole OpenSSL backend): same keys, same DH."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )

    from raven.protocol.noise_crypto import dh, generate_private_key, private_key

    ours = generate_private_key()
    theirs = X25519PrivateKey.generate()
    raw = ours.private_bytes_raw()
    same = private_key(raw)
    assert isinstance(ours, X25519PrivateKey) and isinstance(same, X25519PrivateKey)
    assert same.public_key().public_bytes_raw() == (
        X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    )
    their_pub = theirs.public_key().public_bytes_raw()
    assert dh(ours, their_pub) == theirs.exchange(
        X25519PublicKey.from_public_bytes(ours.public_key().public_bytes_raw())
    )
