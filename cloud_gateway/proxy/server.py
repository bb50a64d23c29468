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
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from cloud_gateway.proxy.context import ProxyContext, peer_host, peer_name
from cloud_gateway.proxy.errors import ErrorKind, ProxyError, error_response
from cloud_gateway.proxy.http_conn import HttpConnection
from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.proxy.tls_conn import serve_tls
from cloud_gateway.status import ScrapeLog
from raven.config.gateway import ProxyConfig
from raven.hostport import parse_hostport
from raven.transport.reset import abort_with_rst
from raven.transport.stream import StreamOpener

log = logging.getLogger("cloud_gateway.proxy")

#: Default bound on how long stop() waits for in-flight requests.
DEFAULT_STOP_GRACE_S = 10.0
_BACKLOG = 1024

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ProxyServer:
    """The gateway's L7 proxy listeners over any :class:`StreamOpener`."""

    def __init__(
        self, opener: StreamOpener, config: ProxyConfig, registry: CollectorRegistry
    ) -> None:
        self._ctx = ProxyContext(opener=opener, config=config, metrics=ProxyMetrics(registry))
        self._servers: list[asyncio.Server] = []
        self._http_address: tuple[str, int] | None = None
        self._tls_addresses: list[tuple[str, int]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(config.max_connections)

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

    async def start(self) -> None:
        """Bind every listener; on failure nothing stays bound."""
        config = self._ctx.config
        try:
            server = await self._listen(config.http_listen, self._on_http)
            self._http_address = _bound(server)
            for listener in config.tls_listeners:
                port = listener.target_port

                async def on_tls(
                    r: asyncio.StreamReader, w: asyncio.StreamWriter, port: int = port
                ) -> None:
                    await self._run(w, serve_tls(self._ctx, r, w, port))

                self._tls_addresses.append(_bound(await self._listen(listener.listen, on_tls)))
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

    async def _listen(self, address: str, handler: Handler) -> asyncio.Server:
        host, port = parse_hostport(address)
        server = await asyncio.start_server(handler, host, port, backlog=_BACKLOG)
        self._servers.append(server)
        return server

    async def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop accepting; in-flight requests get ``grace_s`` to finish, then are cancelled."""
        self._ctx.draining = True
        for server in self._servers:
            server.close()
        for writer in list(self._ctx.idle):
            writer.close()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    async def _on_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._run(writer, HttpConnection(self._ctx, reader, writer).run())

    async def _run(self, writer: asyncio.StreamWriter, work: Awaitable[None]) -> None:
        """Track the connection, bound concurrency, always close the socket."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        metrics = self._ctx.metrics
        metrics.active_connections.inc()
        acquired = False
        try:
            refusal = self._refusal_at_accept(peer_host(writer))
            if refusal is not None:
                self._ctx.record_error(refusal, "unknown", peer_name(writer))
                abort_with_rst(writer.transport)
                return
            acquired = await self._acquire(writer)
            if acquired:
                await work
        except Exception:
            log.exception("proxy connection failed peer=%s", peer_name(writer))
        except asyncio.CancelledError:
            if not self._ctx.draining:
                raise
            # stop() cancelled this connection after its grace: it ends here. Re-raised, the
            # cancellation would reach asyncio.start_server's done-callback, which Python 3.11
            # reports as an unhandled error with a traceback.
        finally:
            if not acquired and asyncio.iscoroutine(work):
                work.close()
            if acquired:
                self._slots.release()
            metrics.active_connections.dec()
            self._tasks.discard(task)
            if not writer.is_closing():
                writer.close()

    def _refusal_at_accept(self, client: str) -> ProxyError | None:
        """Why a new connection from ``client`` is reset before a byte is read, if it is."""
        if not self._ctx.client_allowed(client):
            return ProxyError(ErrorKind.CLIENT_NOT_ALLOWED, "outside proxy.allowed_clients")
        if self._ctx.penalised(client):
            limit = self._ctx.config.max_refusals_per_client_per_s
            detail = f"more than {limit} refusals a second, Retry-After ignored"
            return ProxyError(ErrorKind.CLIENT_PENALISED, detail)
        return None

    async def _acquire(self, writer: asyncio.StreamWriter) -> bool:
        if not self._slots.locked():
            await self._slots.acquire()
            return True
        try:
            async with asyncio.timeout(self._ctx.config.header_timeout_s):
                await self._slots.acquire()
            return True
        except TimeoutError:
            exc = ProxyError(ErrorKind.BUSY, "too many client connections")
            self._ctx.record_error(exc, "unknown", peer_name(writer))
            writer.write(error_response(exc.kind, exc.detail, close=True))
            return False


def _bound(server: asyncio.Server) -> tuple[str, int]:
    sockname = server.sockets[0].getsockname()
    return str(sockname[0]), int(sockname[1])
