"""BLAKE2s as the handshake uses it: HASH, keyed MAC and HMAC-BLAKE2s (Noise spec 4.3), and a
comparison of MACs that tells a timing observer nothing.

BLAKE2s comes from CPython's built-in ``_blake2`` module, the one ``hashlib.blake2s`` is.
Importing ``hashlib`` or ``hmac`` loads ``_hashlib``, and with it the system's libcrypto:
3.4 MiB of a process's RSS for functions Raven does not use (its ciphers and X25519 come
from ``cryptography``). HMAC is RFC 2104 over that BLAKE2s (block 64 bytes), as
``hmac.digest(key, data, hashlib.blake2s)`` computes it (a test compares the two).
``hmac.compare_digest`` (and cryptography's ``bytes_eq``, which calls it) would load
``_hashlib`` again: `bytes_eq` compares keyed BLAKE2s digests of its two inputs instead (the
"double HMAC" comparison), so where a mismatch is found says nothing about either input.
"""

from __future__ import annotations

import random

try:
    from _blake2 import blake2s
except ImportError:  # pragma: no cover - a Python built without its _blake2 module
    from hashlib import blake2s

__all__ = ["BLOCK_BYTES", "HASH_BYTES", "bytes_eq", "hash_", "hmac_", "keyed_mac"]

#: BLAKE2s's block: HMAC pads its key to this length.
BLOCK_BYTES = 64
#: HASHLEN of the Noise suites (BLAKE2s-256).
HASH_BYTES = 32

_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
#: Keys `bytes_eq`'s digests: random, and never leaves the process.
_COMPARE_KEY = random.SystemRandom().randbytes(HASH_BYTES)  # os.urandom's


def hash_(data: bytes) -> bytes:
    """BLAKE2s-256 of ``data``."""
    return blake2s(data).digest()


def keyed_mac(key: bytes, data: bytes, digest_bytes: int) -> bytes:
    """BLAKE2s keyed with ``key`` (at most 32 bytes), ``digest_bytes`` long."""
    return blake2s(data, key=key, digest_size=digest_bytes).digest()


def hmac_(key: bytes, data: bytes) -> bytes:
    """HMAC-BLAKE2s(key, data) (RFC 2104)."""
    if len(key) > BLOCK_BYTES:
        key = blake2s(key).digest()
    key = key.ljust(BLOCK_BYTES, b"\x00")
    inner = blake2s(key.translate(_IPAD))
    inner.update(data)
    outer = blake2s(key.translate(_OPAD))
    outer.update(inner.digest())
    return outer.digest()


def bytes_eq(a: bytes, b: bytes) -> bool:
    """``a == b`` without a timing side channel: the digests compared are keyed with a secret
    of this process, so an attacker learns nothing from how early they differ."""
    return keyed_mac(_COMPARE_KEY, a, HASH_BYTES) == keyed_mac(_COMPARE_KEY, b, HASH_BYTES)
