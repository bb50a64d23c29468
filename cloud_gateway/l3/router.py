"""The gateway's L3 router: TUN device <-> agents' tunnels, with cryptokey routing.

- Out (TUN -> agent): longest-prefix match of the destination over the prefixes of the
  attached agents' accepted registrations; the newest port carrying a prefix wins. No
  route: dropped, counted, ICMP "unreachable" back into the TUN (rate limited). MTU,
  fragments, ICMP "too big" and MSS clamping: the shared `raven.transport.tun_path`.
  ``send`` returning False (the tunnel's bounded datagram queue was full) is a counted
  drop: L3 never blocks the tunnel.
- In (agent -> TUN): the inner source must lie inside the prefixes that agent is
  authorised for *and* registered (cryptokey routing, as in WireGuard), else dropped
  and counted. Writes to the TUN never block either.

Kernel routes for accepted prefixes are installed into the TUN device when a
:class:`~raven.transport.netconfig.NetConfig` is given, and removed when the last port
carrying a prefix goes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from raven.l3 import (
    DropReason,
    IPNetwork,
    PacketInfo,
    PrefixTable,
    build_unreachable,
)
from raven.l3.metrics import FROM_AGENT, TO_AGENT, L3Metrics
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.netconfig import NetConfig
from raven.transport.tun import TunDevice
from raven.transport.tun_path import TunPath

log = logging.getLogger(__name__)

SendDatagram = Callable[[bytes], bool]
IPV4_OR_6 = (ipaddress.IPv4Network, ipaddress.IPv6Network)


class AgentPort:
    """One agent tunnel attached to the router. Created by :meth:`L3Router.attach_agent`."""

    def __init__(
        self,
        router: L3Router,
        agent: str,
        authorised: Sequence[IPNetwork | str],
        send: SendDatagram,
    ) -> None:
        self.agent = agent
        self._router = router
        self._send = send
        self._authorised: PrefixTable[bool] = PrefixTable()
        for prefix in parse_prefixes(authorised):
            self._authorised.set(prefix, True)
        #: The prefixes accepted from this agent (cryptokey table and routes).
        self._accepted: PrefixTable[bool] = PrefixTable()
        self._routes: frozenset[IPNetwork] = frozenset()
        self._attached = True
        self._tx = router.metrics.traffic(TO_AGENT, agent)
        self._rx = router.metrics.traffic(FROM_AGENT, agent)

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def routes(self) -> frozenset[IPNetwork]:
        """The prefixes routed to this agent (those last set and authorised)."""
        return self._routes

    def set_routes(self, prefixes: Iterable[IPNetwork | str]) -> frozenset[IPNetwork]:
        """Route ``prefixes`` (the registration the gateway accepted) to this agent.

        Prefixes outside the agent's authorised ones are refused (logged, not routed).
        Replaces the previous set; returns the prefixes now routed. Strings are parsed
        (``10.20.0.0/16``; host bits must be zero).
        """
        if not self._attached:
            raise RuntimeError(f"port of agent {self.agent} is detached")
        wanted: set[IPNetwork] = set()
        for prefix in parse_prefixes(prefixes):
            if self._authorised.covers(prefix):
                wanted.add(prefix)
            else:
                log.warning(
                    "l3 prefix refused agent=%s prefix=%s (not authorised)", self.agent, prefix
                )
        new = frozenset(wanted)
        for prefix in self._routes - new:
            self._accepted.remove(prefix)
            self._router._withdraw(prefix, self)
        for prefix in new - self._routes:
            self._accepted.set(prefix, True)
            self._router._announce(prefix, self)
        self._routes = new
        return new

    def packet_from_agent(self, packet: bytes) -> None:
        """A packet the agent sent through the tunnel: check its source, write it to TUN."""
        path = self._router.path
        info = path.parse(packet)
        if info is None:
            return
        if self._accepted.lookup(info.version, info.src) is None:
            path.metrics.drop(DropReason.SPOOFED_SOURCE)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("l3 spoofed source agent=%s src=%s", self.agent, info.src_address)
            return
        if path.write_tun(packet, info):
            self._rx.count(len(packet))

    def send(self, packet: bytes) -> bool:
        """Put one packet on this agent's tunnel, counting it or the drop."""
        if self._send(packet):
            self._tx.count(len(packet))
            return True
        self._router.metrics.drop(DropReason.TUNNEL_QUEUE_FULL)
        return False

    def detach(self) -> None:
        """The tunnel went away: withdraw its routes. Idempotent."""
        if not self._attached:
            return
        self.set_routes(())
        self._attached = False
        self._router._ports.discard(self)


