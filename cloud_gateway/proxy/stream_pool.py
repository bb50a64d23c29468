"""Idle tunnel streams kept for the next request to the same target, from any client connection.

A stream whose exchange ended at a message boundary (the target keeps its connection, the body
ended by its framing) can carry another request: the agent's connection to the target stays
open behind it. A client connection keeps its last stream for its own next request
(``http_conn``); when it moves to another target or closes, the stream comes here instead of
ending, and the next request to that target from *any* client takes it: no OPEN round trip, no
new TCP connection at the edge. Prometheus needs this: its HTTP client pools connections to a
``proxy_url`` and hands each scrape whichever is free, so a connection's last target is rarely
its next one.

Bounds: at most ``PER_TARGET`` idle streams per (node, port) and ``TOTAL`` in all (the oldest
ends first), a tunnel only lends streams while it is at most half full of them
(``ByteStream.reusable``), and a stream idle for ``IDLE_S`` ends (END; the agent closes its
target connection), well before the keep-alive timeouts of common exporters. Taken streams are
the most recently used (the least likely to have been closed by the target meanwhile); a stale
one fails before any response byte and the request is sent again on a new stream.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from raven.transport.stream import ByteStream

__all__ = ["IDLE_S", "PER_TARGET", "TOTAL", "StreamPool"]

#: Idle streams kept per (node, port).
PER_TARGET = 8
#: Idle streams kept in all.
TOTAL = 4096
#: An idle stream older than this ends.
IDLE_S = 30.0

Key = tuple[str, int]


class StreamPool:
    """Idle reusable streams by (node, port) (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._idle: dict[Key, collections.deque[tuple[float, ByteStream]]] = {}
        self._count = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    def __len__(self) -> int:
        return self._count

    def put(self, key: Key, stream: ByteStream) -> None:
        """Keep ``stream`` for the next request to ``key``, or end it when it cannot be kept."""
        if self.closed or not stream.reusable():
            _end(stream)
            return
        idle = self._idle.setdefault(key, collections.deque())
        idle.append((self._clock(), stream))
        self._count += 1
        if len(idle) > PER_TARGET:
            self._drop(key, idle)
        if self._count > TOTAL:
            self._drop_oldest()
        self._arm()

    def take(self, key: Key) -> ByteStream | None:
        """The most recently kept stream to ``key`` still whole, or None."""
        idle = self._idle.get(key)
        while idle:
            _, stream = idle.pop()
            self._count -= 1
            if stream.reusable():
                if not idle:
                    del self._idle[key]
                return stream
            _end(stream)
        self._idle.pop(key, None)
        return None

    def close(self) -> None:
        """End every idle stream and keep none from now on (a drain)."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in self._idle.values():
            for _, stream in idle:
                _end(stream)
        self._idle.clear()
        self._count = 0

    def sweep(self) -> None:
        """End the streams idle for longer than IDLE_S (and those no longer whole)."""
        self._sweeper = None
        horizon = self._clock() - IDLE_S
        for key in list(self._idle):
            idle = self._idle[key]
            kept: collections.deque[tuple[float, ByteStream]] = collections.deque()
            for at, stream in idle:
                if at > horizon and stream.reusable():
                    kept.append((at, stream))
                else:
                    _end(stream)
            self._count -= len(idle) - len(kept)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        self._arm()

    def _drop(self, key: Key, idle: collections.deque[tuple[float, ByteStream]]) -> None:
        _, stream = idle.popleft()
        self._count -= 1
        _end(stream)
        if not idle:
            del self._idle[key]

    def _drop_oldest(self) -> None:
        key = min(self._idle, key=lambda k: self._idle[k][0][0])
        self._drop(key, self._idle[key])

    def _arm(self) -> None:
        if self._sweeper is None and self._count:
            self._sweeper = asyncio.get_running_loop().call_later(IDLE_S / 2, self.sweep)


def _end(stream: ByteStream) -> None:
    """END and release ``stream`` (the agent then closes its target connection)."""
    stream.end()
    stream.close()
