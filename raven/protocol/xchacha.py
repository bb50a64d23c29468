"""XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha-03): HChaCha20 in pure Python, then
``cryptography``'s ChaCha20-Poly1305, which has no 24-byte-nonce variant.

Used only for the handshake's cookie reply (one small message per refused initiation
under load), so speed does not matter; the subkey derivation is 20 rounds on 16 words.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

__all__ = ["XNONCE_BYTES", "hchacha20", "xchacha20poly1305_open", "xchacha20poly1305_seal"]

#: Size of an XChaCha20 nonce.
XNONCE_BYTES = 24

_MASK = 0xFFFFFFFF
#: "expand 32-byte k", the ChaCha constants as four little-endian words
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
_WORDS8 = struct.Struct("<8I")
_WORDS4 = struct.Struct("<4I")


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _quarter_round(x: list[int], a: int, b: int, c: int, d: int) -> None:
    x[a] = (x[a] + x[b]) & _MASK
    x[d] = _rotl(x[d] ^ x[a], 16)
    x[c] = (x[c] + x[d]) & _MASK
    x[b] = _rotl(x[b] ^ x[c], 12)
    x[a] = (x[a] + x[b]) & _MASK
    x[d] = _rotl(x[d] ^ x[a], 8)
    x[c] = (x[c] + x[d]) & _MASK
    x[b] = _rotl(x[b] ^ x[c], 7)


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """The 32-byte HChaCha20 subkey of a 32-byte key and a 16-byte nonce (draft section 2.2):
    the ChaCha20 block function without the final addition, words 0-3 and 12-15 out."""
    if len(key) != 32 or len(nonce16) != 16:
        raise ValueError("HChaCha20 takes a 32-byte key and a 16-byte nonce")
    x = [*_SIGMA, *_WORDS8.unpack(key), *_WORDS4.unpack(nonce16)]
    for _ in range(10):
        _quarter_round(x, 0, 4, 8, 12)
        _quarter_round(x, 1, 5, 9, 13)
        _quarter_round(x, 2, 6, 10, 14)
        _quarter_round(x, 3, 7, 11, 15)
        _quarter_round(x, 0, 5, 10, 15)
        _quarter_round(x, 1, 6, 11, 12)
        _quarter_round(x, 2, 7, 8, 13)
        _quarter_round(x, 3, 4, 9, 14)
    return _WORDS4.pack(*x[0:4]) + _WORDS4.pack(*x[12:16])


def _aead(key: bytes, nonce: bytes) -> tuple[ChaCha20Poly1305, bytes]:
    if len(nonce) != XNONCE_BYTES:
        raise ValueError(f"an XChaCha20 nonce is {XNONCE_BYTES} bytes, got {len(nonce)}")
    return ChaCha20Poly1305(hchacha20(key, nonce[:16])), bytes(4) + nonce[16:]


def xchacha20poly1305_seal(key: bytes, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """AEAD_XChaCha20_Poly1305 encryption: ciphertext || 16-byte tag."""
    aead, short_nonce = _aead(key, nonce)
    return aead.encrypt(short_nonce, plaintext, ad)


def xchacha20poly1305_open(key: bytes, nonce: bytes, ciphertext: bytes, ad: bytes) -> bytes | None:
    """The plaintext, or None when ``ciphertext`` fails authentication."""
    aead, short_nonce = _aead(key, nonce)
    try:
        return aead.decrypt(short_nonce, ciphertext, ad)
    except InvalidTag:
        return None
