"""Keys as operators handle them: base64 text form (like `wg genkey`) and key files.

The keys themselves (size, generation, public key) are the protocol's
(`raven.protocol.constants.KEY_BYTES`, `raven.protocol.noise`). A private key file readable
by group or others is refused, like ssh does.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from raven.protocol.constants import KEY_BYTES
from raven.protocol.noise import generate_keypair, public_key

__all__ = [
    "KEY_BYTES",
    "KeyError_",
    "decode_key",
    "encode_key",
    "generate_private_key",
    "public_key",
    "read_private_key_file",
    "write_private_key_file",
]


class KeyError_(ValueError):
    """A key or key file is unusable; the message says why and what to do."""


def generate_private_key() -> bytes:
    """A new X25519 private key (raw bytes) from the OS CSPRNG."""
    return generate_keypair()[0]


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


def key_id(public: bytes | str) -> str:
    """A short, stable name for a public key in logs and status pages: the first 8 characters
    of its base64 form (as `wg show` abbreviates keys)."""
    text = encode_key(public) if isinstance(public, bytes) else public.strip()
    return text[:8]
