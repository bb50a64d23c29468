"""Noise's crypto functions and its two lower objects (revision 34, sections 4, 5.1 and
5.2) for 25519 / ChaChaPoly or AESGCM / BLAKE2s: X25519 key pairs and DH, HKDF over
HMAC-BLAKE2s, :class:`CipherState` and :class:`SymmetricState`. The two cipher functions
(spec 12.2 and 12.3) differ only in the AEAD and the nonce's byte order: ChaChaPoly's 96-bit
nonce is 4 zero bytes and the 64-bit counter little-endian, AESGCM's the counter big-endian.
`raven.protocol.noise` builds the handshake on them. Errors as described there.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from raven.protocol.blake2s import BLOCK_BYTES, HASH_BYTES, hash_, hmac_
from raven.protocol.codes import CloseCode
from raven.protocol.constants import KEY_BYTES, TAG_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError

#: Size of an X25519 public key and of a DH output (the spec's name for KEY_BYTES).
DHLEN = KEY_BYTES
#: BLAKE2s output size.
HASHLEN = HASH_BYTES
#: BLAKE2s block size (HMAC).
BLOCKLEN = BLOCK_BYTES
#: Reserved nonce: never used to encrypt a message; used by ``rekey``.
MAX_NONCE = 2**64 - 1

#: Noise cipher names (the protocol name's third field) -> (AEAD, nonce layout).
CIPHERS: dict[str, tuple[type[ChaCha20Poly1305] | type[AESGCM], struct.Struct]] = {
    "ChaChaPoly": (ChaCha20Poly1305, struct.Struct("<4xQ")),  # 4 zero bytes + u64 little-endian
    "AESGCM": (AESGCM, struct.Struct(">4xQ")),  # 4 zero bytes + u64 big-endian
}
#: The cipher when none is named (the tunnel's default suite).
DEFAULT_CIPHER = "ChaChaPoly"
_ZEROS32 = bytes(32)

# X25519 from the functions of cryptography's Rust module that its public classmethods
# (X25519PrivateKey.generate and from_private_bytes, X25519PublicKey.from_public_bytes) call
# after asking its OpenSSL backend whether X25519 is supported: the backend's first import
# loads cffi, its hash, EC and x509 OID modules, 0.6 MiB of an agent's RSS (issue 12). The
# public classmethods stay the fallback should the binding move.
try:
    from cryptography.hazmat.bindings._rust import openssl as _rust_openssl

    _x25519 = _rust_openssl.x25519
    _generate_key = _x25519.generate_key
    _from_private_bytes = _x25519.from_private_bytes
    _from_public_bytes = _x25519.from_public_bytes
except (ImportError, AttributeError):  # pragma: no cover - another cryptography layout
    _generate_key = X25519PrivateKey.generate
    _from_private_bytes = X25519PrivateKey.from_private_bytes
    _from_public_bytes = X25519PublicKey.from_public_bytes

# --- Crypto functions (spec section 4) ---------------------------------------------------


def public_key(private: bytes) -> bytes:
    """The X25519 public key of a 32-byte private key."""
    return private_key(private).public_key().public_bytes_raw()


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh ``(private, public)`` X25519 key pair from the OS CSPRNG."""
    key = generate_private_key()
    private = key.private_bytes_raw()
    return private, key.public_key().public_bytes_raw()


def generate_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the OS CSPRNG."""
    return _generate_key()


def private_key(private: bytes) -> X25519PrivateKey:
    if len(private) != DHLEN:
        raise ValueError(f"an X25519 private key is {DHLEN} bytes, got {len(private)}")
    return _from_private_bytes(private)


class _Count:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


_DH_DONE = _Count()


def dh_operations() -> int:
    """X25519 exchanges done by this process so far (the handshake's expensive part; the
    cookie tests prove with it that a refused initiation cost none)."""
    return _DH_DONE.n


def dh(private: X25519PrivateKey, public: bytes) -> bytes:
    """DH(key_pair, public_key). A low-order peer key (all-zero output) is the peer's fault."""
    _DH_DONE.n += 1
    try:
        return private.exchange(_from_public_bytes(public))
    except ValueError:
        raise RemoteProtocolError("peer sent a low-order X25519 public key") from None


