"""The length each message of the secure channel may have, by channel state: checked from its
u16 length prefix, before the body is read or buffered (docs/protocol-handshake.md); and how
many bytes a held partial message still lacks; where a piece of input may end without cutting
a message in two."""

from __future__ import annotations

from raven.protocol.constants import LENGTH_PREFIX_BYTES, MAGIC
from raven.protocol.cookie import COOKIE_REPLY_BYTES
from raven.protocol.errors import HandshakeRejected, RemoteProtocolError
from raven.protocol.handshake import INITIATION_BYTES, RESPONSE_BYTES
from raven.protocol.lifecycle import ESTABLISHED_STATES, ChannelState
from raven.protocol.records import MIN_RECORD_BYTES
from raven.protocol.suites import PREAMBLE_BYTES

__all__ = ["MAX_WALK_MESSAGES", "check_length", "message_end", "missing_bytes"]

#: Messages `message_end` reads the length of before it settles for ``at_least``: beyond it the
#: messages are small, and so is the copy of the one a cut there leaves partial.
MAX_WALK_MESSAGES = 64


def check_length(state: ChannelState, length: int) -> None:
    """Raise (HandshakeRejected ``malformed`` during the handshake, RemoteProtocolError for
    a record) unless a message of ``length`` bytes can come next in ``state``."""
    if state in ESTABLISHED_STATES or state is ChannelState.AWAIT_CONFIRMATION:
        if length < MIN_RECORD_BYTES:
            raise RemoteProtocolError(f"record of {length} bytes is too short")
    elif state is ChannelState.AWAIT_INITIATION:
        if length != INITIATION_BYTES:
            raise HandshakeRejected(
                f"initiation of {length} bytes, expected {INITIATION_BYTES}", "malformed"
            )
    elif length not in (RESPONSE_BYTES, COOKIE_REPLY_BYTES):
        start = length.to_bytes(LENGTH_PREFIX_BYTES, "big")
        raise HandshakeRejected(
            f"response of {length} bytes, expected {RESPONSE_BYTES} (starts {start!r}: "
            "is the gateway address really a Raven tunnel port?)",
            "malformed",
        )


def missing_bytes(state: ChannelState, held: bytearray) -> int:
    """Bytes the ``held`` partial message (or magic, or length prefix) still lacks."""
    if state is ChannelState.AWAIT_MAGIC:  # the magic is checked before the suite
        return (len(MAGIC) if len(held) < len(MAGIC) else PREAMBLE_BYTES) - len(held)
    if len(held) < LENGTH_PREFIX_BYTES:
        return LENGTH_PREFIX_BYTES - len(held)
    return LENGTH_PREFIX_BYTES + ((held[0] << 8) | held[1]) - len(held)


def message_end(view: bytes | memoryview, at_least: int, first: int = 0) -> int:
    """The end of the first u16-length-prefixed message in ``view`` that ends at or past
    ``at_least``, ``view`` starting ``first`` bytes before a message boundary (what a held
    partial message lacks); ``len(view)`` when none ends in it; ``at_least`` itself when over
    MAX_WALK_MESSAGES messages come before it. A piece of input cut there leaves no message
    in two pieces, which the channel would copy together (``SecureChannel.held``)."""
    end = len(view)
    pos = first
    for _ in range(MAX_WALK_MESSAGES):
        if pos >= at_least:
            return min(pos, end)
        if pos + LENGTH_PREFIX_BYTES > end:
            return end
        pos += LENGTH_PREFIX_BYTES + ((view[pos] << 8) | view[pos + 1])
    return at_least
