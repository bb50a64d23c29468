"""The L3 data path, sans-IO: IP header parsing, prefix tables, ICMP errors, MSS clamping.

No asyncio, socket, time or os here: bytes in, bytes and verdicts out. The I/O lives
in :mod:`raven.transport.tun` (the TUN device), :mod:`raven.transport.netconfig`
(iproute2), ``cloud_gateway/l3`` (the router) and ``edge_agent/tun`` (the forwarder).
See docs/l3.md.
"""

from raven.l3.drops import DropReason
from raven.l3.icmp import IcmpRateLimiter, build_too_big, build_unreachable
from raven.l3.mss import clamp_mss, mss_for_mtu
from raven.l3.mtu import MtuVerdict, fit_mtu, fragment_ipv4
from raven.l3.packet import MalformedPacket, PacketInfo, parse_packet
from raven.l3.prefixes import IPAddress, IPNetwork, PrefixTable

__all__ = [
    "DropReason",
    "IPAddress",
    "IPNetwork",
    "IcmpRateLimiter",
    "MalformedPacket",
    "MtuVerdict",
    "PacketInfo",
    "PrefixTable",
    "build_too_big",
    "build_unreachable",
    "clamp_mss",
    "fit_mtu",
    "fragment_ipv4",
    "mss_for_mtu",
    "parse_packet",
]
