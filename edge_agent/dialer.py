"""The agent's dialer: one tunnel to every gateway replica.

The gateway name is resolved with dnspython (A and AAAA). Every address gets a link that
dials out, handshakes, asks which replica it reached, registers and serves until the
tunnel dies, then reconnects with exponential backoff and full jitter. The name is
re-resolved periodically: new addresses get a link, vanished ones are dropped.

One address may stand for several replicas (a load balancer, an Ingress, a Service VIP
spreading connections at random). Each replica tells its id and the replica count after
the handshake (the REPLICA frame); the dialer is a :class:`ReplicaPool`: a tunnel to a
replica it already holds is closed before it registers (the gateway leaves the held one
alone), and while it holds fewer replicas than announced it keeps one more link dialling,
its retries spaced by ``replica_retry_max_s`` (full jitter) and, after
``replica_search_attempts`` duplicates in a row, by ``max_backoff_s``
(docs/networks.md, "One address for every replica").
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.gateway_link import DialSettings, GatewayLink
from raven.hostport import parse_hostport
from raven.telemetry.logs import fields
from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    import dns.asyncresolver

log = logging.getLogger(__name__)

#: Most links dialling at once for missing replicas behind one address (a few: never a storm).
SEARCHERS = 3


async def resolve_gateway(host: str, resolver: dns.asyncresolver.Resolver | None) -> list[str]:
    """All addresses of ``host`` (an IP literal is itself), sorted; [] when nothing resolves."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    import dns.asyncresolver  # only for names: a gateway given as an address needs no DNS
    import dns.exception

    res = resolver or dns.asyncresolver.Resolver()
    found: set[str] = set()
    for rdtype in ("A", "AAAA"):
        try:
            answer = await res.resolve(host, rdtype, lifetime=5.0)
        except (dns.exception.DNSException, OSError) as exc:
            log.debug("resolve failed host=%s type=%s err=%s", host, rdtype, exc)
            continue
        found.update(r.to_text() for r in answer)
    return sorted(found)


class ReplicaMetrics:
    """The agent's view of the gateway replicas behind its gateway address."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.announced = Gauge(
            "raven_agent_gateway_replicas",
            "Gateway replicas the gateways announce (the most any tunnel up was told).",
            registry=registry,
        )
        self.held = Gauge(
            "raven_agent_gateway_replicas_held",
            "Distinct gateway replicas this agent holds a tunnel to.",
            registry=registry,
        )
        self.dials = Counter(
            "raven_agent_replica_dials_total",
            "Tunnels that reached a replica, by result: new (kept) or duplicate (a replica"
            " already held: closed before registering).",
            ["result"],
            registry=registry,
        )


class Dialer:
    """Holds a tunnel to every gateway replica: a link per address the gateway name
    resolves to, and more links on an address while the replicas announced outnumber
    those held (:class:`ReplicaPool`)."""

    def __init__(
        self,
        gateway: str,
        settings: DialSettings,
        *,
        link_factory: Callable[[str, int], GatewayLink],
        resolve_interval_s: float,
        dns_server: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.host, self.port = parse_hostport(gateway)
        #: False when a proxy or WebSocket lies between (``settings.transport``): the gateway's
        #: name is the one address (TLS checks the name; a forward proxy resolves it, the
        #: site's DNS may not)
        self.resolves = settings.transport is None
        self.settings = settings
        self.link_factory = link_factory
        self.resolve_interval_s = resolve_interval_s
        #: address -> its links (the first dialled when the address appeared)
        self.links: dict[str, list[GatewayLink]] = {}
        #: replica id -> the link holding it
        self.claims: dict[str, GatewayLink] = {}
        self.replica_metrics = ReplicaMetrics(registry or CollectorRegistry())
        self.replica_metrics.held.set_function(lambda: len(self.claims))
        self.replica_metrics.announced.set_function(self.wanted)
        self.resolver: dns.asyncresolver.Resolver | None = None
        if dns_server:
            import dns.asyncresolver

            dhost, dport = parse_hostport(dns_server, default_port=53)
            self.resolver = dns.asyncresolver.Resolver(configure=False)
            self.resolver.nameservers = [dhost]
            self.resolver.port = dport
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.resolved_once = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="dialer")

    def all_links(self) -> list[GatewayLink]:
        return [link for links in self.links.values() for link in links]

    def _new_link(self, addr: str) -> GatewayLink:
        link = self.link_factory(addr, self.port)
        link.pool = self
        self.links.setdefault(addr, []).append(link)
        link.start()
        return link

    # ------------------------------------------------------------ ReplicaPool
    def wanted(self) -> int:
        """Replicas to hold: the largest count a replica we hold announced."""
        return max((link.replicas for link in self.claims.values()), default=0)

    def claim(self, link: GatewayLink) -> bool:
        replica = link.replica_id
        assert replica is not None
        holder = self.claims.get(replica)
        if holder is not None and holder is not link:
            self.replica_metrics.dials.labels("duplicate").inc()
            return False
        self.claims[replica] = link
        link.holds = True
        self.replica_metrics.dials.labels("new").inc()
        log.info(
            "gateway replica held",
            extra=fields(gateway=link.label, replica=replica, held=len(self.claims),
                         replicas=self.wanted()),
        )  # fmt: skip
        self._search()
        return True

    def release(self, link: GatewayLink) -> None:
        for replica, holder in list(self.claims.items()):
            if holder is link:
                del self.claims[replica]
        self._search()

    def surplus(self, link: GatewayLink) -> bool:
        links = self.links.get(link.address, [])
        if len(self.claims) < self.wanted() or len(links) < 2 or link not in links:
            return False
        links.remove(link)
        log.info("spare gateway link stopped", extra=fields(gateway=link.label,
                                                             held=len(self.claims)))  # fmt: skip
        return True

    def counted(self, link: GatewayLink) -> None:
        self._search()

    def _search(self) -> None:
        """While fewer replicas are held than announced, keep links dialling: one per
        missing replica, at most SEARCHERS at a time (links already dialling or backing off
        count), on the address of a link that reached a replica (one address that spreads
        connections over several replicas)."""
        missing = self.wanted() - len(self.claims)
        if self._stopping or missing <= 0:
            return
        searching = sum(1 for link in self.all_links() if not link.holds)
        shared = [addr for addr in self.links if any(lk.holds for lk in self.links[addr])]
        for _ in range(min(missing, SEARCHERS) - searching):
            if shared:
                self._new_link(shared[0])

    # ------------------------------------------------------------ addresses
    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.resolve_interval_s)

    async def refresh(self) -> None:
        if self.resolves:
            addresses = await resolve_gateway(self.host, self.resolver)
        else:
            addresses = [self.host]
        if not addresses:
            log.warning(
                "gateway name resolves to nothing host=%s (keeping existing links)", self.host
            )
            return
        for addr in addresses:
            if addr not in self.links:
                link = self._new_link(addr)
                log.info("gateway address added addr=%s", link.label)
        for addr in list(self.links):
            if addr not in addresses:
                links = self.links.pop(addr)
                log.info("gateway address gone addr=%s links=%d", addr, len(links))
                await asyncio.gather(*(link.stop(graceful=True) for link in links))
        self.resolved_once.set()

    def reregister(self) -> None:
        for link in self.all_links():
            link.reregister()

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        links = self.all_links()
        self.links.clear()
        await asyncio.gather(*(link.stop(graceful=True) for link in links), return_exceptions=True)
