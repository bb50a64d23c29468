"""X25519 keys: generation, base64 text form (like `wg genkey`), and key files.

A private key file readable by group or others is refused, like ssh does.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

KEY_BYTES = 32


class KeyError_(ValueError):
    """A key or key file is unusable; the message says why and what to do."""


def generate_private_key() -> bytes:
    """32 random bytes, clamped as X25519 does."""
    raw = X25519PrivateKey.generate().private_bytes_raw()
    return raw


def public_key(private: bytes) -> bytes:
    """The X25519 public key of ``private``."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def encode_key(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_key(text: str) -> bytes:
    """Base64 text -> 32 raw bytes; KeyError_ on anything else."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyError_("not valid base64") from None
    if len(raw) != KEY_BYTES:
        raise KeyError_(f"a key is {KEY_BYTES} bytes, this one is {len(raw)}")
    return raw


def read_private_key_file(path: str | Path, *, check_mode: bool = True) -> bytes:
    """Read a base64 private key from ``path``, refusing group/other-readable files."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise KeyError_(f"{p}: cannot read key file: {exc.strerror or exc}") from None
    if check_mode and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyError_(
            f"{p}: key file is accessible by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {p}"
        )
    try:
        text = p.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyError_(f"{p}: cannot read key file: {exc}") from None
    try:
        return decode_key(text)
    except KeyError_ as exc:
        raise KeyError_(f"{p}: {exc}") from None


def write_private_key_file(path: str | Path, private: bytes) -> None:
    """Create ``path`` with mode 0600 holding the base64 key."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (encode_key(private) + "\n").encode("ascii"))
    finally:
        os.close(fd)
