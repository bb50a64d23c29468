"""Who scrapes what through this gateway: the scrapers backfill is written for.

Every request the proxy relays while backfill is on is noted here (the client's address) and
tells the agent its scraper (``X-Raven-Scraper``), so the agent learns and
fills each Prometheus replica's scrapes on their own. Backfilled scrapes come back named by
that address; this book says where they may go:

- with one receiver per scraper, only to an address that really scraped through this gateway
  (an agent cannot point the gateway's writes anywhere else), and a scraper not seen for
  ``ttl_s`` is gone (a replaced Prometheus pod comes back with another address);
- with one shared receiver, the samples of one scraper per target are written (the
  *primary*: the lowest address of those whose scrapes of it agents backfilled within the
  TTL: a one-off client, a curl, is never learned by an agent and never primary), so an HA
  pair's two copies do not land twice in the same series.

Bounded: at most ``max_entries`` scrapers seen and ``max_entries`` (scraper, node, port)
entries backfilled; the least recently touched go.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from raven.backfill.wire import scraper_name

__all__ = ["ScraperBook", "address_order"]

#: A scraper not seen for this long is gone (Prometheus scrapes every few seconds to minutes).
DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_ENTRIES = 4096


class ScraperBook:
    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.started = clock()
        #: address -> when it last scraped through this gateway
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._backfilled: OrderedDict[tuple[str, str, int], float] = OrderedDict()

    def note(self, scraper: str, mode: str) -> str:
        """``scraper`` (an address) requested a target now, addressing it in ``mode``; the
        header value that names it to the agent (:func:`raven.backfill.wire.scraper_name`:
        two jobs of one Prometheus in two modes are two scrapers)."""
        _touch(self._seen, scraper, self.clock(), self.max_entries)
        return scraper_name(scraper, mode)

    def note_backfill(self, scraper: str, node: str, port: int) -> None:
        """An agent backfilled ``scraper``'s scrapes of ``node:port`` (it learned them)."""
        _touch(self._backfilled, (scraper, node, port), self.clock(), self.max_entries)

    def known(self, scraper: str) -> bool:
        """Did ``scraper`` scrape anything through this gateway within the TTL?"""
        at = self._seen.get(scraper)
        return at is not None and self.clock() - at <= self.ttl_s

    def settled(self) -> bool:
        """True once this gateway has run for a TTL: a scraper unknown now is gone, not yet
        to come back (right after a restart every scraper is unknown for a moment)."""
        return self.clock() - self.started > self.ttl_s

    def primary(self, node: str, port: int) -> str | None:
        """The one scraper of ``node:port`` whose samples a shared receiver gets."""
        now = self.clock()
        scrapers = [k[0] for k, at in self._backfilled.items()
                    if k[1] == node and k[2] == port and now - at <= self.ttl_s]  # fmt: skip
        return min(scrapers, key=address_order) if scrapers else None


_K = TypeVar("_K")


def _touch(entries: OrderedDict[_K, float], key: _K, now: float, bound: int) -> None:
    entries[key] = now
    entries.move_to_end(key)
    while len(entries) > bound:
        entries.popitem(last=False)


def address_order(address: str) -> tuple[int, str]:
    """Which of two scrapers is the primary: the shorter address, then the lower."""
    return (len(address), address)
