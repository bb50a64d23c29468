"""The L3 packet path both sides share between a TUN device and their tunnels.

The gateway's router and the agent's forwarder differ only in *which* packets they accept and
*where* a packet goes (a route per destination, cryptokey checks, a failover path list). The
rest is this one path:

- TUN -> tunnel (`TunPath.to_tunnel`): over the MTU, a TCP super-packet from a device with
  offload goes whole (split only when larger than a datagram may be); IPv4 without DF is
  fragmented; anything else is dropped and answered with ICMP "too big" into the TUN (rate
  limited). SYNs get their MSS clamped to the tunnel MTU.
- tunnel -> TUN (`TunPath.write_tun`): SYNs clamped, the packet written (software-segmented
  for a device without offload); a refused write is a counted drop. Nothing here ever blocks.

Both sides open each packet with :meth:`TunPath.parse` (``parse_packet``; a refused packet is
the ``malformed`` drop) and call straight into this path: on a packet's
way every call is paid cold (the process wakes for it), so the path is as flat as it can be.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from raven.l3 import (
    DropReason,
    IcmpRateLimiter,
    MalformedPacket,
    PacketInfo,
    clamp_mss,
    fit_mtu,
    mss_for_mtu,
    parse_packet,
)
from raven.l3.gso import MAX_SUPER_PACKET_BYTES, is_gso_candidate, split_super_packet
from raven.l3.metrics import L3Metrics
from raven.transport.tun import TunDevice, write_packet

#: Smallest MTU an IPv4 host must accept (RFC 791); the path refuses less.
MIN_MTU = 576

#: Puts one packet on a tunnel (and counts it or its drop).
SendPacket = Callable[[bytes], object]


class TunPath:
    """MTU, super-packets, fragments, ICMP and MSS clamping between a TUN and tunnels."""

    def __init__(
        self,
        tun: TunDevice,
        metrics: L3Metrics,
        mtu: int,
        *,
        icmp_rate_per_s: float = 100.0,
        icmp_burst: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mtu < MIN_MTU:
            raise ValueError(f"mtu must be at least {MIN_MTU}")
        self.tun = tun
        self.metrics = metrics
        self.mtu = mtu
        self._icmp_limit = IcmpRateLimiter(icmp_rate_per_s, icmp_burst)
        self._clock = clock

    def parse(self, packet: bytes) -> PacketInfo | None:
        """The packet's headers (``parse_packet``); None, counted as the ``malformed`` drop,
        when it refuses them: the one opening of every packet either side handles."""
        try:
            return parse_packet(packet)
        except MalformedPacket:
            self.metrics.drop(DropReason.MALFORMED)
            return None

    def to_tunnel(self, packet: bytes, info: PacketInfo, send: SendPacket) -> None:
        """A packet read from the TUN and accepted by the side: fit it and ``send`` it."""
        if info.length > self.mtu:
            if self.tun.offload and is_gso_candidate(info):
                self._super_packet(packet, info, send)
            else:
                self._too_big(packet, info, send)
            return
        if info.tcp_syn:
            packet = clamp_mss(packet, info, mss_for_mtu(info.version, self.mtu))
        send(packet)

    def write_tun(self, packet: bytes, info: PacketInfo | None = None) -> bool:
        """Write to the TUN a packet from a tunnel (``info``: its parse, the side accepted
        it; SYNs clamped, super-packets segmented if the device has no offload) or one of
        our own ICMP answers (no ``info``); False when dropped (counted)."""
        if info is not None and info.tcp_syn:
            packet = clamp_mss(packet, info, mss_for_mtu(info.version, self.mtu))
        if info is None or info.length <= self.mtu:  # the common case: as it is
            ok = self.tun.write(packet)
        else:
            ok = write_packet(self.tun, packet, info, self.mtu)
        if not ok:
            self.metrics.drop(DropReason.TUN_WRITE_FAILED)
        return ok

    def icmp(self, reply: bytes | None) -> None:
        """Send an ICMP answer back into the TUN, within the rate limit."""
        if reply is not None and self._icmp_limit.allow(self._clock()):
            self.write_tun(reply)

    def _too_big(self, packet: bytes, info: PacketInfo, send: SendPacket) -> None:
        verdict = fit_mtu(packet, info, self.mtu)
        if not verdict.packets:
            self.metrics.drop(DropReason.TOO_BIG)
            self.icmp(verdict.reply)
            return
        for fragment in verdict.packets:
            send(fragment)

    def _super_packet(self, packet: bytes, info: PacketInfo, send: SendPacket) -> None:
        """A TCP super-packet from the kernel's GSO: one datagram (or a few, if huge)."""
        if info.length <= MAX_SUPER_PACKET_BYTES:
            send(packet)
            return
        try:
            pieces = split_super_packet(packet, info, self.mtu, MAX_SUPER_PACKET_BYTES)
        except ValueError:
            self.metrics.drop(DropReason.MALFORMED)
            return
        for piece in pieces:
            send(piece)
