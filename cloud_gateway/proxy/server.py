"""ProxyServer: the listeners Prometheus talks to (HTTP proxy listener + TLS passthrough listeners).

Composition: ``ProxyServer(opener, config, registry)``; ``await start()`` binds
``config.http_listen`` and every ``config.tls_listeners`` entry (port 0 picks a free port, see
:attr:`http_address` / :attr:`tls_addresses`); ``await stop()`` stops accepting, closes idle
keep-alive connections, lets in-flight requests finish within ``grace_s`` and cancels the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from cloud_gateway.backfill.scrapers import ScraperBook
from cloud_gateway.proxy.client_conn import ClientConnection, ConnectionSlots
from cloud_gateway.proxy.context import ProxyContext
from cloud_gateway.proxy.http_conn import HttpConnection
from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.proxy.tls_conn import TlsConnection
from cloud_gateway.status import ScrapeLog
from raven.config.gateway import ProxyConfig
from raven.hostport import parse_hostport
from raven.telemetry.promclient import CollectorRegistry
from raven.transport.stream import StreamOpener

log = logging.getLogger("cloud_gateway.proxy")

#: Default bound on how long stop() waits for in-flight requests.
DEFAULT_STOP_GRACE_S = 10.0
_BACKLOG = 1024


class ProxyServer:
    """The gateway's L7 proxy listeners over any :class:`StreamOpener`."""

    def __init__(
        self,
        opener: StreamOpener,
        config: ProxyConfig,
        registry: CollectorRegistry,
        scrapers: ScraperBook | None = None,
    ) -> None:
        self._ctx = ProxyContext(
            opener=opener, config=config, metrics=ProxyMetrics(registry), scrapers=scrapers
        )
        self._servers: list[asyncio.Server] = []
        self._http_address: tuple[str, int] | None = None
        self._tls_addresses: list[tuple[str, int]] = []
        self._slots = ConnectionSlots(config.max_connections)

    @property
    def http_address(self) -> tuple[str, int]:
        """Bound (host, port) of the HTTP proxy listener (after start)."""
        if self._http_address is None:
            raise RuntimeError("ProxyServer not started")
        return self._http_address

    @property
    def tls_addresses(self) -> list[tuple[str, int]]:
        """Bound (host, port) of each TLS listener, in ``config.tls_listeners`` order."""
        return list(self._tls_addresses)

    @property
    def scrapes(self) -> ScrapeLog:
        """Recent results per node (the status page reads them)."""
        return self._ctx.scrapes

    @property
    def draining(self) -> bool:
        return self._ctx.draining

    @property
    def context(self) -> ProxyContext:
        """What every connection shares (in-flight counts per client and node, drain flag)."""
        return self._ctx

    @property
    def connections(self) -> list[ClientConnection]:
        """The client connections being served (not those waiting for a slot)."""
        return list(self._slots.active)

    async def start(self) -> None:
        """Bind every listener; on failure nothing stays bound."""
        config, ctx, slots = self._ctx.config, self._ctx, self._slots
        try:
            server = await self._listen(config.http_listen, lambda: HttpConnection(ctx, slots))
            self._http_address = _bound(server)
            for listener in config.tls_listeners:

                def tls(port: int = listener.target_port) -> asyncio.Protocol:
                    return TlsConnection(ctx, slots, port)

                self._tls_addresses.append(_bound(await self._listen(listener.listen, tls)))
        except BaseException:
            for s in self._servers:
                s.close()
            self._servers.clear()
            raise
        log.info(
            "proxy listening http=%s:%d tls=%s",
            *self._http_address,
            ",".join(f"{h}:{p}" for h, p in self._tls_addresses) or "-",
        )

    async def _listen(
        self, address: str, factory: Callable[[], asyncio.Protocol]
    ) -> asyncio.Server:
        host, port = parse_hostport(address)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(factory, host, port, backlog=_BACKLOG)
        self._servers.append(server)
        return server

    def wind_down(self) -> None:
        """Shutting down soon: each response from now on closes its connection
        (``Connection: close``) and idle keep-alive connections are closed, so clients
        reconnect (through the Service, to another replica); requests are still served."""
        self._ctx.draining = True
        for conn in list(self._ctx.idle):
            conn.close()

    async def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop accepting; in-flight requests get ``grace_s`` to finish, then are cancelled;
        then every connection still open is closed."""
        self._ctx.draining = True
        self._ctx.streams.close()
        for server in self._servers:
            server.close()
        for conn in list(self._ctx.idle):
            conn.close()
        tasks = {c.task for c in self._slots.active if c.task is not None}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for conn in [*self._slots.active, *self._slots.waiting]:
            conn.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()


def _bound(server: asyncio.Server) -> tuple[str, int]:
    sockname = server.sockets[0].getsockname()
    return str(sockname[0]), int(sockname[1])
