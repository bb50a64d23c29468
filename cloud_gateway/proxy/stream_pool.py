"""Idle tunnel streams, kept for the next request to the same target from any client connection.

A stream whose exchange ended at a message boundary (the target kept its connection, the body
ended by its framing) can carry another request: the agent's connection to the target stays
open behind it. Prometheus needs the pool to be gateway-wide, keyed by target: its HTTP client
pools its connections to a ``proxy_url`` and hands each scrape whichever is free, so a client
connection's last target is almost never its next one. Taking a stream here saves the OPEN,
the agent's TCP connect and the target's accept.

Bounds, each O(1) per call:

- ``max_idle`` streams in all. When full, the stream coming back is ended, not the oldest one:
  scrapes cycle through their targets, and evicting the oldest under a cycle longer than the
  pool would end every stream just before its next use (no hit at all), while keeping the
  ones held gives ``max_idle`` of the targets a hit every cycle.
- ``per_target`` per (node, port): the most requests a node may have in flight
  (``proxy.max_streams_per_node``), so the streams of a burst (16 keep-alive clients of one
  target) are all kept and none is reopened; past it the oldest of that target ends.
- A tunnel lends streams only while at most half its stream slots are taken
  (``ByteStream.reusable``): idle streams never crowd out new ones, and an agent holds at most
  that many idle target connections.
- A stream idle for ``idle_s`` ends (END: the agent closes its target connection). One timer
  for the whole pool sweeps from the oldest.

Taken streams are the most recently kept ones (the least likely to have been closed by their
target meanwhile). A stream whose target closed while idle is seen at ``take`` (the agent's END
arrived) and ended; one caught by the race fails before any response byte and the request,
which has no body, is sent again on a new stream (``http_conn``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raven.transport.stream import ByteStream

__all__ = ["StreamPool"]

#: The sweeper runs at most this often (it ends every stream past ``idle_s`` each time).
_SWEEP_EVERY_S = 1.0

Key = tuple[str, int]


class StreamPool:
    """Idle reusable streams by (node, port) (see the module docstring)."""

    def __init__(
        self, max_idle: int, idle_s: float, clock: Callable[[], float], *, per_target: int = 64
    ) -> None:
        self.max_idle = max_idle
        self.per_target = per_target
        self.idle_s = idle_s
        self._clock = clock
        #: every idle stream -> (its key, when it was kept); insertion order is age order
        self._since: dict[ByteStream, tuple[Key, float]] = {}
        #: per key, its idle streams, the most recently kept last
        self._by_key: dict[Key, list[ByteStream]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False
        #: takes that found a whole stream / found none / found only dead ones (ended)
        self.hits = 0
        self.misses = 0
        self.stale = 0

    def __len__(self) -> int:
        return len(self._since)

    @property
    def enabled(self) -> bool:
        return self.max_idle > 0 and not self.closed

    def put(self, key: Key, stream: ByteStream) -> None:
        """Keep ``stream`` for the next request to ``key``, or end it when it cannot stay."""
        if not self.enabled or len(self._since) >= self.max_idle or not stream.reusable():
            _end(stream)
            return
        idle = self._by_key.get(key)
        if idle is None:
            idle = self._by_key[key] = []
        elif len(idle) >= self.per_target:
            oldest = idle.pop(0)
            del self._since[oldest]
            _end(oldest)
        idle.append(stream)
        self._since[stream] = (key, self._clock())
        if self._sweeper is None:
            self._arm()

    def take(self, key: Key) -> ByteStream | None:
        """The most recently kept stream to ``key`` still whole, or None."""
        idle = self._by_key.get(key)
        if idle is None:
            self.misses += 1
            return None
        found = None
        while idle:
            stream = idle.pop()
            del self._since[stream]
            if stream.reusable():
                found = stream
                break
            self.stale += 1
            _end(stream)
        if not idle:
            del self._by_key[key]
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def close(self) -> None:
        """End every idle stream and keep none from now on (a drain)."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        streams = list(self._since)
        self._since.clear()
        self._by_key.clear()
        for stream in streams:
            _end(stream)

    def sweep(self) -> None:
        """End the streams idle for ``idle_s`` or longer (the oldest first)."""
        self._sweeper = None
        horizon = self._clock() - self.idle_s
        since = self._since
        while since:
            stream = next(iter(since))
            key, at = since[stream]
            if at > horizon:
                break
            del since[stream]
            idle = self._by_key[key]
            idle.remove(stream)  # the oldest of its key: at the front
            if not idle:
                del self._by_key[key]
            _end(stream)
        if since:
            self._arm()

    def _arm(self) -> None:
        """One timer: when the oldest stream reaches ``idle_s`` (at most one sweep a second)."""
        oldest_at = next(iter(self._since.values()))[1]
        delay = max(oldest_at + self.idle_s - self._clock(), _SWEEP_EVERY_S)
        self._sweeper = asyncio.get_running_loop().call_later(delay, self.sweep)


def _end(stream: ByteStream) -> None:
    """END and release ``stream`` (the agent then closes its target connection)."""
    stream.end()
    stream.close()
