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


def _quarter_round(a: int, b: int, c: int, d: int) -> tuple[int, int, int, int]:
    m = _MASK
    a = (a + b) & m
    d ^= a
    d = ((d << 16) | (d >> 16)) & m
    c = (c + d) & m
    b ^= c
    b = ((b << 12) | (b >> 20)) & m
    a = (a + b) & m
    d ^= a
    d = ((d << 8) | (d >> 24)) & m
    c = (c + d) & m
    b ^= c
    b = ((b << 7) | (b >> 25)) & m
    return a, b, c, d


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """The 32-byte HChaCha20 subkey of a 32-byte key and a 16-byte nonce (draft section 2.2):
    the ChaCha20 block function without the final addition, words 0-3 and 12-15 out.
    The state lives in locals (about twice as fast in CPython as indexing a list)."""
    if len(key) != 32 or len(nonce16) != 16:
        raise ValueError("HChaCha20 takes a 32-byte key and a 16-byte nonce")
    x0, x1, x2, x3 = _SIGMA
    x4, x5, x6, x7, x8, x9, x10, x11 = _WORDS8.unpack(key)
    x12, x13, x14, x15 = _WORDS4.unpack(nonce16)
    qr = _quarter_round
    for _ in range(10):
        x0, x4, x8, x12 = qr(x0, x4, x8, x12)  # columns
        x1, x5, x9, x13 = qr(x1, x5, x9, x13)
        x2, x6, x10, x14 = qr(x2, x6, x10, x14)
        x3, x7, x11, x15 = qr(x3, x7, x11, x15)
        x0, x5, x10, x15 = qr(x0, x5, x10, x15)  # diagonals
        x1, x6, x11, x12 = qr(x1, x6, x11, x12)
        x2, x7, x8, x13 = qr(x2, x7, x8, x13)
        x3, x4, x9, x14 = qr(x3, x4, x9, x14)
    return _WORDS8.pack(x0, x1, x2, x3, x12, x13, x14, x15)


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
