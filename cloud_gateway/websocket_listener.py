"""The gateway's WebSocket tunnel port: agents behind TLS-terminating HTTP load balancers
(ingress-nginx, cloud L7 load balancers) reach it with ``wss://host/path``.

Each connection sends one HTTP/1.1 upgrade request (bounded head, ``handshake_timeout_s``
to send it); a valid one (the configured path, ``Upgrade: websocket``, version 13, the
``raven.tunnel.v1`` subprotocol) gets ``101`` and from then on carries an ordinary tunnel
in binary frames (:mod:`raven.transport.websocket_transport`): the same handshake,
admission, rate limits and drain as the raw TCP port. Anything else gets a short HTTP error
and the connection is closed. TLS is the load balancer's business, or this port's with
``tls_cert_file``/``tls_key_file``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING

from raven.config.gateway import WebSocketConfig
from raven.hostport import parse_hostport
from raven.protocol import tunnel_http as th
from raven.telemetry.logs import doc_link, fields
from raven.telemetry.logthrottle import LogThrottle
from raven.transport.gateway_connect import WEBSOCKET_SUBPROTOCOL
from raven.transport.websocket_transport import stack_websocket

if TYPE_CHECKING:
    from raven.transport.tunnel import Tunnel

log = logging.getLogger(__name__)

#: Why an upgrade was refused: the ``reason`` of the log line, each with its row in
#: docs/troubleshooting.md ("WebSocket upgrade refusals").
REFUSALS = ("bad_request", "not_upgrade", "draining", "timeout")


class _Upgrade(asyncio.Protocol):
    """One connection until its upgrade is read (then the tunnel takes it over)."""

    def __init__(self, server: WebSocketServer) -> None:
        self.server = server
        self.head = th.RequestHead()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.server.timeout_s, self._timeout)
        self.server.pending.add(self)

    def _timeout(self) -> None:
        self.server.refused("timeout", self._peer(), "no upgrade request in time")
        self._end()

    def _end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.server.pending.discard(self)
        if self.transport is not None:
            self.transport.close()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def data_received(self, data: bytes) -> None:
        try:
            done = self.head.feed(data)
        except th.HttpHeadError as exc:
            self._refuse(400, "bad_request", str(exc))
            return
        if not done:
            return
        error = self.head.upgrade_error(self.server.path, WEBSOCKET_SUBPROTOCOL)
        if error is not None:
            self._refuse(*error[:1], "not_upgrade", error[1])
            return
        if self.server.closed:
            self._refuse(503, "draining", "gateway shutting down")
            return
        assert self.transport is not None
        if self.timer is not None:
            self.timer.cancel()
        self.server.pending.discard(self)
        key = self.head.headers["sec-websocket-key"]
        self.transport.write(th.upgrade_response(key, WEBSOCKET_SUBPROTOCOL))
        tunnel = self.server.new_tunnel()
        extra = {"peername": self.server.client_address(self.transport, self.head)}
        stack_websocket(self.transport, tunnel, client=False, first_bytes=self.head.rest,
                        extra=extra)  # fmt: skip

    def _refuse(self, status: int, label: str, reason: str) -> None:
        self.server.refused(label, self._peer(), reason)
        if self.transport is not None:
            self.transport.write(th.error_response(status, reason))
        self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.server.pending.discard(self)


class WebSocketServer:
    """Listens for WebSocket tunnels; ``new_tunnel`` makes the Tunnel each one carries."""

    def __init__(
        self,
        config: WebSocketConfig,
        new_tunnel: Callable[[], Tunnel],
        *,
        timeout_s: float,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        assert config.listen is not None
        self.host, self.port = parse_hostport(config.listen)
        self.path = config.path
        self.config = config
        self.new_tunnel = new_tunnel
        self.timeout_s = timeout_s
        self.on_refused = on_refused
        self.trusted = [ipaddress.ip_network(p, strict=False) for p in config.trusted_proxies]
        self.pending: set[_Upgrade] = set()
        self.closed = False
        self.bound: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._throttle = LogThrottle(clock=time.monotonic)

    async def start(self) -> None:
        ssl_ctx = None
        if self.config.tls_cert_file:
            import ssl

            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(self.config.tls_cert_file, self.config.tls_key_file)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Upgrade(self), self.host, self.port, ssl=ssl_ctx, reuse_address=True,
            backlog=1024,
        )  # fmt: skip
        sock = self._server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("websocket tunnel listener up addr=%s:%s path=%s tls=%s",
                 self.host, self.bound[1], self.path, ssl_ctx is not None)  # fmt: skip

    def client_address(self, transport: asyncio.Transport, head: th.RequestHead) -> object:
        """The agent's address: the connection's peer, or, when that peer is a trusted proxy
        (``trusted_proxies``), the last address it added to X-Forwarded-For."""
        peer = transport.get_extra_info("peername")
        if not peer or not self.trusted:
            return peer
        try:
            addr = ipaddress.ip_address(peer[0])
        except ValueError:
            return peer
        if not any(addr.version == n.version and addr in n for n in self.trusted):
            return peer
        forwarded = head.headers.get("x-forwarded-for", "").split(",")[-1].strip()
        try:
            return (str(ipaddress.ip_address(forwarded)), 0)
        except ValueError:
            return peer

    def refused(self, label: str, peer: str, reason: str) -> None:
        if self.on_refused is not None:
            self.on_refused(label)
        self._throttle.log(
            log,
            logging.WARNING,
            f"websocket refused {label}",
            "websocket upgrade refused",
            extra=fields(peer=peer, reason=label, detail=reason, doc=doc_link("websocket", label)),
        )

    def stop_accepting(self) -> None:
        self.closed = True
        if self._server is not None:
            self._server.close()
        for pending in list(self.pending):
            pending._end()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
