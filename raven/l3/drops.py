"""Why an L3 packet was dropped. Values are the ``reason`` label of ``raven_l3_drops_total``."""

from __future__ import annotations

import enum


class DropReason(enum.Enum):
    """Every way the L3 data path can refuse a packet, on either side."""

    #: Not an IPv4/IPv6 packet, or its header is truncated or inconsistent.
    MALFORMED = "malformed"
    #: Gateway: no attached agent routes the destination.
    NO_ROUTE = "no_route"
    #: Gateway: the inner source of a packet from an agent is outside that agent's
    #: authorised and registered prefixes (cryptokey routing).
    SPOOFED_SOURCE = "spoofed_source"
    #: Agent: a packet from the gateway is addressed outside this site's subnets.
    NOT_LOCAL_DESTINATION = "not_local_destination"
    #: Agent: a packet read from the TUN device has a source outside this site's subnets
    #: (the gateway would drop it as spoofed; it is dropped before it costs tunnel bytes).
    SOURCE_NOT_LOCAL = "source_not_local"
    #: Larger than the tunnel MTU and not fragmentable; an ICMP "too big" went back.
    TOO_BIG = "too_big"
    #: The tunnel's bounded datagram queue was full (L3 never blocks the tunnel).
    TUNNEL_QUEUE_FULL = "tunnel_queue_full"
    #: The TUN device could not take the packet (EAGAIN/ENOBUFS): dropped, never waited on.
    TUN_WRITE_FAILED = "tun_write_failed"
    #: Agent: no tunnel to any gateway replica is up.
    NO_PATH = "no_path"
