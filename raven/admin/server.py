"""The one admin HTTP server of every long-running process (gateway, agent, hosts generator,
GPU exporter): `AdminRoutes` served over an HTTP backend.

The backend is a small interface (`AdminBackend`); the default one runs on aiohttp and is
imported only when the server starts, so a process can swap in another without carrying aiohttp
(the agent uses `raven.admin.asyncio_backend.AsyncioBackend`).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Protocol

from raven.admin.auth import read_token_file
from raven.admin.routes import (
    AdminRoutes,
    Dispatch,
    Exposition,
    Handler,
    ReadyCheck,
)
from raven.hostport import parse_hostport
from raven.telemetry.promclient import CONTENT_TYPE_LATEST, CollectorRegistry

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class AdminBackend(Protocol):
    """Serves ``dispatch`` over HTTP/1.1 on a TCP address."""

    async def start(self, host: str, port: int, dispatch: Dispatch) -> tuple[str, int]:
        """Listen (port 0: any free port) and return the bound (host, port)."""
        ...

    async def stop(self) -> None:
        """Stop listening and close open connections (bounded)."""
        ...


class AdminServer:
    """Metrics, health, readiness and the application's own routes of one process.

    ``listen`` is ``host:port`` (``:port`` for every address, port 0 for any free one).
    ``ready`` is the first readiness check; more can be added with `add_ready_check`.
    ``exposition`` replaces the body of /metrics (default: the registry's text format).
    """

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        ready: ReadyCheck | None = None,
        *,
        exposition: Exposition | None = None,
        metrics_content_type: str = CONTENT_TYPE_LATEST,
        backend: AdminBackend | None = None,
        token_file: str | None = None,
    ) -> None:
        self.host, self.port = parse_hostport(listen)
        self.registry = registry
        token = read_token_file(token_file) if token_file else None
        self.routes = AdminRoutes(
            registry,
            exposition=exposition,
            metrics_content_type=metrics_content_type,
            token=token,
        )
        if ready is not None:
            self.routes.add_ready_check(ready)
        self._backend = backend
        self._running: AdminBackend | None = None
        self.bound: tuple[str, int] | None = None

    def add_route(
        self, path: str, handler: Handler, *, method: str = "GET", public: bool = False
    ) -> None:
        self.routes.add_route(path, handler, method=method, public=public)

    def add_ready_check(self, check: ReadyCheck) -> None:
        self.routes.add_ready_check(check)

    async def start(self) -> None:
        if self._running is not None:
            raise RuntimeError("admin server already started")
        backend = self._backend
        if backend is None:
            from raven.admin.aiohttp_backend import AiohttpBackend

            backend = AiohttpBackend()
        self.bound = await backend.start(self.host, self.port, self.routes.dispatch)
        self._running = backend
        log.info("admin listening addr=%s:%d", self.host, self.bound[1])
        if self.routes.token is None and not _is_loopback(self.host):
            private = sorted(r.path for r in self.routes.routes if not r.public)
            if private:
                log.warning("admin routes %s are served without authentication on %s: set "
                            "admin_token_file (docs/security.md)", ", ".join(private),
                            self.host or "every address")  # fmt: skip

    async def stop(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            await running.stop()
