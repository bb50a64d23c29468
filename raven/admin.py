"""The admin HTTP server every long-running process has: /metrics, /healthz, /readyz.

Callers add their own routes (e.g. the gateway's /api/v1/*) to the app before start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from raven.config.common import parse_hostport

log = logging.getLogger(__name__)

#: Returns (ready, reason). /readyz answers 200 when ready, 503 with the reason otherwise.
ReadyCheck = Callable[[], tuple[bool, str]]


class AdminServer:
    """aiohttp app serving metrics and health of one process."""

    def __init__(self, listen: str, registry: CollectorRegistry, ready: ReadyCheck) -> None:
        self.host, self.port = parse_hostport(listen)
        self.registry = registry
        self.ready = ready
        self.app = web.Application()
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self._runner: web.AppRunner | None = None
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            sockname = server.sockets[0].getsockname()  # type: ignore[attr-defined]
            self.bound = (sockname[0], sockname[1])
        log.info("admin listening addr=%s:%s", self.host, self.bound[1] if self.bound else "?")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        ok, reason = self.ready()
        return web.Response(text=("ok" if ok else reason) + "\n", status=200 if ok else 503)
