"""The layers an agent's tunnel may need before its handshake (see
`raven.transport.gateway_connect`, which loads this module only for a tunnel that uses one): an
HTTP ``CONNECT`` through a forward proxy (TLS to an https:// proxy first), TLS to the gateway's
load balancer, and the WebSocket upgrade (``ws://``, ``wss://``). :func:`first_layer` and
:func:`hand_over` build them in order and hand the finished transport to the tunnel
(``connection_made``), with any bytes that came early.
"""

from __future__ import annotations

import asyncio
import base64
import os
import typing
from typing import Any

from raven.protocol import tunnel_http as th
from raven.transport.gateway_connect import (
    WEBSOCKET_SUBPROTOCOL,
    GatewayTransport,
    TransportFailed,
)
from raven.transport.proxy_env import ProxyRoute
from raven.transport.tls_client import client_tls_context
from raven.transport.websocket_transport import stack_websocket

__all__ = ["first_layer", "hand_over"]


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


async def first_layer(
    address: str, port: int, proxy: ProxyRoute | None
) -> tuple[asyncio.Transport, _Exchange]:
    """The connection the other layers go over: CONNECT through ``proxy`` to ``address:port``,
    or (no proxy: a WebSocket tunnel) TCP to it; with the reader of the next HTTP head."""
    loop = asyncio.get_running_loop()
    if proxy is not None:
        return await _through_proxy(loop, proxy, address, port)
    transport, ex = await loop.create_connection(_Exchange, address, port)
    return transport, ex


async def hand_over(
    app: asyncio.Protocol,
    first: tuple[asyncio.Transport, _Exchange],
    address: str,
    port: int,
    settings: GatewayTransport,
) -> asyncio.BaseTransport:
    """The tunnel's transport on the ``first_layer``: that connection itself (a raw tunnel
    through a proxy), or TLS to the load balancer (``wss://``) and the WebSocket upgrade on
    it; ``app`` gets it, with any bytes that came early."""
    transport, ex = first
    loop = asyncio.get_running_loop()
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