class L3Router:
    """Routes packets between the gateway's TUN device and the attached agents."""

    def __init__(
        self,
        tun: TunDevice,
        registry: CollectorRegistry,
        netconfig: NetConfig | None,
        mtu: int,
        *,
        send_unreachable: bool = True,
        icmp_rate_per_s: float = 100.0,
        icmp_burst: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tun = tun
        self.mtu = mtu
        self.metrics = L3Metrics(registry)
        self.path = TunPath(tun, self.metrics, mtu, icmp_rate_per_s=icmp_rate_per_s,
                            icmp_burst=icmp_burst, clock=clock)  # fmt: skip
        self._netconfig = netconfig
        self._routes: PrefixTable[list[AgentPort]] = PrefixTable()
        self._ports: set[AgentPort] = set()
        self._send_unreachable = send_unreachable
        self._running = False

    # -- agents ------------------------------------------------------------------

    def attach_agent(
        self, agent: str, authorised: Sequence[IPNetwork | str], send: SendDatagram
    ) -> AgentPort:
        """Attach one agent tunnel; routes come with :meth:`AgentPort.set_routes`."""
        port = AgentPort(self, agent, authorised, send)
        self._ports.add(port)
        return port

    @property
    def ports(self) -> frozenset[AgentPort]:
        return frozenset(self._ports)

    def routes(self) -> dict[IPNetwork, list[str]]:
        """Every routed prefix and the agents carrying it (the one used last)."""
        return {prefix: [p.agent for p in ports] for prefix, ports in self._routes.items()}

    def _announce(self, prefix: IPNetwork, port: AgentPort) -> None:
        ports = self._routes.get(prefix)
        if ports is None:
            self._routes.set(prefix, [port])
            self._kernel_route(prefix, present=True)
        else:
            ports.append(port)

    def _withdraw(self, prefix: IPNetwork, port: AgentPort) -> None:
        ports = self._routes.get(prefix)
        if ports is None or port not in ports:
            return
        ports.remove(port)
        if not ports:
            self._routes.remove(prefix)
            self._kernel_route(prefix, present=False)

    def _kernel_route(self, prefix: IPNetwork, present: bool) -> None:
        if self._netconfig is not None:
            self._netconfig.schedule_route(self.tun.name, prefix, present)

    # -- the TUN side ------------------------------------------------------------

    async def start(self) -> None:
        """Start reading the TUN device."""
        self.tun.start(self._from_tun)
        self._running = True

    async def stop(self) -> None:
        """Stop reading the TUN device and wait for pending route changes."""
        self.tun.stop()
        self._running = False
        if self._netconfig is not None:
            await self._netconfig.settle()

    def write_tun(self, packet: bytes, info: PacketInfo | None = None) -> bool:
        """Write to the TUN (super-packets segmented if it has no offload); drops counted."""
        return self.path.write_tun(packet, info)

    def _from_tun(self, packet: bytes) -> None:
        info = self.path.parse(packet)
        if info is None:
            return
        ports = self._routes.lookup(info.version, info.dst)
        if not ports:
            self.metrics.drop(DropReason.NO_ROUTE)
            if self._send_unreachable:
                self.path.icmp(build_unreachable(packet, info))
            return
        self.path.to_tunnel(packet, info, ports[-1].send)


def parse_prefixes(values: Iterable[IPNetwork | str]) -> list[IPNetwork]:
    """Networks, or strings parsed strictly (host bits must be zero; ValueError if not)."""
    return [v if isinstance(v, IPV4_OR_6) else ipaddress.ip_network(v, strict=True) for v in values]
