"""Recent handshake refusals, per peer address and reason, in words: what the status page and
`raven status` show when a site is down because the gateway refuses its agent.

Each refusal is counted under (address, reason) with its first and last time; the site it
probably belongs to is the one whose last authenticated tunnel came from that address (an
agent behind NAT keeps its address; one never seen is shown unmatched). Bounded: the least
recently refused entries go beyond ``max_entries``, and one address's entries are at most
the reasons there are.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cloud_gateway.registry import iso_utc

__all__ = ["REASON_WORDS", "Refusals"]

#: Every reason code the gateway logs for a refused handshake, in words (and the fix), each
#: with its line in docs/troubleshooting.md ("Handshake failures").
REASON_WORDS: dict[str, str] = {
    "bad_mac1": "wrong gateway public key in the agent's config (gateway_public_key)",
    "unknown_key": "the agent's key is not authorised here (add it to agents[])",
    "replay": "a replayed handshake (a copy of an earlier one, or the agent's clock went back)",
    "rate_limited": "rate limited: too many handshakes from this address",
    "cookie_required": "the gateway is under load and asked for a cookie (retried by itself)",
    "bad_cookie_reply": "an invalid cookie reply",
    "decrypt_failed": "the handshake did not decrypt (a different key pair or psk_file)",
    "unsupported_version": "the agent speaks another protocol version (upgrade one side)",
    "unsupported_suite": "no cipher suite in common (the agent's suites vs the gateway's)",
    "malformed": "not a Raven handshake (something else connected to the tunnel port)",
    "handshake_timeout": "the handshake did not finish in time",
    "unconfirmed": "the agent never confirmed the session keys",
    "bad_record": "a record that failed authentication",
}
DEFAULT_MAX_ENTRIES = 256
#: Sites remembered by the address of their last authenticated tunnel.
MAX_ADDRESSES = 4096


@dataclass
class _Entry:
    count: int
    first: float
    last: float


class Refusals:
    def __init__(
        self, *, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.time
    ) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._site_at: OrderedDict[str, str] = OrderedDict()

    def refused(self, address: str, reason: str) -> None:
        now = self.clock()
        key = (address, reason)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(0, now, now)
        entry.count += 1
        entry.last = now
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def authenticated(self, address: str, site: str) -> None:
        """``site``'s agent has a tunnel from ``address`` (refusals there are probably its)."""
        self._site_at[address] = site
        self._site_at.move_to_end(address)
        while len(self._site_at) > MAX_ADDRESSES:
            self._site_at.popitem(last=False)

    def to_json(self) -> list[dict[str, Any]]:
        """Newest first: address, reason (code and words), count, first and last time, and
        the site the address last had a tunnel for (None: unmatched)."""
        rows = []
        for (address, reason), e in reversed(self._entries.items()):
            rows.append({
                "peer": address, "reason": reason,
                "words": REASON_WORDS.get(reason, reason), "count": e.count,
                "first_at": iso_utc(e.first), "last_at": iso_utc(e.last),
                "site": self._site_at.get(address),
            })  # fmt: skip
        return rows
