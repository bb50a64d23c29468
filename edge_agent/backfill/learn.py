"""What Prometheus scrapes through this agent, and when the agent must scrape it itself.

Sans-IO: the relay feeds the request bytes of each stream to a :class:`RequestSniffer`; the
:class:`TargetTable` records per target (node, port, path, and the scraper: which Prometheus
made the request, as the gateway names it in ``X-Raven-Scraper``, so that each replica of an
HA pair, or each of two servers, is learned and backfilled on its own) the headers that matter, the
interval (median of the last arrival gaps), the last arrival, and decides, given ``now`` and
whether a tunnel is up, which targets are due for a local scrape:

* a target enters *local* mode when its next scrape is overdue: at once when no tunnel is up
  (the keepalive said so), half an interval late otherwise (a dead link that the keepalive
  has not noticed yet, a Prometheus restart);
* in local mode it is scraped on Prometheus's own phase (last arrival + k intervals);
* the first arrival from Prometheus ends local mode, and local scrapes from half an interval
  before it on are deleted (Prometheus has that scrape itself: a sample 1 ms away from a
  scraped one would be stored as an extra sample).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from raven.backfill.wire import MAX_SCRAPER_CHARS

#: Request heads larger than this are not looked at (Prometheus sends ~300 bytes).
MAX_SNIFF_BYTES = 8192
#: Arrival gaps kept per target for the interval estimate.
ARRIVALS_KEPT = 9
#: Gaps outside this range are not scrape intervals (two jobs, a manual curl, a pause).
MIN_INTERVAL_S = 0.2
MAX_INTERVAL_S = 3600.0
TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"
#: Set by the gateway on every request it relays while backfill is on: the scraping client's
#: address (a client's own header of that name is dropped by the gateway).
SCRAPER_HEADER = "x-raven-scraper"
_SCRAPER_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEF.:[]/")

TargetKey = tuple[str, int, str, str]  # node, port, path (with query), scraper


@dataclass(frozen=True)
class RequestSeen:
    node: str
    port: int
    path: str
    accept: str
    timeout_s: float | None
    scraper: str = ""


def valid_scraper(value: str) -> bool:
    """``<address>/<mode>`` as the gateway writes it (IPv4, IPv6; dns, forward, path):
    anything else is not trusted."""
    return len(value) <= MAX_SCRAPER_CHARS and set(value) <= _SCRAPER_CHARS


def parse_request_head(node: str, port: int, head: bytes) -> RequestSeen | None:
    """A scrape-like GET from a request head, or None (other methods, garbage)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
        return None
    target = parts[1]
    if target.startswith(("http://", "https://")):  # absolute-form: keep the path
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    if not target.startswith("/") or len(target) > 2048:
        return None
    accept = scraper = ""
    timeout: float | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            continue
        key = name.strip().lower()
        if key == "accept":
            accept = value.strip()[:1024]
        elif key == TIMEOUT_HEADER:
            try:
                timeout = float(value.strip())
            except ValueError:
                timeout = None
            if timeout is not None and not 0 < timeout <= MAX_INTERVAL_S:
                timeout = None
        elif key == SCRAPER_HEADER:
            scraper = value.strip()
            if not valid_scraper(scraper):
                return None  # the gateway writes it: garbage here is not a scrape it relayed
    return RequestSeen(node, port, target, accept, timeout, scraper)


class RequestSniffer:
    """Watches the request heads of one relayed stream (bounded): a kept stream carries one
    client connection's successive scrapes, each head is looked at. Bytes between heads (a
    request body, rare for scrapes) are skipped up to the next blank line; a head longer than
    `MAX_SNIFF_BYTES` ends the watch."""

    def __init__(self, node: str, port: int, on_request: Callable[[RequestSeen], None]) -> None:
        self.node = node
        self.port = port
        self.on_request = on_request
        self._buf = b""

    def feed(self, data: bytes) -> bool:
        """Look at bytes going to the target; True when done (no more bytes needed)."""
        buf = self._buf + data if self._buf else data
        while (end := buf.find(b"\r\n\r\n", 0, MAX_SNIFF_BYTES + 4)) >= 0:
            seen = parse_request_head(self.node, self.port, buf[:end])
            if seen is not None:
                self.on_request(seen)
            buf = buf[end + 4 :]
        if len(buf) >= MAX_SNIFF_BYTES + 4:
            self._buf = b""
            return True
        self._buf = bytes(buf)
        return False


