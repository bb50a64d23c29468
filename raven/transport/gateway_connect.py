"""How the agent's tunnel reaches a gateway: straight over TCP, through an HTTP forward proxy
(``CONNECT``, Basic authentication, TLS to the proxy), inside WebSocket over TLS
(``wss://``: what TLS-terminating load balancers and Ingresses forward), or the last two
together. The Noise session runs end to end inside every one of them: proxies and load
balancers see only its ciphertext.

:func:`connect_tunnel` dials the gateway straight over TCP, or has
`raven.transport.gateway_layers` build the layers in order (TCP, TLS to an https:// proxy,
CONNECT, TLS to the gateway's load balancer, WebSocket upgrade) and hand the finished transport
to the tunnel. An agent whose tunnel needs no layer never loads them (their HTTP heads and
WebSocket framing: ~0.25 MiB of its RSS, measured).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from raven.transport.proxy_env import ProxyRoute, proxy_for

__all__ = ["WEBSOCKET_SUBPROTOCOL", "GatewayTransport", "TransportFailed", "connect_tunnel"]

#: The Sec-WebSocket-Protocol both sides name (a gateway refuses other upgrades).
WEBSOCKET_SUBPROTOCOL = "raven.tunnel.v1"


class TransportFailed(ConnectionError):
    """A layer below the tunnel failed; ``stage`` says which (``proxy``, ``tls``,
    ``websocket``) and ``label`` is the metric label of the outcome."""

    def __init__(self, stage: str, label: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.label = label


@dataclass(frozen=True)
class GatewayTransport:
    """How to reach the gateway (from AgentConfig: ``gateway``, ``tls``, ``proxy``)."""

    #: wss://: the WebSocket path (None: the raw tunnel over TCP)
    websocket_path: str | None = None
    #: wss:// (TLS to the load balancer) rather than ws://
    websocket_tls: bool = True
    #: the name in the Host header and TLS SNI (wss://) and in CONNECT (through a proxy)
    host: str = ""
    tls_ca_file: str | None = None
    tls_server_name: str | None = None
    proxy_url: str | None = None
    no_proxy: str | None = None
    proxy_credentials_file: str | None = None
    proxy_ca_file: str | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ), repr=False)

    @property
    def websocket(self) -> bool:
        return self.websocket_path is not None

    def proxy(self, address: str, port: int) -> ProxyRoute | None:
        """The forward proxy for a tunnel to ``address:port`` (None: direct), with the
        credentials of ``proxy_credentials_file`` (read at each dial: rotation needs no
        restart)."""
        route = self._route(address, port)
        if route is None or not self.proxy_credentials_file:
            return route
        with open(self.proxy_credentials_file, encoding="utf-8") as f:
            credentials = f.read().strip()
        return dataclasses.replace(route, credentials=credentials)

    def uses_proxy(self, port: int) -> bool:
        """Whether the tunnel to the gateway's ``host:port`` goes through a proxy (then the
        agent resolves no names itself: the proxy does)."""
        return self._route(self.host, port) is not None

    def _route(self, address: str, port: int) -> ProxyRoute | None:
        return proxy_for(
            address,
            port,
            url=self.proxy_url,
            no_proxy=self.no_proxy,
            ca_file=self.proxy_ca_file,
            environ=self.environ,
        )


async def connect_tunnel(
    app: asyncio.Protocol,
    address: str,
    port: int,
    settings: GatewayTransport,
    proxy: ProxyRoute | None,
) -> asyncio.BaseTransport:
    """Connect ``app`` (a Tunnel) to the gateway at ``address:port`` through the layers of
    ``settings``; returns the transport ``app`` now writes to. TransportFailed or OSError."""
    if proxy is None and not settings.websocket:
        raw, _ = await asyncio.get_running_loop().create_connection(lambda: app, address, port)
        return raw
    from raven.transport.gateway_layers import first_layer, hand_over  # only where one is used

    return await hand_over(app, await first_layer(address, port, proxy), address, port, settings)