def hkdf(chaining_key: bytes, input_key_material: bytes, num_outputs: int) -> tuple[bytes, ...]:
    """HKDF(chaining_key, input_key_material, num_outputs) with HMAC-BLAKE2s (spec 4.3)."""
    temp_key = hmac_(chaining_key, input_key_material)
    output1 = hmac_(temp_key, b"\x01")
    output2 = hmac_(temp_key, output1 + b"\x02")
    if num_outputs == 2:
        return output1, output2
    output3 = hmac_(temp_key, output2 + b"\x03")
    return output1, output2, output3


# --- CipherState (spec 5.1) -----------------------------------------------------------------


class CipherState:
    """A key ``k`` (or none) and a 64-bit nonce ``n`` for one cipher (``CIPHERS``).

    One AEAD object is kept per key, so bulk use costs one AEAD call per message; it is made
    by the first message and :meth:`release` drops it while the key is idle (an AEAD object
    holds ~2.4 KiB of OpenSSL context; making one again costs ~1 us).
    ``n`` counts messages; ``2**64 - 1`` is reserved.
    """

    __slots__ = ("_aead", "_cls", "_k", "_nonce", "cipher", "n")

    def __init__(self, key: bytes | None = None, cipher: str = DEFAULT_CIPHER) -> None:
        if cipher not in CIPHERS:
            raise ValueError(f"unknown Noise cipher {cipher!r}")
        #: the Noise cipher name: "ChaChaPoly" or "AESGCM"
        self.cipher = cipher
        self._cls, self._nonce = CIPHERS[cipher]
        self._k: bytes | None = None
        self._aead: ChaCha20Poly1305 | AESGCM | None = None
        self.n = 0
        self.initialize_key(key)

    def initialize_key(self, key: bytes | None) -> None:
        """Set ``k`` (``None`` for "empty") and reset ``n`` to zero."""
        if key is not None and len(key) != 32:
            raise ValueError(f"a {self.cipher} key is 32 bytes")
        self._k = key
        self._aead = None  # made by the first message (_made)
        self.n = 0

    def has_key(self) -> bool:
        return self._k is not None

    def release(self) -> None:
        """Drop the AEAD object (the key stays; the next message makes it again)."""
        self._aead = None

    def _made(self) -> ChaCha20Poly1305 | AESGCM | None:
        """The AEAD object for ``k``, made now if released; None without a key."""
        if self._aead is None and self._k is not None:
            self._aead = self._cls(self._k)
        return self._aead

    def set_nonce(self, nonce: int) -> None:
        if not 0 <= nonce <= MAX_NONCE:
            raise ValueError("nonce out of range")
        self.n = nonce

    def encrypt_with_ad(self, ad: bytes, plaintext: bytes | memoryview) -> bytes:
        """Encrypt and increment ``n``; without a key, return ``plaintext`` unchanged."""
        aead = self._aead or self._made()
        if aead is None:
            return bytes(plaintext)
        n = self.n
        if n >= MAX_NONCE:
            raise LocalProtocolError("nonce exhausted: the key must be replaced")
        ciphertext = aead.encrypt(self._nonce.pack(n), plaintext, ad)
        self.n = n + 1
        return ciphertext

    def encrypt_with_ad_into(
        self, ad: bytes, plaintext: bytes | memoryview, buffer: memoryview
    ) -> int:
        """Like :meth:`encrypt_with_ad` but writes the ciphertext into ``buffer``
        (exactly ``len(plaintext) + 16`` bytes, not overlapping ``plaintext``) and
        returns its length: no allocation on the bulk path. Requires a key."""
        aead = self._aead or self._made()
        if aead is None:
            raise LocalProtocolError("encrypt_with_ad_into without a key")
        n = self.n
        if n >= MAX_NONCE:
            raise LocalProtocolError("nonce exhausted: the key must be replaced")
        aead.encrypt_into(self._nonce.pack(n), plaintext, ad, buffer)
        self.n = n + 1
        return len(buffer)

    def decrypt_with_ad(self, ad: bytes, ciphertext: bytes | memoryview) -> bytes:
        """Decrypt and increment ``n``; a failed check raises RemoteProtocolError
        (code AUTH_FAILED) and leaves ``n`` unchanged."""
        aead = self._aead or self._made()
        if aead is None:
            return bytes(ciphertext)
        n = self.n
        if n >= MAX_NONCE:
            raise RemoteProtocolError("peer exhausted the nonce space", CloseCode.AUTH_FAILED)
        try:
            plaintext = aead.decrypt(self._nonce.pack(n), ciphertext, ad)
        except InvalidTag:
            raise RemoteProtocolError(
                "message failed authentication", CloseCode.AUTH_FAILED
            ) from None
        self.n = n + 1
        return plaintext

    def decrypt_with_ad_into(
        self, ad: bytes, ciphertext: bytes | memoryview, buffer: memoryview
    ) -> int:
        """Like :meth:`decrypt_with_ad` but writes the plaintext into ``buffer``
        (at least ``len(ciphertext) - 16`` bytes) and returns its length: saves an
        allocation per message on the bulk path. Requires a key."""
        aead = self._aead or self._made()
        if aead is None:
            raise LocalProtocolError("decrypt_with_ad_into without a key")
        size = len(ciphertext) - TAG_BYTES
        if size < 0:
            raise RemoteProtocolError("message shorter than its tag", CloseCode.AUTH_FAILED)
        n = self.n
        if n >= MAX_NONCE:
            raise RemoteProtocolError("peer exhausted the nonce space", CloseCode.AUTH_FAILED)
        try:
            aead.decrypt_into(self._nonce.pack(n), ciphertext, ad, buffer[:size])
        except InvalidTag:
            raise RemoteProtocolError(
                "message failed authentication", CloseCode.AUTH_FAILED
            ) from None
        self.n = n + 1
        return size

    def rekey(self) -> None:
        """``k = REKEY(k)``: the first 32 bytes of ENCRYPT(k, maxnonce, zerolen, zeros).

        ``n`` is left unchanged, as the spec says; callers that want a fresh
        counter (our record layer does) call ``set_nonce(0)`` after it.
        """
        aead = self._aead or self._made()
        if aead is None:
            raise LocalProtocolError("rekey without a key")
        new_key = aead.encrypt(self._nonce.pack(MAX_NONCE), _ZEROS32, b"")[:32]
        self._k = new_key
        self._aead = None


