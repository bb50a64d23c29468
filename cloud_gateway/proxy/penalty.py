"""Clients that ignore Retry-After: refusals counted per client address, and a short penalty.

A client over its in-flight limit gets 429 with ``Retry-After: 1``. Prometheus and every polite
client come back later; a client that retries at once, in a loop, makes the gateway parse a
request head and write an answer for each try, on the event loop every site shares. Past
``max_per_s`` refusals within one second, the client's next connections are reset at accept,
before a byte is read, until ``penalty_s`` has passed.

No clock is read here: ``now`` (monotonic seconds) is passed in. Memory is bounded: at most
``max_clients`` addresses are tracked, the stalest dropped first.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Addresses tracked at most (refusal windows and penalties together).
MAX_TRACKED_CLIENTS = 4096


@dataclass(slots=True)
class _Client:
    window_start: float
    refusals: int
    until: float


class RefusalPenalty:
    """Per-address refusal counts over one-second windows; 0 ``max_per_s`` turns it off."""

    def __init__(
        self, *, max_per_s: int, penalty_s: float, max_clients: int = MAX_TRACKED_CLIENTS
    ) -> None:
        if max_per_s < 0 or penalty_s < 0 or max_clients < 1:
            raise ValueError("max_per_s and penalty_s must be >= 0, max_clients >= 1")
        self.max_per_s = max_per_s
        self.penalty_s = penalty_s
        self.max_clients = max_clients
        self._clients: dict[str, _Client] = {}

    def refused(self, client: str, now: float) -> bool:
        """Count one refusal of ``client``; True when it is penalised from now on."""
        if not self.max_per_s:
            return False
        entry = self._clients.pop(client, None)  # re-inserted last: dict order = recency
        if entry is None or now - entry.window_start >= 1.0:
            until = entry.until if entry is not None else 0.0
            entry = _Client(window_start=now, refusals=0, until=until)
        entry.refusals += 1
        if entry.refusals > self.max_per_s:
            entry.until = now + self.penalty_s
        self._clients[client] = entry
        if len(self._clients) > self.max_clients:
            del self._clients[next(iter(self._clients))]
        return entry.until > now

    def penalised(self, client: str, now: float) -> bool:
        """Is ``client`` serving a penalty (its connection is to be reset at accept)?"""
        entry = self._clients.get(client)
        return entry is not None and entry.until > now

    def __len__(self) -> int:
        return len(self._clients)