@dataclass
class Target:
    """One learned (or configured) scrape target."""

    node: str
    port: int
    path: str
    accept: str = ""
    timeout_s: float | None = None
    interval_s: float | None = None
    #: wall-clock time of the last scrape Prometheus made through us (0: never)
    last_seen: float = 0.0
    explicit: bool = False
    local: bool = False
    next_slot: float = 0.0
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))
    #: who scrapes it ("" before the gateway named scrapers, and for configured targets)
    scraper: str = ""

    @property
    def key(self) -> TargetKey:
        return (self.node, self.port, self.path, self.scraper)

    def scrape_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return min(10.0, self.interval_s or 10.0)

    def learn_interval(self) -> None:
        gaps = [
            b - a
            for a, b in zip(self.arrivals, list(self.arrivals)[1:], strict=False)
            if MIN_INTERVAL_S <= b - a <= MAX_INTERVAL_S
        ]
        if gaps:
            self.interval_s = statistics.median(gaps)


@dataclass(frozen=True)
class Served:
    """What :meth:`TargetTable.observe` learned: ``delete_local_from`` (wall s) is set when
    local mode ended: local scrapes at or after it duplicate Prometheus's own."""

    target: Target
    new: bool
    delete_local_from: float | None


class TargetTable:
    """Learned and explicit targets, bounded; decides local scrapes. Times are wall seconds."""

    def __init__(self, *, max_targets: int, forget_after_s: float, keep_while_down_s: float):
        self.max_targets = max_targets
        self.forget_after_s = forget_after_s
        self.keep_while_down_s = keep_while_down_s
        self.targets: dict[TargetKey, Target] = {}
        self.refused = 0  # scrapes of targets not learned because the table was full
        #: keys forgotten since the caller last emptied this (to forget them on disk too)
        self.forgotten: list[TargetKey] = []

    def add_explicit(self, target: Target) -> None:
        """A configured target: overrides what was learned for the same key, or adds it."""
        target.explicit = True
        old = self.targets.get(target.key)
        if old is not None:
            target.last_seen = old.last_seen
            target.arrivals = old.arrivals
            target.accept = target.accept or old.accept
        self.targets[target.key] = target

    def restore(self, targets: Iterable[Target], now: float) -> None:
        """Targets persisted by an earlier run (explicit ones from the config win); those
        never learned (no interval) or idle longer than they would be kept are not."""
        for t in targets:
            if t.interval_s is None or now - t.last_seen > self.keep_while_down_s:
                continue
            if t.key not in self.targets and len(self.targets) < self.max_targets:
                self.targets[t.key] = t

    def observe(self, seen: RequestSeen, now: float) -> Served | None:
        """Prometheus scraped ``seen`` at ``now``."""
        key = (seen.node, seen.port, seen.path, seen.scraper)
        t = self.targets.get(key)
        if t is None and seen.scraper:  # a configured target, now scraped by a named scraper
            explicit = self.targets.get((seen.node, seen.port, seen.path, ""))
            t = explicit if explicit is not None and explicit.explicit else None
        new = t is None
        if t is None:
            if len(self.targets) >= self.max_targets:
                self.refused += 1
                return None
            t = Target(seen.node, seen.port, seen.path, scraper=seen.scraper)
            self.targets[key] = t
        if seen.accept:
            t.accept = seen.accept
        if seen.timeout_s is not None and not t.explicit:
            t.timeout_s = seen.timeout_s
        t.arrivals.append(now)
        if not t.explicit or t.interval_s is None:
            t.learn_interval()
        t.last_seen = now
        delete_from = None
        if t.local:
            t.local = False
            delete_from = now - (t.interval_s or 0.0) / 2
        return Served(t, new, delete_from)

    def due(self, now: float, tunnel_up: bool) -> list[Target]:
        """Targets to scrape locally now (their slot is advanced)."""
        out: list[Target] = []
        for key, t in list(self.targets.items()):
            if t.interval_s is None:
                continue
            if self._expired(t, now, tunnel_up):
                if not t.explicit:
                    del self.targets[key]
                    self.forgotten.append(key)
                else:
                    t.local = False
                continue
            if t.last_seen == 0.0 and tunnel_up:
                t.local = False  # never scraped by Prometheus: nothing to fill while it can
                continue
            if not t.local:
                anchor = t.last_seen or now - t.interval_s  # never seen: start now
                grace = 0.0 if not tunnel_up else t.interval_s / 2
                if now < anchor + t.interval_s + grace:
                    continue
                t.local = True
                t.next_slot = anchor + t.interval_s
            elif now < t.next_slot:
                continue
            out.append(t)
            while t.next_slot <= now:
                t.next_slot += t.interval_s
        return out

    def _expired(self, t: Target, now: float, tunnel_up: bool) -> bool:
        if t.last_seen == 0.0:
            return False
        idle = now - t.last_seen
        return idle > (self.forget_after_s if tunnel_up else self.keep_while_down_s)

    @property
    def local_count(self) -> int:
        return sum(1 for t in self.targets.values() if t.local)
