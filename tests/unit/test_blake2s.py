"""raven.protocol.blake2s against the standard library's hashlib and hmac (which the
protocol no longer imports: they load libcrypto), and the process it keeps small."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.blake2s import BLOCK_BYTES, bytes_eq, hash_, hmac_, keyed_mac

# Keys around the block size: shorter (zero-padded), exactly one block, longer (hashed).
KEYS = st.binary(max_size=2 * BLOCK_BYTES + 3)


@given(key=KEYS, data=st.binary(max_size=300))
def test_hmac_is_rfc2104_hmac_blake2s(key: bytes, data: bytes) -> None:
    assert hmac_(key, data) == hmac.digest(key, data, hashlib.blake2s)


def test_hmac_at_the_block_boundaries() -> None:
    for size in (0, 1, 31, 32, 33, 63, 64, 65, 128, 129):
        key = bytes(range(size % 256)) * (size // 256 + 1)
        key = key[:size]
        assert hmac_(key, b"abc") == hmac.digest(key, b"abc", hashlib.blake2s)


@given(key=st.binary(max_size=32), data=st.binary(max_size=200), size=st.integers(1, 32))
def test_keyed_mac_and_hash_are_hashlibs(key: bytes, data: bytes, size: int) -> None:
    assert keyed_mac(key, data, size) == hashlib.blake2s(data, key=key, digest_size=size).digest()
    assert hash_(data) == hashlib.blake2s(data).digest()


def test_bytes_eq() -> None:
    assert bytes_eq(b"\x01" * 16, b"\x01" * 16)
    assert not bytes_eq(b"\x01" * 16, b"\x01" * 15 + b"\x02")
    assert not bytes_eq(b"\x01" * 16, b"\x01" * 15)


def test_the_handshake_loads_no_libcrypto_of_the_system() -> None:
    """The Noise handshake and the cookie import neither hashlib nor hmac (``_hashlib`` maps
    the system's libcrypto: 3.4 MiB of an agent's RSS)."""
    code = (
        "import sys, raven.protocol.handshake, raven.protocol.cookie, raven.admin.auth;"
        "print('_hashlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
