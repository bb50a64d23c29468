"""Who scrapes what through this gateway: the scrapers backfill is written for.

Every request the proxy relays while backfill is on is noted here (the client's address, the
node and port) and tells the agent its scraper (``X-Raven-Scraper``), so the agent learns and
fills each Prometheus replica's scrapes on their own. Backfilled scrapes come back named by
that address; this book says where they may go:

- with one receiver per scraper, only to an address that really scraped through this gateway
  (an agent cannot point the gateway's writes anywhere else), and a scraper not seen for
  ``ttl_s`` is gone (a replaced Prometheus pod comes back with another address);
- with one shared receiver, the samples of one scraper per target are written (the
  *primary*: the lowest address of those scraping it now), so an HA pair's two copies do
  not land twice in the same series.

Bounded: at most ``max_entries`` (scraper, node, port) entries, the least recently seen go.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

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
        self._seen: OrderedDict[tuple[str, str, int], float] = OrderedDict()

    def note(self, scraper: str, node: str, port: int, mode: str) -> str:
        """``scraper`` (an address) requested ``node:port`` now, addressing it in ``mode``;
        the header value that names it to the agent: ``<address>/<mode>`` (two jobs of one
        Prometheus in two modes are two scrapers)."""
        key = (scraper, node, port)
        self._seen[key] = self.clock()
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
        return f"{scraper}/{mode}"

    def _live(self, now: float) -> list[tuple[str, str, int]]:
        return [k for k, at in self._seen.items() if now - at <= self.ttl_s]

    def known(self, scraper: str) -> bool:
        """Did ``scraper`` scrape anything through this gateway within the TTL?"""
        now = self.clock()
        return any(k[0] == scraper for k in self._live(now))

    def settled(self) -> bool:
        """True once this gateway has run for a TTL: a scraper unknown now is gone, not yet
        to come back (right after a restart every scraper is unknown for a moment)."""
        return self.clock() - self.started > self.ttl_s

    def primary(self, node: str, port: int) -> str | None:
        """The one scraper of ``node:port`` whose samples a shared receiver gets."""
        now = self.clock()
        scrapers = [k[0] for k in self._live(now) if k[1] == node and k[2] == port]
        return min(scrapers, key=address_order) if scrapers else None


def address_order(address: str) -> tuple[int, str]:
    """Which of two scrapers is the primary: the shorter address, then the lower."""
    return (len(address), address)
