"""Token buckets keyed by source address, for handshake attempts (sans-IO).

Each key gets a bucket of ``burst`` tokens refilled at ``rate_per_s``; an
attempt takes one token or is refused. At most ``max_keys`` buckets are kept:
buckets that have refilled completely carry no information and are dropped
first; beyond that the least recently used bucket is evicted (that source
starts again with a full bucket: memory stays bounded, which matters more
under a flood of spoofed-looking sources than exactness for the oldest one).
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

__all__ = ["Budget", "RateLimiter"]


class RateLimiter:
    """``allow(key, now)``: may this source make one more attempt now?"""

    def __init__(self, *, rate_per_s: float, burst: float, max_keys: int = 65536) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_keys = max_keys
        # key -> (tokens, time of last update); oldest use first
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        #: attempts refused so far
        self.refused = 0

    def allow(self, key: str, now: float) -> bool:
        """Take one token from ``key``'s bucket; False (and nothing taken) if empty."""
        buckets = self._buckets
        entry = buckets.get(key)
        if entry is None:
            tokens = self.burst
            self._make_room(now)
        else:
            tokens, last = entry
            elapsed = max(0.0, now - last)
            tokens = min(self.burst, tokens + elapsed * self.rate_per_s)
            buckets.move_to_end(key)
        if tokens >= 1.0:
            buckets[key] = (tokens - 1.0, now)
            return True
        buckets[key] = (tokens, now)
        self.refused += 1
        return False

    def _make_room(self, now: float) -> None:
        buckets = self._buckets
        if len(buckets) < self.max_keys:
            return
        # Among the oldest few, drop the buckets that have refilled (they equal a
        # fresh one); then evict the least recently used until there is room.
        for key, (tokens, last) in list(islice(buckets.items(), 16)):
            if tokens + (now - last) * self.rate_per_s >= self.burst:
                del buckets[key]
        while len(buckets) >= self.max_keys:
            buckets.popitem(last=False)

    def __len__(self) -> int:
        """Buckets currently tracked (at most ``max_keys``)."""
        return len(self._buckets)


class Budget:
    """One token bucket (sans-IO): ``rate_per_s`` refill, ``capacity`` tokens at most,
    full at the start. :meth:`spend` takes ``amount`` tokens, or returns False."""

    __slots__ = ("_last", "_tokens", "capacity", "rate_per_s")

    def __init__(self, *, rate_per_s: float, capacity: float, now: float) -> None:
        if rate_per_s <= 0 or capacity <= 0:
            raise ValueError("rate_per_s and capacity must be positive")
        self.rate_per_s = float(rate_per_s)
        self.capacity = float(capacity)
        self._tokens = self.capacity
        self._last = now

    def spend(self, amount: float, now: float) -> bool:
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._tokens = min(self.capacity, self._tokens + elapsed * self.rate_per_s)
        if amount > self._tokens:
            return False
        self._tokens -= amount
        return True
