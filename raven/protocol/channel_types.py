"""Small types of the secure channel: which end it is (:class:`Role`) and what connected
when the magic is wrong (its counters: raven.protocol.stats)."""

from __future__ import annotations

import enum

from raven.protocol.constants import MAGIC
from raven.protocol.errors import HandshakeRejected, RemoteProtocolError

__all__ = ["Role", "check_magic", "describe_bad_magic"]

_HTTP_STARTS = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"CONN", b"PATC", b"PRI ")


class Role(enum.Enum):
    """Which end of the tunnel: the edge agent dials (initiator), the gateway listens."""

    INITIATOR = "initiator"
    RESPONDER = "responder"


def check_magic(start: bytes) -> None:
    """The first bytes of an incoming connection: MAGIC, else an error naming what connected
    (HandshakeRejected ``unsupported_version`` for a Raven agent of another wire version)."""
    if start == MAGIC:
        return
    if start[:3] == MAGIC[:3]:
        raise HandshakeRejected(
            f"an agent of tunnel wire version {start[3:]!r} connected, this gateway speaks"
            f" {MAGIC[3:]!r}: run the same Raven release on both",
            "unsupported_version",
        )
    raise RemoteProtocolError(describe_bad_magic(start))


def describe_bad_magic(start: bytes) -> str:
    if start.startswith(_HTTP_STARTS):
        return f"an HTTP client connected to the tunnel port (got {start!r})"
    if start.startswith(b"\x16\x03"):
        return "a TLS client connected to the tunnel port"
    if start.startswith(b"SSH-"):
        return "an SSH client connected to the tunnel port"
    return f"not a Raven tunnel client: expected magic {MAGIC!r}, got {start!r}"
