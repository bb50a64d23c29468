"""Protocol errors, named by whose fault they are (after h11).

Every parser in :mod:`raven.protocol` meets any input by either parsing it or
raising :class:`RemoteProtocolError`; nothing else escapes.
"""

from __future__ import annotations

from raven.protocol.codes import CloseCode


class ProtocolError(Exception):
    """Base class of every error the sans-IO core raises on purpose."""

    def __init__(self, message: str, code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class RemoteProtocolError(ProtocolError):
    """The peer sent something that breaks the protocol; the connection must close."""


class LocalProtocolError(ProtocolError):
    """Our own code asked for something illegal (a bug, or a closed stream)."""


#: Every ``HandshakeRejected.reason``: the values of the handshake metric's ``result`` label.
HANDSHAKE_REJECTIONS = frozenset(
    {
        "malformed",
        "bad_mac1",
        "cookie_required",
        "bad_cookie_reply",
        "decrypt_failed",
        "unknown_key",
        "unsupported_version",
        "unsupported_suite",
        "replay",
    }
)
#: The label of an unauthenticated tunnel closed because a record failed authentication (the
#: initiator's first record, which confirms the keys, was forged or garbage).
BAD_RECORD_REASON = "bad_record"


class HandshakeRejected(RemoteProtocolError):
    """A handshake that gets no useful answer: unknown key, bad MAC, replay, wrong gateway key."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, CloseCode.AUTH_FAILED)
        #: short machine-readable reason, used as a metric label (one of HANDSHAKE_REJECTIONS)
        self.reason = reason
