"""Bearer-token authentication of the admin routes that are not public.

/metrics, /healthz and /readyz stay open (probes and Prometheus); every other admin route
(the agents and nodes API with key halves, peer addresses and the inventory, the status page,
http_sd targets) needs ``Authorization: Bearer <token>`` once a token file is configured. The
token is read once from a file that group and others cannot read (like a key file).
"""

from __future__ import annotations

import stat
from pathlib import Path

from raven.keys import KeyError_
from raven.protocol.blake2s import bytes_eq

#: Shortest token accepted (bytes of text): a guessable one is refused at start.
MIN_TOKEN_BYTES = 16


def read_token_file(path: str | Path) -> bytes:
    """The token in ``path`` (surrounding whitespace stripped). Raises KeyError_ (one line)
    when the file is unreadable, open to group or others, or holds a token that is too short."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_bytes().strip()
    except OSError as exc:
        raise KeyError_(f"{p}: cannot read admin token file: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyError_(
            f"{p}: admin token file is accessible by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {p}"
        )
    if len(text) < MIN_TOKEN_BYTES or any(c <= 0x20 or c > 0x7E for c in text):
        raise KeyError_(
            f"{p}: the admin token must be at least {MIN_TOKEN_BYTES} printable characters "
            "without spaces (e.g. from: head -c 32 /dev/urandom | base64)"
        )
    return text


def bearer_matches(header: str, token: bytes) -> bool:
    """True when ``header`` (an Authorization value) carries ``token`` (constant time)."""
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return bytes_eq(credentials.strip().encode("ascii", "replace"), token)
