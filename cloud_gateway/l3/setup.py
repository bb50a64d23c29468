"""Composition of the gateway's L3 side from its TunConfig (what cloud_gateway/app.py calls).

``start_gateway_l3`` opens the TUN device, brings it up with its MTU, addresses and
routes (iproute2), and starts an :class:`L3Router`; agents' accepted prefixes are routed
into the device as their tunnels come and go.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloud_gateway.l3.router import AgentPort, L3Router, SendDatagram
from raven.config.common import TunConfig
from raven.l3 import IPNetwork
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.netconfig import NetConfig
from raven.transport.tun import TunDevice
from raven.transport.tun_setup import start_on_tun


class GatewayL3:
    """The running L3 side of a gateway. ``ports`` maps each agent tunnel to its port."""

    def __init__(self, router: L3Router) -> None:
        self.router = router
        self.ports: dict[object, AgentPort] = {}

    def attach(
        self, agent: str, authorised: Sequence[IPNetwork | str], send: SendDatagram
    ) -> AgentPort:
        """Attach an agent tunnel (see :meth:`L3Router.attach_agent`)."""
        return self.router.attach_agent(agent, authorised, send)

    async def stop(self) -> None:
        """Detach every port (their routes go), stop reading, close the device."""
        for port in list(self.ports.values()):
            port.detach()
        self.ports.clear()
        await self.router.stop()
        self.router.tun.close()


async def start_gateway_l3(
    config: TunConfig,
    registry: CollectorRegistry,
    *,
    tun: TunDevice | None = None,
    netconfig: NetConfig | None = None,
    offload: bool = True,
) -> GatewayL3:
    """Open and configure the TUN device named in ``config`` and start routing
    (`raven.transport.tun_setup`; ``tun``/``netconfig`` replace the device and iproute2)."""

    async def start(device: TunDevice, ip: NetConfig) -> GatewayL3:
        router = L3Router(device, registry, ip, config.mtu)
        await router.start()
        return GatewayL3(router)

    return await start_on_tun(config, start, tun=tun, netconfig=netconfig, offload=offload)
