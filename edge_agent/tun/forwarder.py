"""The agent's L3 forwarder: this site's TUN device <-> the tunnels to gateway replicas.

- Out (TUN -> gateway): a packet whose source is outside this site's subnets is dropped
  (the gateway would refuse it as spoofed); MTU, fragments, ICMP "too big" and MSS
  clamping are the shared `raven.transport.tun_path`; then the packet goes through the
  first live path (one per gateway replica).
  A path whose ``send`` keeps returning False (its bounded queue stays full) is moved
  to the back after ``failover_after`` failures in a row; a removed path is gone.
  Every refused packet is a counted drop: L3 never blocks a tunnel.
- In (gateway -> TUN): only packets addressed inside this site's subnets are written;
  the agent never routes anything anywhere else.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Sequence

from raven.l3 import DropReason, IPNetwork, PrefixTable
from raven.l3.metrics import FROM_AGENT, TO_AGENT, L3Metrics
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.tun import TunDevice
from raven.transport.tun_path import TunPath

log = logging.getLogger(__name__)

SendDatagram = Callable[[bytes], bool]
#: Consecutive refused sends after which the next path is tried.
DEFAULT_FAILOVER_AFTER = 32


class PathHandle:
    """One tunnel to one gateway replica. Created by :meth:`TunForwarder.add_path`."""

    def __init__(self, forwarder: TunForwarder, send: SendDatagram) -> None:
        self._forwarder = forwarder
        self.send = send
        #: Refused sends in a row.
        self.failures = 0
        self.removed = False

    def packet_from_gateway(self, packet: bytes) -> None:
        """A packet that arrived through this tunnel."""
        self._forwarder.packet_from_gateway(packet)

    def remove(self) -> None:
        """The tunnel went away; packets go through the other paths. Idempotent."""
        if not self.removed:
            self.removed = True
            self._forwarder._remove(self)


class TunForwarder:
    """Forwards packets between the agent's TUN device and its gateway paths."""

    def __init__(
        self,
        tun: TunDevice,
        registry: CollectorRegistry,
        subnets: Sequence[IPNetwork | str],
        mtu: int,
        *,
        agent: str = "local",
        failover_after: int = DEFAULT_FAILOVER_AFTER,
        icmp_rate_per_s: float = 100.0,
        icmp_burst: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failover_after <= 0:
            raise ValueError("failover_after must be positive")
        self.tun = tun
        self.mtu = mtu
        self.metrics = L3Metrics(registry)
        self.path = TunPath(tun, self.metrics, mtu, icmp_rate_per_s=icmp_rate_per_s,
                            icmp_burst=icmp_burst, clock=clock)  # fmt: skip
        self._subnets: PrefixTable[bool] = PrefixTable()
        for subnet in subnets:
            net = subnet if not isinstance(subnet, str) else ipaddress.ip_network(subnet)
            self._subnets.set(net, True)
        self._paths: list[PathHandle] = []
        self._failover_after = failover_after
        self._tx = self.metrics.traffic(FROM_AGENT, agent)
        self._rx = self.metrics.traffic(TO_AGENT, agent)

    @property
    def paths(self) -> tuple[PathHandle, ...]:
        """Live paths, the one in use first."""
        return tuple(self._paths)

    def add_path(self, send: SendDatagram) -> PathHandle:
        """A tunnel to a gateway replica came up; it is used after the existing ones."""
        path = PathHandle(self, send)
        self._paths.append(path)
        return path

    def _remove(self, path: PathHandle) -> None:
        if path in self._paths:
            self._paths.remove(path)

    async def start(self) -> None:
        """Start reading the TUN device."""
        self.tun.start(self._from_tun)

    async def stop(self) -> None:
        """Stop reading the TUN device."""
        self.tun.stop()

    # -- gateway -> TUN ------------------------------------------------------------

    def packet_from_gateway(self, packet: bytes) -> None:
        """A packet from any gateway replica: written to TUN if addressed to this site."""
        info = self.path.parse(packet)
        if info is None:
            return
        if self._subnets.lookup(info.version, info.dst) is None:
            self.metrics.drop(DropReason.NOT_LOCAL_DESTINATION)
            return
        if self.path.write_tun(packet, info):
            self._rx.count(len(packet))

    # -- TUN -> gateway ------------------------------------------------------------

    def _from_tun(self, packet: bytes) -> None:
        info = self.path.parse(packet)
        if info is None:
            return
        if self._subnets.lookup(info.version, info.src) is None:
            self.metrics.drop(DropReason.SOURCE_NOT_LOCAL)
            return
        self.path.to_tunnel(packet, info, self._send)

    def _send(self, packet: bytes) -> None:
        paths = self._paths
        if not paths:
            self.metrics.drop(DropReason.NO_PATH)
            return
        path = paths[0]
        if path.send(packet):
            path.failures = 0
            self._tx.count(len(packet))
            return
        self.metrics.drop(DropReason.TUNNEL_QUEUE_FULL)
        path.failures += 1
        if path.failures >= self._failover_after and len(paths) > 1:
            path.failures = 0
            paths.append(paths.pop(0))
            log.warning("l3 path congested, failing over paths=%d", len(paths))