# --- SymmetricState (spec 5.2) -------------------------------------------------------------


class SymmetricState:
    """Chaining key ``ck``, handshake hash ``h`` and a CipherState."""

    __slots__ = ("cipher", "cipher_state", "ck", "h")

    def __init__(self, protocol_name: bytes, cipher: str = DEFAULT_CIPHER) -> None:
        """InitializeSymmetric(protocol_name); ``cipher`` is the name's cipher field."""
        if len(protocol_name) <= HASHLEN:
            self.h = protocol_name.ljust(HASHLEN, b"\x00")
        else:
            self.h = hash_(protocol_name)
        self.ck = self.h
        self.cipher = cipher
        self.cipher_state = CipherState(None, cipher)

    def mix_key(self, input_key_material: bytes) -> None:
        self.ck, temp_k = hkdf(self.ck, input_key_material, 2)
        self.cipher_state.initialize_key(temp_k)

    def mix_hash(self, data: bytes) -> None:
        self.h = hash_(self.h + data)

    def mix_key_and_hash(self, input_key_material: bytes) -> None:
        self.ck, temp_h, temp_k = hkdf(self.ck, input_key_material, 3)
        self.mix_hash(temp_h)
        self.cipher_state.initialize_key(temp_k)

    def get_handshake_hash(self) -> bytes:
        return self.h

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher_state.encrypt_with_ad(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher_state.decrypt_with_ad(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        """Two CipherStates: initiator->responder first, responder->initiator second."""
        temp_k1, temp_k2 = hkdf(self.ck, b"", 2)
        return CipherState(temp_k1, self.cipher), CipherState(temp_k2, self.cipher)
