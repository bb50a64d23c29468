"""The Noise Protocol Framework (revision 34) for 25519 / ChaChaPoly or AESGCM / BLAKE2s.

The objects carry the spec's names (section 5): :class:`CipherState`,
:class:`SymmetricState` (both in `raven.protocol.noise_crypto`, with the crypto functions,
re-exported here) and :class:`HandshakeState`, with the spec's methods in snake case
(``EncryptWithAd`` -> ``encrypt_with_ad``). Built on ``cryptography`` (X25519,
ChaCha20-Poly1305, AES-256-GCM) and BLAKE2s with HMAC (`raven.protocol.blake2s`). The cipher is
the protocol name's: ``Noise_IKpsk2_25519_AESGCM_BLAKE2s`` runs AESGCM.

Supported handshake patterns: the one-way patterns N, K, X and the interactive
fundamental patterns NN NK NX KN KK KX XN XK XX IN IK IX, each with any ``pskN``
modifiers (``IKpsk2``, ``NNpsk0+psk2``...). Pre-message keys, a prologue and
fixed ephemeral keys (for test vectors) are supported.

Errors: anything wrong with a message read from the peer (short, too long,
failed authentication, a low-order public key) raises
:class:`~raven.protocol.errors.RemoteProtocolError`: with ``code``
``CloseCode.AUTH_FAILED`` when a MAC did not verify and ``CloseCode.PROTOCOL_ERROR``
for a malformed message. Misuse by our own code (writing out of turn, a nonce
exhausted) raises :class:`~raven.protocol.errors.LocalProtocolError`; bad
arguments to :meth:`HandshakeState.initialize` raise :class:`ValueError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from raven.protocol.constants import NOISE_MAX_MESSAGE_BYTES, TAG_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.noise_crypto import (
    CIPHERS,
    DHLEN,
    HASHLEN,
    MAX_NONCE,
    CipherState,
    SymmetricState,
    dh,
    generate_keypair,
    generate_private_key,
    hkdf,
    private_key,
    public_key,
)

__all__ = [
    "CIPHERS",
    "DHLEN",
    "HASHLEN",
    "MAX_NONCE",
    "PATTERNS",
    "CipherState",
    "HandshakeState",
    "SymmetricState",
    "dh",
    "generate_keypair",
    "hkdf",
    "public_key",
    "supports",
]

# --- Handshake patterns (spec 7) -----------------------------------------------------------

_Tokens = tuple[str, ...]
#: name -> (initiator pre-message, responder pre-message, message token lists)
PATTERNS: dict[str, tuple[_Tokens, _Tokens, tuple[_Tokens, ...]]] = {
    "N": ((), ("s",), (("e", "es"),)),
    "K": (("s",), ("s",), (("e", "es", "ss"),)),
    "X": ((), ("s",), (("e", "es", "s", "ss"),)),
    "NN": ((), (), (("e",), ("e", "ee"))),
    "NK": ((), ("s",), (("e", "es"), ("e", "ee"))),
    "NX": ((), (), (("e",), ("e", "ee", "s", "es"))),
    "KN": (("s",), (), (("e",), ("e", "ee", "se"))),
    "KK": (("s",), ("s",), (("e", "es", "ss"), ("e", "ee", "se"))),
    "KX": (("s",), (), (("e",), ("e", "ee", "se", "s", "es"))),
    "XN": ((), (), (("e",), ("e", "ee"), ("s", "se"))),
    "XK": ((), ("s",), (("e", "es"), ("e", "ee"), ("s", "se"))),
    "XX": ((), (), (("e",), ("e", "ee", "s", "es"), ("s", "se"))),
    "IN": ((), (), (("e", "s"), ("e", "ee", "se"))),
    "IK": ((), ("s",), (("e", "es", "s", "ss"), ("e", "ee", "se"))),
    "IX": ((), (), (("e", "s"), ("e", "ee", "se", "s", "es"))),
}
_ONE_WAY = frozenset({"N", "K", "X"})


_Pattern = tuple[_Tokens, _Tokens, tuple[_Tokens, ...]]


def _parse_protocol_name(name: str) -> tuple[str, str, _Pattern]:
    """(base pattern, cipher name, (pre-messages and messages with psk tokens placed))."""
    parts = name.split("_")
    if len(parts) != 5 or parts[0] != "Noise":
        raise ValueError(f"not a Noise protocol name: {name!r}")
    _, pattern, dh_name, cipher_name, hash_name = parts
    if (dh_name, hash_name) != ("25519", "BLAKE2s") or cipher_name not in CIPHERS:
        raise ValueError(f"only 25519_{{ChaChaPoly,AESGCM}}_BLAKE2s are supported, not {name!r}")
    index = 0
    while index < len(pattern) and pattern[index].isupper():
        index += 1
    base = pattern[:index]
    modifiers = [m for m in pattern[index:].split("+") if m]
    if base not in PATTERNS:
        raise ValueError(f"unsupported handshake pattern {base!r} in {name!r}")
    pre_i, pre_r, messages = PATTERNS[base]
    lists = [list(m) for m in messages]
    for modifier in modifiers:
        if not (modifier.startswith("psk") and modifier[3:].isdigit()):
            raise ValueError(f"unsupported pattern modifier {modifier!r} in {name!r}")
        position = int(modifier[3:])
        if position > len(lists):
            raise ValueError(f"{modifier} is past the last message of {base}")
        if position == 0:
            lists[0].insert(0, "psk")
        else:
            lists[position - 1].append("psk")
    return base, cipher_name, (pre_i, pre_r, tuple(tuple(m) for m in lists))


def supports(protocol_name: str) -> bool:
    """True when :meth:`HandshakeState.initialize` accepts this protocol name."""
    try:
        _parse_protocol_name(protocol_name)
    except ValueError:
        return False
    return True


# --- HandshakeState (spec 5.3) -------------------------------------------------------------


class HandshakeState:
    """A handshake in progress: build with :meth:`initialize`, then alternate
    :meth:`write_message` and :meth:`read_message`; after the last message
    :meth:`split` returns the transport CipherStates."""

    def __init__(self) -> None:
        # Use HandshakeState.initialize(...); the constructor makes an empty shell.
        self.symmetric_state = SymmetricState(b"")
        self.initiator = False
        self.protocol_name = ""
        self._s: X25519PrivateKey | None = None
        self._s_pub: bytes | None = None
        self._e: X25519PrivateKey | None = None
        self._e_pub: bytes | None = None
        self._fixed_e: bytes | None = None
        self.rs: bytes | None = None
        self.re: bytes | None = None
        self._psks: list[bytes] = []
        self._psk_mode = False
        self._messages: tuple[_Tokens, ...] = ()
        self._index = 0
        self._one_way = False
        self._result: tuple[CipherState, CipherState] | None = None

    @classmethod
    def initialize(
        cls,
        protocol_name: str | bytes,
        *,
        initiator: bool,
        prologue: bytes = b"",
        s: bytes | None = None,
        e: bytes | None = None,
        rs: bytes | None = None,
        re: bytes | None = None,
        psks: Sequence[bytes] = (),
    ) -> HandshakeState:
        """Initialize(handshake_pattern, initiator, prologue, s, e, rs, re) plus PSKs.

        ``s`` and ``e`` are 32-byte *private* keys (``e`` only to replay test
        vectors: normally the ephemeral is generated when the pattern needs it);
        ``rs`` and ``re`` are the peer's public keys known in advance. ``psks``
        are used in order by the ``psk`` tokens.
        """
        name = protocol_name.decode("ascii") if isinstance(protocol_name, bytes) else protocol_name
        base, cipher, (pre_i, pre_r, messages) = _parse_protocol_name(name)
        self = cls()
        self.protocol_name = name
        self.initiator = initiator
        self.symmetric_state = SymmetricState(name.encode("ascii"), cipher)
        self.symmetric_state.mix_hash(prologue)
        if s is not None:
            self._s = private_key(s)
            self._s_pub = public_key(s)
        if e is not None:
            self._fixed_e = bytes(e)
        self.rs = bytes(rs) if rs is not None else None
        self.re = bytes(re) if re is not None else None
        self._messages = messages
        self._one_way = base in _ONE_WAY
        self._psk_mode = any("psk" in m for m in messages)
        self._psks = [bytes(p) for p in psks]
        wanted_psks = sum(m.count("psk") for m in messages)
        if len(self._psks) < wanted_psks:
            raise ValueError(f"{name} needs {wanted_psks} PSK(s)")
        if any(len(p) != 32 for p in self._psks):
            raise ValueError("a PSK is 32 bytes")
        for token_list, owner_is_initiator in ((pre_i, True), (pre_r, False)):
            for _key_name in token_list:
                mine = owner_is_initiator == initiator
                key = self._s_pub if mine else self.rs
                if key is None:
                    whose = "local static (s)" if mine else "remote static (rs)"
                    raise ValueError(f"{name} needs the {whose} key before the handshake")
                self.symmetric_state.mix_hash(key)
        for i, tokens in enumerate(messages):
            writer_is_initiator = i % 2 == 0
            if "s" in tokens and writer_is_initiator == initiator and self._s is None:
                raise ValueError(f"{name} needs a local static key (s)")
        return self

    # -- state ------------------------------------------------------------------------------

    @property
    def handshake_complete(self) -> bool:
        return self._result is not None

    @property
    def is_my_turn(self) -> bool:
        """True when the next handshake message is ours to write."""
        return (self._index % 2 == 0) == self.initiator

    @property
    def remote_static(self) -> bytes | None:
        return self.rs

    @property
    def remote_ephemeral(self) -> bytes | None:
        return self.re

    @property
    def local_static_public(self) -> bytes | None:
        return self._s_pub

    @property
    def local_ephemeral_public(self) -> bytes | None:
        return self._e_pub

    @property
    def one_way(self) -> bool:
        """True for N, K, X: after the single message only initiator->responder is used."""
        return self._one_way

    def get_handshake_hash(self) -> bytes:
        return self.symmetric_state.get_handshake_hash()

    def split(self) -> tuple[CipherState, CipherState]:
        """(initiator->responder, responder->initiator) once the last message is done."""
        if self._result is None:
            raise LocalProtocolError("the handshake is not complete")
        return self._result

    # -- messages ---------------------------------------------------------------------------

    def _next_tokens(self, writing: bool) -> _Tokens:
        if self._result is not None:
            raise LocalProtocolError("the handshake is already complete")
        if writing != self.is_my_turn:
            raise LocalProtocolError("not our turn to write" if writing else "not our turn to read")
        return self._messages[self._index]

    def _dh_token(self, token: str) -> bytes:
        # "es": initiator's e with responder's s; "se": initiator's s with responder's e.
        first, second = token[0], token[1]
        if self.initiator:
            local, remote = first, second
        else:
            local, remote = second, first
        local_key = self._e if local == "e" else self._s
        remote_key = self.re if remote == "e" else self.rs
        if local_key is None or remote_key is None:
            raise LocalProtocolError(f"missing key for token {token}")
        return dh(local_key, remote_key)

    def _finish_message(self) -> None:
        self._index += 1
        if self._index == len(self._messages):
            self._result = self.symmetric_state.split()

    def write_message(self, payload: bytes = b"") -> bytes:
        """WriteMessage(payload): the next handshake message, as bytes."""
        tokens = self._next_tokens(writing=True)
        ss = self.symmetric_state
        out = bytearray()
        for step in tokens:
            if step == "e":
                if self._fixed_e is not None:
                    self._e = private_key(self._fixed_e)
                    self._fixed_e = None
                else:
                    self._e = generate_private_key()
                self._e_pub = self._e.public_key().public_bytes_raw()
                out += self._e_pub
                ss.mix_hash(self._e_pub)
                if self._psk_mode:
                    ss.mix_key(self._e_pub)
            elif step == "s":
                assert self._s_pub is not None  # checked in initialize
                out += ss.encrypt_and_hash(self._s_pub)
            elif step == "psk":
                ss.mix_key_and_hash(self._psks.pop(0))
            else:
                ss.mix_key(self._dh_token(step))
        out += ss.encrypt_and_hash(bytes(payload))
        if len(out) > NOISE_MAX_MESSAGE_BYTES:
            raise LocalProtocolError("handshake payload too large")
        self._finish_message()
        return bytes(out)

    def read_message(self, message: bytes | bytearray | memoryview) -> bytes:
        """ReadMessage(message): the decrypted payload. Anything wrong with the
        message raises RemoteProtocolError; the handshake must then be abandoned."""
        tokens = self._next_tokens(writing=False)
        message = bytes(message)
        if len(message) > NOISE_MAX_MESSAGE_BYTES:
            raise RemoteProtocolError("handshake message longer than 65535 bytes")
        ss = self.symmetric_state
        offset = 0
        for step in tokens:
            if step == "e":
                if len(message) - offset < DHLEN:
                    raise RemoteProtocolError("handshake message too short (ephemeral key)")
                self.re = message[offset : offset + DHLEN]
                offset += DHLEN
                ss.mix_hash(self.re)
                if self._psk_mode:
                    ss.mix_key(self.re)
            elif step == "s":
                size = DHLEN + TAG_BYTES if ss.cipher_state.has_key() else DHLEN
                if len(message) - offset < size:
                    raise RemoteProtocolError("handshake message too short (static key)")
                self.rs = ss.decrypt_and_hash(message[offset : offset + size])
                offset += size
            elif step == "psk":
                ss.mix_key_and_hash(self._psks.pop(0))
            else:
                ss.mix_key(self._dh_token(step))
        rest = message[offset:]
        if ss.cipher_state.has_key() and len(rest) < TAG_BYTES:
            raise RemoteProtocolError("handshake message too short (payload tag)")
        payload = ss.decrypt_and_hash(rest)
        self._finish_message()
        return payload
