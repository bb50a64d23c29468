"""Wire codes: stream open/reset reasons and connection close reasons.

Values are part of the wire format (docs/protocol.md); never renumber.
"""

from __future__ import annotations

import enum


class StreamCode(enum.IntEnum):
    """Why a stream open was refused or a stream was reset (one byte on the wire)."""

    OK = 0
    UNKNOWN_NODE = 1  # the agent does not serve that node
    PORT_NOT_ALLOWED = 2  # the port is outside the agent's allow-list
    TARGET_REFUSED = 3  # TCP RST from the target
    TARGET_UNREACHABLE = 4  # no route / host down / DNS failure at the edge
    TARGET_TIMEOUT = 5  # connect to the target timed out
    BUSY = 6  # too many streams or too much buffered on this tunnel
    DRAINING = 7  # the side is shutting down (go-away sent)
    CANCELLED = 8  # the opener gave up (client went away, scrape timeout)
    TARGET_RESET = 9  # the target connection broke mid-stream
    INTERNAL = 10  # a bug or resource failure on the peer
    PROTOCOL_ERROR = 11  # the stream broke the protocol (e.g. exceeded its window)
    TUNNEL_CLOSED = 12  # local only: the tunnel carrying the stream went away

    @property
    def label(self) -> str:
        """Lower-case name for logs and metric labels."""
        return self.name.lower()


class CloseCode(enum.IntEnum):
    """Why a whole tunnel connection closed (one byte in the CLOSE frame)."""

    NORMAL = 0
    PROTOCOL_ERROR = 1
    AUTH_FAILED = 2  # handshake rejected or a record failed authentication
    KEEPALIVE_TIMEOUT = 3  # nothing heard from the peer within dead_peer_timeout_s
    DRAINED = 4  # graceful shutdown completed
    INTERNAL = 5
    LIMIT_EXCEEDED = 6  # peer broke a hard limit (frame size, buffered bytes)
    REPLACED = 7  # a newer tunnel from the same agent key replaced this one
    CONNECTION_LOST = 8  # local only: the TCP connection ended without a CLOSE frame

    @property
    def label(self) -> str:
        return self.name.lower()
