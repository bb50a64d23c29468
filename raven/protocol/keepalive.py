"""Keepalive of one tunnel: when to PING, the round-trip time, when the peer is dead.

Sans-IO: every method takes ``now``; :class:`Keepalive` returns the PING payloads to
send and the deadlines to wake up at, and the multiplexer frames and queues them.
"""

from __future__ import annotations

from raven.protocol.limits import Limits

__all__ = ["Keepalive"]

#: PINGs awaiting their PONG that we remember (for RTT).
MAX_PINGS_IN_FLIGHT = 4


class Keepalive:
    """PING every ``keepalive_interval_s``; the peer is dead after ``dead_peer_timeout_s``
    of silence."""

    __slots__ = (
        "_counter",
        "_interval_s",
        "_next_ping",
        "_pings",
        "dead_after_s",
        "last_received",
        "rtt_s",
    )

    def __init__(self, limits: Limits, now: float) -> None:
        self._interval_s = limits.keepalive_interval_s
        self.dead_after_s = limits.dead_peer_timeout_s
        #: when the peer was last heard from (a record received): the receive path sets it
        self.last_received = now
        self._next_ping = now + self._interval_s
        self._pings: dict[bytes, float] = {}
        self._counter = 0
        #: latest PING/PONG round-trip time, None before the first PONG
        self.rtt_s: float | None = None

    def start(self, now: float) -> None:
        """The tunnel opened: silence and the PING interval count from ``now``."""
        self.last_received = now
        self._next_ping = now + self._interval_s

    def deadline(self) -> float:
        """When :meth:`dead` or :meth:`ping_due` may next turn true."""
        return min(self._next_ping, self.last_received + self.dead_after_s)

    def dead(self, now: float) -> bool:
        return now >= self.last_received + self.dead_after_s

    def ping_due(self, now: float) -> bool:
        return now >= self._next_ping

    def ping(self, now: float) -> bytes:
        """The opaque payload of a PING sent now (the next one is due an interval later)."""
        self._counter += 1
        opaque = self._counter.to_bytes(8, "big")
        self._pings[opaque] = now
        while len(self._pings) > MAX_PINGS_IN_FLIGHT:
            del self._pings[next(iter(self._pings))]
        self._next_ping = now + self._interval_s
        return opaque

    def pong(self, opaque: bytes, now: float) -> float | None:
        """A PONG arrived: the new RTT, or None for a PONG to no PING we remember."""
        sent_at = self._pings.pop(opaque, None)
        if sent_at is None:
            return None
        self.rtt_s = max(0.0, now - sent_at)
        return self.rtt_s
