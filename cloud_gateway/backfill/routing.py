"""Which receiver each backfilled scrape goes to (pure, given the scraper book).

``shared``: one receiver (``remote_write_url``) for every scraper. Of a target scraped by an
HA pair the agent fills both replicas' scrapes; one copy is written, the primary scraper's
(:meth:`ScraperBook.primary`: the lowest address whose scrapes of that target were
backfilled within the book's TTL, this batch's included), the other's samples are dropped
(``other_replica``): the same series at two phases would double it in a shared store.

``per_scraper``: ``remote_write_url`` is a template with ``{scraper}`` (the Prometheus
replica's address: ``http://{scraper}:9090/api/v1/write``), each replica gets its own
scrapes. Only an address that scraped through this gateway is written to; a scrape with no
scraper (an older agent, a configured target) is dropped (``no_scraper``); one whose scraper is
not known yet waits (retry), unless the gateway has run long enough to know it is gone
(``scraper_gone``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from cloud_gateway.backfill.scrapers import ScraperBook
from raven.backfill.wire import Scrape, scraper_address

__all__ = ["PER_SCRAPER", "SHARED", "Routes", "receiver_url", "route"]

SHARED, PER_SCRAPER = "shared", "per_scraper"


@dataclass
class Routes:
    """Scrapes by receiver URL; samples dropped by reason; ``wait``: a scraper not known
    yet, the batch is to be sent again later."""

    by_url: dict[str, list[Scrape]] = field(default_factory=lambda: defaultdict(list))
    dropped: dict[str, int] = field(default_factory=dict)
    wait: str = ""

    def drop(self, reason: str, samples: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + samples


def receiver_url(template: str, scraper: str) -> str:
    """The per-scraper receiver: ``{scraper}`` as a URL host (an IPv6 address bracketed)."""
    return template.replace("{scraper}", f"[{scraper}]" if ":" in scraper else scraper)


def route(scrapes: Sequence[Scrape], mode: str, url: str, book: ScraperBook) -> Routes:
    out = Routes()
    if mode == PER_SCRAPER:
        for s in scrapes:
            address = scraper_address(s.scraper)
            if not address:
                out.drop("no_scraper", len(s.samples))
            elif book.known(address):
                out.by_url[receiver_url(url, address)].append(s)
            elif book.settled():
                out.drop("scraper_gone", len(s.samples))
            else:
                out.wait = address
        return out
    for s in scrapes:  # every scraper this batch fills is a candidate primary
        if address := scraper_address(s.scraper):
            book.note_backfill(address, s.node, s.port)
    for s in scrapes:
        address = scraper_address(s.scraper)
        if address and address != book.primary(s.node, s.port):
            out.drop("other_replica", len(s.samples))
        else:  # the primary's scrapes, in every mode and path it scrapes (its jobs)
            out.by_url[url].append(s)
    return out
