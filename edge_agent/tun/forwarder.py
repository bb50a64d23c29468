"""The agent's L3 forwarder: this site's TUN device <-> the tunnels to gateway replicas.

- Out (TUN -> gateway): a packet whose source is outside this site's subnets is dropped
  (the gateway would refuse it as spoofed); over the MTU, IPv4 without DF is fragmented
  and anything else answered with ICMP "too big" into the TUN; SYNs get their MSS
  clamped; then the packet goes through the first live path (one per gateway replica).
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

from prometheus_client import CollectorRegistry

from raven.l3 import (
    DropReason,
    IcmpRateLimiter,
    IPNetwork,
    MalformedPacket,
    PacketInfo,
    PrefixTable,
    clamp_mss,
    fit_mtu,
    is_tcp_syn,
    mss_for_mtu,
    parse_packet,
)
from raven.l3.gso import MAX_SUPER_PACKET_BYTES, is_gso_candidate, split_super_packet
from raven.l3.metrics import FROM_AGENT, TO_AGENT, L3Metrics
from raven.transport.tun import TunDevice, write_packet

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
        if mtu < 576:
            raise ValueError("mtu must be at least 576")
        if failover_after <= 0:
            raise ValueError("failover_after must be positive")
        self.tun = tun
        self.mtu = mtu
        self.metrics = L3Metrics(registry)
        self._subnets: PrefixTable[bool] = PrefixTable()
        for subnet in subnets:
            net = subnet if not isinstance(subnet, str) else ipaddress.ip_network(subnet)
            self._subnets.set(net, True)
        self._paths: list[PathHandle] = []
        self._failover_after = failover_after
        self._icmp_limit = IcmpRateLimiter(icmp_rate_per_s, icmp_burst)
        self._clock = clock
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
        try:
            info = parse_packet(packet)
        except MalformedPacket:
            self.metrics.drop(DropReason.MALFORMED)
            return
        if self._subnets.lookup(info.version, info.dst) is None:
            self.metrics.drop(DropReason.NOT_LOCAL_DESTINATION)
            return
        if is_tcp_syn(packet, info):
            packet = clamp_mss(packet, info, mss_for_mtu(info.version, self.mtu))
        if write_packet(self.tun, packet, info, self.mtu):
            self._rx.count(len(packet))
        else:
            self.metrics.drop(DropReason.TUN_WRITE_FAILED)

    # -- TUN -> gateway ------------------------------------------------------------

    def _from_tun(self, packet: bytes) -> None:
        try:
            info = parse_packet(packet)
        except MalformedPacket:
            self.metrics.drop(DropReason.MALFORMED)
            return
        if self._subnets.lookup(info.version, info.src) is None:
            self.metrics.drop(DropReason.SOURCE_NOT_LOCAL)
            return
        if info.length > self.mtu and self.tun.offload and is_gso_candidate(info):
            self._send_super_packet(packet, info)
            return
        if info.length > self.mtu:
            verdict = fit_mtu(packet, info, self.mtu)
            if not verdict.packets:
                self.metrics.drop(DropReason.TOO_BIG)
                reply = verdict.reply
                allowed = reply is not None and self._icmp_limit.allow(self._clock())
                if allowed and reply is not None and not self.tun.write(reply):
                    self.metrics.drop(DropReason.TUN_WRITE_FAILED)
                return
            for fragment in verdict.packets:
                self._send(fragment)
            return
        if is_tcp_syn(packet, info):
            packet = clamp_mss(packet, info, mss_for_mtu(info.version, self.mtu))
        self._send(packet)

    def _send_super_packet(self, packet: bytes, info: PacketInfo) -> None:
        """A TCP super-packet from the kernel's GSO: one datagram (or a few, if huge)."""
        if info.length <= MAX_SUPER_PACKET_BYTES:
            self._send(packet)
            return
        try:
            pieces = split_super_packet(packet, info, self.mtu, MAX_SUPER_PACKET_BYTES)
        except ValueError:
            self.metrics.drop(DropReason.MALFORMED)
            return
        for piece in pieces:
            self._send(piece)

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
