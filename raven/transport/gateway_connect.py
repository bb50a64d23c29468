"""How the agent's tunnel reaches a gateway: straight over TCP, through an HTTP forward proxy
(``CONNECT``, Basic authentication, TLS to the proxy), inside WebSocket over TLS
(``wss://``: what TLS-terminating load balancers and Ingresses forward), or the last two
together. The Noise session runs end to end inside every one of them: proxies and load
balancers see only its ciphertext.

:func:`connect_tunnel` builds the layers in order (TCP, TLS to an https:// proxy, CONNECT,
TLS to the gateway's load balancer, WebSocket upgrade) and then hands the finished transport
to the tunnel (``connection_made``), with any bytes that came early.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raven.protocol import tunnel_http as th
from raven.transport.proxy_env import ProxyRoute, proxy_for
from raven.transport.tls_client import client_tls_context
from raven.transport.websocket_transport import stack_websocket

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


class _Exchange(asyncio.Protocol):
    """Reads one HTTP response head off a transport (the layers before the tunnel)."""

    def __init__(self) -> None:
        self.head = th.ResponseHead()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)

    def expect(self) -> None:
        self.head = th.ResponseHead()
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            self.head.rest += data  # after the head: the next layer's first bytes
            return
        try:
            if self.head.feed(data):
                self.done.set_result(None)
        except th.HttpHeadError as exc:
            self.done.set_exception(exc)

    def eof_received(self) -> bool | None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("closed before answering"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc or 'closed'}"))


async def _read_head(ex: _Exchange, stage: str) -> th.ResponseHead:
    try:
        await ex.done
    except th.HttpHeadError as exc:
        raise TransportFailed(stage, "error", f"{stage}: {exc}") from None
    except ConnectionError as exc:
        raise TransportFailed(stage, "error", f"{stage} {exc}") from None
    return ex.head


async def _through_proxy(
    loop: asyncio.AbstractEventLoop, route: ProxyRoute, host: str, port: int
) -> tuple[asyncio.Transport, _Exchange]:
    ssl_ctx = client_tls_context(route.ca_file) if route.scheme == "https" else None
    try:
        transport, ex = await loop.create_connection(
            _Exchange, route.host, route.port, ssl=ssl_ctx,
            server_hostname=route.host if ssl_ctx is not None else None,
        )  # fmt: skip
    except OSError as exc:
        label = "dns_failure" if _is_dns_error(exc) else "unreachable"
        if type(exc).__name__.startswith("SSL"):  # ssl is imported only when TLS is used
            label = "tls_failed"
        raise TransportFailed("proxy", label, f"proxy {route.label}: {exc}") from None
    ex.transport = transport
    transport.write(th.connect_request(host, port, route.credentials))
    head = await _read_head(ex, f"proxy {route.label}")
    if head.status != 200:
        transport.abort()
        label = th.refusal_label(head.status)
        hint = {
            "auth_required": " (proxy credentials missing or wrong: proxy.credentials_file or"
            " the proxy URL's user:password)",
            "forbidden": " (the proxy does not allow CONNECT to this host and port)",
            "bad_gateway": " (the proxy could not reach the gateway)",
        }.get(label, "")
        raise TransportFailed(
            "proxy", label,
            f"proxy {route.label} refused CONNECT {host}:{port}: {head.what()}{hint}",
        )  # fmt: skip
    return transport, ex


def _is_dns_error(exc: OSError) -> bool:
    import socket

    return isinstance(exc, socket.gaierror)


async def connect_tunnel(
    app: asyncio.Protocol,
    address: str,
    port: int,
    settings: GatewayTransport,
    proxy: ProxyRoute | None,
) -> asyncio.BaseTransport:
    """Connect ``app`` (a Tunnel) to the gateway at ``address:port`` through the layers of
    ``settings``; returns the transport ``app`` now writes to. TransportFailed or OSError."""
    loop = asyncio.get_running_loop()
    ex: _Exchange | None = None
    transport: asyncio.Transport
    if proxy is not None:
        transport, ex = await _through_proxy(loop, proxy, address, port)
    elif settings.websocket:
        transport, ex = await loop.create_connection(_Exchange, address, port)
    else:
        raw, _ = await loop.create_connection(lambda: app, address, port)
        return raw
    assert ex is not None
    early = ex.head.rest
    if not settings.websocket:
        transport.set_protocol(app)
        app.connection_made(transport)
        if early:
            app.data_received(early)
        return transport
    tls: asyncio.Transport = transport
    if settings.websocket_tls:
        server_name = settings.tls_server_name or settings.host or address
        try:
            upgraded = await loop.start_tls(
                transport, ex, client_tls_context(settings.tls_ca_file), server_hostname=server_name
            )
        except (OSError, ConnectionError) as exc:
            transport.abort()
            raise TransportFailed("tls", "tls_failed", f"TLS to {server_name}: {exc}") from None
        if upgraded is None:  # pragma: no cover - closed during the TLS handshake
            raise TransportFailed("tls", "tls_failed", f"TLS to {server_name}: connection closed")
        tls = upgraded
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    host = settings.host or address
    default_port = 443 if settings.websocket_tls else 80
    host_header = host if port == default_port else f"{host}:{port}"
    ex.expect()
    assert settings.websocket_path is not None
    tls.write(th.upgrade_request(host_header, settings.websocket_path, key,
                                 subprotocol=WEBSOCKET_SUBPROTOCOL, extra_headers={}))  # fmt: skip
    head = await _read_head(ex, "websocket upgrade")
    if head.status != 101 or not head.header_has("upgrade", "websocket"):
        tls.abort()
        raise TransportFailed(
            "websocket", th.refusal_label(head.status),
            f"{host_header}{settings.websocket_path}: no WebSocket upgrade ({head.what()})",
        )  # fmt: skip
    if head.headers.get("sec-websocket-accept") != th.websocket_accept(key):
        tls.abort()
        raise TransportFailed("websocket", "error", "WebSocket upgrade with a wrong accept key")
    extra: dict[str, Any] = {"peername": tls.get_extra_info("peername")}
    return stack_websocket(tls, app, client=True, first_bytes=head.rest, extra=extra)
