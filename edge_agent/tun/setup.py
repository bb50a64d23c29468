"""Composition of the agent's L3 side from its TunConfig (what edge_agent/app.py calls).

``start_agent_l3`` opens the TUN device, brings it up with its MTU, addresses and routes
(the cloud prefixes to send through the tunnel), and starts a :class:`TunForwarder`.
Each gateway replica's tunnel becomes one path as it comes up, and goes when it drops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from edge_agent.tun.forwarder import PathHandle, TunForwarder
from raven.config.common import TunConfig
from raven.l3 import IPNetwork
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.netconfig import NetConfig
from raven.transport.tun import TunDevice
from raven.transport.tun_setup import start_on_tun

log = logging.getLogger(__name__)


class DatagramTunnel(Protocol):
    """What a path needs from a tunnel."""

    on_datagram: Callable[[bytes], None] | None

    def send_datagram(self, data: bytes) -> bool: ...


class AgentL3:
    """The running L3 side of an agent."""

    def __init__(self, forwarder: TunForwarder) -> None:
        self.forwarder = forwarder
        self._paths: dict[object, PathHandle] = {}

    def tunnel_changed(self, link: object, tunnel: DatagramTunnel | None) -> None:
        """The tunnel of ``link`` (one gateway replica) came up, or went (None)."""
        old = self._paths.pop(link, None)
        if old is not None:
            old.remove()
        if tunnel is not None:
            self._paths[link] = self.forwarder.add_path(tunnel.send_datagram)
            # its packets straight to the forwarder: no hop through the app per packet
            tunnel.on_datagram = self.forwarder.packet_from_gateway

    def packet_from_gateway(self, packet: bytes) -> None:
        self.forwarder.packet_from_gateway(packet)

    async def stop(self) -> None:
        for path in self._paths.values():
            path.remove()
        self._paths.clear()
        await self.forwarder.stop()
        self.forwarder.tun.close()


async def start_agent_l3(
    config: TunConfig,
    subnets: Sequence[IPNetwork | str],
    registry: CollectorRegistry,
    *,
    agent: str = "local",
    tun: TunDevice | None = None,
    netconfig: NetConfig | None = None,
    offload: bool = True,
) -> AgentL3:
    """Open and configure the TUN device named in ``config`` and start forwarding
    (`raven.transport.tun_setup`; ``tun``/``netconfig`` replace the device and iproute2)."""

    async def start(device: TunDevice, _ip: NetConfig) -> AgentL3:
        forwarder = TunForwarder(device, registry, subnets, config.mtu, agent=agent)
        await forwarder.start()
        log.info("l3 forwarding subnets=%s", ",".join(map(str, subnets)))
        return AgentL3(forwarder)

    return await start_on_tun(config, start, tun=tun, netconfig=netconfig, offload=offload)
