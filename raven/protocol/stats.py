"""The counters of a tunnel, live objects updated in place and read for metrics and status.

:class:`ChannelStats` is the secure channel's (wire bytes, records, rekeys, re-handshakes,
cookie replies); :class:`TunnelStats` is the multiplexer's (frames by type, datagrams,
streams, resets) and holds the channel's object as ``wire``: each count is kept in one
place and read from there (``conn.stats.wire.bytes_sent``), never copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChannelStats", "TunnelStats"]


@dataclass(slots=True)
class ChannelStats:
    """Counters of one channel.

    Bytes are wire bytes (magic, handshake messages, length prefixes and records);
    records include key updates.
    """

    records_sent: int = 0
    records_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    rekeys_sent: int = 0
    rekeys_received: int = 0
    #: re-handshakes completed (new Diffie-Hellman keys inside the session)
    rehandshakes: int = 0
    #: (responder) cookie replies sent; (initiator) cookie replies accepted
    cookie_replies: int = 0


@dataclass(slots=True)
class TunnelStats:
    """Counters of one tunnel; frames are counted by type label (``data``, ``open``, ...)."""

    #: the channel's counters (the SecureChannel's own object: wire bytes, records, rekeys)
    wire: ChannelStats = field(default_factory=ChannelStats)
    frames_sent: dict[str, int] = field(default_factory=dict)
    frames_received: dict[str, int] = field(default_factory=dict)
    datagrams_sent: int = 0
    datagrams_received: int = 0
    #: by reason: ``oversize``, ``queue_full``, ``closed`` (ours), ``oversize_received``
    datagrams_dropped: dict[str, int] = field(default_factory=dict)
    #: streams we opened or accepted
    streams_opened: int = 0
    #: resets sent or received, by StreamCode label
    streams_reset: dict[str, int] = field(default_factory=dict)
    #: times the peer exceeded its control budget (the tunnel was closed)
    control_budget_exceeded: int = 0

    def count_reset(self, label: str) -> None:
        self.streams_reset[label] = self.streams_reset.get(label, 0) + 1

    def count_datagrams_sent(self, count: int) -> None:
        """``count`` DATAGRAM frames went into records (queued or through the lane)."""
        self.frames_sent["datagram"] = self.frames_sent.get("datagram", 0) + count
        self.datagrams_sent += count

    def count_drop(self, reason: str) -> bool:
        """Count a dropped datagram; False (it was not sent) for the caller to return."""
        self.datagrams_dropped[reason] = self.datagrams_dropped.get(reason, 0) + 1
        return False
