"""The one TUN setup of both L3 sides: open the device named in a `TunConfig`, bring it up
with its MTU, addresses and routes (iproute2), start the side's packet path on it; the device
is closed again when any step fails."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from raven.config.common import TunConfig
from raven.transport.netconfig import NetConfig
from raven.transport.tun import LinuxTun, TunDevice

log = logging.getLogger(__name__)

T = TypeVar("T")


async def start_on_tun(
    config: TunConfig,
    start: Callable[[TunDevice, NetConfig], Awaitable[T]],
    *,
    tun: TunDevice | None = None,
    netconfig: NetConfig | None = None,
    offload: bool = True,
) -> T:
    """Open and configure the device, then ``await start(device, netconfig)`` and return it.

    ``tun``/``netconfig`` replace the Linux device and iproute2 (tests pass a MemoryTun and a
    NetConfig with a fake runner).
    """
    device: TunDevice = (
        tun if tun is not None else LinuxTun(config.name, offload=offload, mtu=config.mtu)
    )
    ip = netconfig if netconfig is not None else NetConfig()
    try:
        routes = [ipaddress.ip_network(r) for r in config.routes]
        await ip.configure(device.name, config.mtu, config.addresses, routes)
        started = await start(device, ip)
    except BaseException:
        device.close()
        raise
    log.info("l3 up dev=%s offload=%s mtu=%d addresses=%s routes=%s", device.name,
             device.offload, config.mtu, config.addresses, config.routes)  # fmt: skip
    return started
