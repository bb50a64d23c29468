"""The layers between an agent and the gateway, on loopback (raven.transport.gateway_connect):
an ``https://`` forward proxy (TLS to the proxy, its own CA file, Basic authentication), a
refused CONNECT, and the WebSocket port through that proxy, each with a real TunnelListener.
The namespace tests (tests/e2e/test_edge_egress_netns.py) run squid and nginx; Debian's squid
has no TLS listener, so the https:// proxy is a small CONNECT proxy of this test.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.registry import Registry
from cloud_gateway.tunnel_listener import TunnelListener
from edge_agent.gateway_link import DialSettings, GatewayLink
from raven.config.gateway import AuthorisedAgent, WebSocketConfig
from raven.protocol.limits import Limits
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.gateway_connect import GatewayTransport
from tests.helpers import KeyPair, wait_for
from tests.helpers.balancer import relay
from tests.helpers.certs import self_signed

pytestmark = pytest.mark.integration

LIMITS = Limits(keepalive_interval_s=0.5, dead_peer_timeout_s=3.0, handshake_timeout_s=3.0)
CREDENTIALS = "site-a:pa55 word"


class ConnectProxy:
    """An HTTP CONNECT proxy over TLS that wants Basic ``CREDENTIALS``; records what it saw."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ctx)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        head = await r1.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        token = base64.b64encode(CREDENTIALS.encode()).decode()
        if f"Proxy-Authorization: Basic {token}".encode() not in head:
            w1.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            w1.close()
            return
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        r2, w2 = await asyncio.open_connection(host, int(port))
        w1.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        await asyncio.gather(relay(r1, w2), relay(r2, w1))


@pytest.fixture
async def gateway(
    tmp_path: Path,
) -> AsyncIterator[tuple[KeyPair, KeyPair, Registry, TunnelListener]]:
    gw, agent = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
    auth = AuthorisedAgent(name="site-a", public_key=agent.public_b64, nodes=["edge-*"])
    registry = Registry([auth], TunnelMetrics(CollectorRegistry()))
    listener = TunnelListener(
        listen="127.0.0.1:0", static_private=gw.private, psk=bytes(32), limits=LIMITS,
        registry=registry, metrics=registry.metrics, handshake_rate_per_s=100,
        handshake_burst=100, websocket=WebSocketConfig(listen="127.0.0.1:0"),
    )  # fmt: skip
    await listener.start()
    yield gw, agent, registry, listener
    await listener.drain(0.2)


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[ConnectProxy, int, Path]]:
    cert, key = self_signed(tmp_path, "localhost")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    server = ConnectProxy(ctx)
    port = await server.start()
    yield server, port, cert
    assert server.server is not None
    server.server.close()


def link(
    agent: KeyPair, gw: KeyPair, port: int, route: GatewayTransport
) -> tuple[GatewayLink, TunnelMetrics]:
    settings = DialSettings(agent.private, gw.public, bytes(32), LIMITS, 0.05, 0.3, transport=route)
    metrics = TunnelMetrics(CollectorRegistry(), "gateway")
    gl = GatewayLink("127.0.0.1", port, settings, on_stream=_no_streams,
                     registration=lambda: (["edge-a-1"], []), metrics=metrics)  # fmt: skip
    return gl, metrics


async def _no_streams(*_args: object) -> None:
    return None


async def test_raw_tunnel_through_an_https_proxy_with_its_own_ca(gateway, proxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, agent, registry, listener = gateway
    server, proxy_port, proxy_ca = proxy
    creds = tmp_path / "proxy-credentials"
    creds.write_text(CREDENTIALS + "\n")
    other_ca, _ = self_signed(tmp_path, "other-ca.test")
    route = GatewayTransport(
        host="127.0.0.1", proxy_url=f"https://localhost:{proxy_port}",
        proxy_credentials_file=str(creds), proxy_ca_file=str(other_ca), environ={},
    )  # fmt: skip
    bad, metrics = link(agent, gw, listener.bound[1], route)
    bad.start()
    try:  # a proxy certificate the CA file does not vouch for: refused, nothing sent
        await wait_for(lambda: "certificate verify failed" in bad.last_error)
        assert metrics.transport_failures.labels("proxy", "tls_failed")._value.get() >= 1
        assert not server.requests
    finally:
        await bad.stop(graceful=False)

    route = GatewayTransport(
        host="127.0.0.1", proxy_url=f"https://localhost:{proxy_port}",
        proxy_credentials_file=str(creds), proxy_ca_file=str(proxy_ca), environ={},
    )  # fmt: skip
    good, _ = link(agent, gw, listener.bound[1], route)
    good.start()
    try:
        await wait_for(lambda: bool(registry.agents_for("edge-a-1")), "registered via the proxy")
        assert good.via == f"https://localhost:{proxy_port}"
        assert server.requests[-1].startswith(f"CONNECT 127.0.0.1:{listener.bound[1]} ".encode())
    finally:
        await good.stop(graceful=False)


async def test_refused_connect_is_named_without_the_password(gateway, proxy) -> None:  # type: ignore[no-untyped-def]
    gw, agent, _, listener = gateway
    _, proxy_port, proxy_ca = proxy
    route = GatewayTransport(
        host="127.0.0.1", proxy_url=f"https://site-a:secret-pw@localhost:{proxy_port}",
        proxy_ca_file=str(proxy_ca), environ={},
    )  # fmt: skip
    gl, metrics = link(agent, gw, listener.bound[1], route)
    gl.start()
    try:
        await wait_for(lambda: "407" in gl.last_error)
        assert "proxy credentials" in gl.last_error and "secret-pw" not in gl.last_error
        assert metrics.transport_failures.labels("proxy", "auth_required")._value.get() >= 1
        attempts = metrics.transport_failures.labels("proxy", "auth_required")._value.get()
        await wait_for(  # retried with the normal backoff
            lambda: (
                metrics.transport_failures.labels("proxy", "auth_required")._value.get() > attempts
            )
        )
    finally:
        await gl.stop(graceful=False)


async def test_websocket_port_through_a_plain_proxy(gateway) -> None:  # type: ignore[no-untyped-def]
    gw, agent, registry, listener = gateway
    plain = ConnectProxy(None)  # type: ignore[arg-type]
    plain.server = await asyncio.start_server(plain._handle, "127.0.0.1", 0)
    proxy_port = int(plain.server.sockets[0].getsockname()[1])
    assert listener.websocket is not None and listener.websocket.bound is not None
    ws_port = listener.websocket.bound[1]
    route = GatewayTransport(
        websocket_path="/raven/tunnel", websocket_tls=False, host="127.0.0.1",
        proxy_url=f"http://site-a:pa55%20word@127.0.0.1:{proxy_port}", environ={},
    )  # fmt: skip
    gl, _ = link(agent, gw, ws_port, route)
    gl.start()
    try:
        await wait_for(lambda: bool(registry.agents_for("edge-a-1")), "registered over ws://")
        assert plain.requests[-1].startswith(f"CONNECT 127.0.0.1:{ws_port} ".encode())
    finally:
        await gl.stop(graceful=False)
        plain.server.close()
