"""A gateway listener plus agent links on loopback, shared by tunnel integration tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.registry import Registry
from cloud_gateway.tunnel_listener import TunnelListener
from edge_agent.gateway_link import DialSettings, GatewayLink
from edge_agent.relay import Relay
from raven.config.gateway import AuthorisedAgent
from raven.protocol.limits import Limits
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.tunnel import Tunnel
from tests.helpers import KeyPair, start_echo_server, wait_for
from tests.helpers.sansio import make_agent, make_gateway

LIMITS = Limits(keepalive_interval_s=0.5, dead_peer_timeout_s=2.0, drain_timeout_s=1.0)


class Site:
    """A gateway listener plus N agent links, all on loopback."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gw = KeyPair(tmp, "gw")
        self.agent = KeyPair(tmp, "agent")
        self.gw_metrics = TunnelMetrics(CollectorRegistry(), "agent")
        self.ag_registry = CollectorRegistry()
        self.ag_metrics = TunnelMetrics(self.ag_registry, "gateway")
        auth = AuthorisedAgent(
            name="site-a", public_key=self.agent.public_b64, nodes=["edge-*"], prefixes=[]
        )
        self.registry = Registry([auth], self.gw_metrics)
        self.listener = self.make_listener()
        self.links: list[GatewayLink] = []
        self.relays: list[Relay] = []
        self.echo: asyncio.Server | None = None

    def make_listener(self, port: int = 0, limits: Limits = LIMITS) -> TunnelListener:
        return TunnelListener(
            listen=f"127.0.0.1:{port}",
            static_private=self.gw.private,
            psk=bytes(32),
            limits=limits,
            registry=self.registry,
            metrics=self.gw_metrics,
            handshake_rate_per_s=100,
            handshake_burst=100,
        )

    async def start(
        self, nodes: dict[str, str], ports: list[int], key: KeyPair | None = None
    ) -> GatewayLink:
        if self.listener.bound is None:
            await self.listener.start()
        assert self.listener.bound is not None
        relay = Relay(nodes, ports, 2.0, CollectorRegistry())
        self.relays.append(relay)
        settings = DialSettings(
            static_private=(key or self.agent).private,
            gateway_public=self.gw.public,
            psk=bytes(32),
            limits=LIMITS,
            min_backoff_s=0.05,
            max_backoff_s=0.3,
        )
        link = GatewayLink(
            "127.0.0.1",
            self.listener.bound[1],
            settings,
            on_stream=relay.handle,
            registration=lambda: (sorted(nodes), []),
            metrics=self.ag_metrics,
        )
        link.start()
        self.links.append(link)
        return link

    async def close(self) -> None:
        for link in self.links:
            await link.stop(graceful=False)
        await self.listener.drain(0.5)
        if self.echo is not None:
            self.echo.close()
            await self.echo.wait_closed()


@pytest.fixture
async def site(tmp_path: Path):
    s = Site(tmp_path)
    s.echo = await start_echo_server()
    yield s
    await s.close()


def echo_port(site: Site) -> int:
    assert site.echo is not None
    return int(site.echo.sockets[0].getsockname()[1])


class TunnelPair:
    """Two bare Tunnels over loopback TCP with the handshake done: ``gateway`` listens,
    ``agent`` dials, each made with the given Tunnel keyword arguments (on_stream,
    on_datagram, on_event)."""

    def __init__(
        self, agent: Mapping[str, Any] | None = None, gateway: Mapping[str, Any] | None = None
    ) -> None:
        self._agent_kwargs = dict(agent or {})
        self._gateway_kwargs = dict(gateway or {})
        self._agent: Tunnel | None = None
        self._gateway: Tunnel | None = None
        self._server: asyncio.Server | None = None

    @property
    def agent(self) -> Tunnel:
        assert self._agent is not None
        return self._agent

    @property
    def gateway(self) -> Tunnel:
        assert self._gateway is not None
        return self._gateway

    async def start(self) -> None:
        def serve() -> Tunnel:
            self._gateway = Tunnel(make_gateway(now=time.monotonic()), **self._gateway_kwargs)
            return self._gateway

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        _, self._agent = await loop.create_connection(
            lambda: Tunnel(make_agent(now=time.monotonic()), **self._agent_kwargs),
            "127.0.0.1",
            port,
        )
        await self._agent.handshake
        await wait_for(lambda: self._gateway is not None)
        await self.gateway.handshake

    async def close(self) -> None:
        for tunnel in (self._agent, self._gateway):
            if tunnel is not None:
                await tunnel.aclose()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
