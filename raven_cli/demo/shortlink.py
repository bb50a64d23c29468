"""The demo's short link to its Prometheus graph.

The graph's own URL carries a PromQL query and is about 150 characters: wider than a terminal,
so it wraps and scrolls away. ``http://host:port/`` answers with a redirect to that graph, and the
graph's time range is chosen when the link is opened, to fit how long the demo has been running
(a one-hour range on a demo that is a minute old is a flat line at the right edge)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from aiohttp import web

#: Prometheus ``range_input`` steps, smallest first: the first one at least as long as the demo's
#: age is used, so the data fills most of the graph.
RANGES: tuple[tuple[float, str], ...] = (
    (60, "1m"),
    (300, "5m"),
    (900, "15m"),
    (3600, "1h"),
    (3 * 3600, "3h"),
    (12 * 3600, "12h"),
    (86400, "1d"),
    (7 * 86400, "1w"),
)


def range_for(age_s: float) -> str:
    """The graph range that fits a demo ``age_s`` seconds old: ``1m`` for a fresh one."""
    for limit, name in RANGES:
        if age_s <= limit:
            return name
    return RANGES[-1][1]


class ShortLink:
    """Serves ``/`` as a redirect to ``target(range_input)``, the range fitted to the age."""

    def __init__(
        self,
        target: Callable[[str], str],
        *,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.clock = clock
        self.started = clock() if started is None else started
        self._runner: web.AppRunner | None = None
        self.bound: tuple[str, int] | None = None

    def location(self) -> str:
        return self.target(range_for(self.clock() - self.started))

    async def _redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(self.location())

    async def start(self, host: str, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/", self._redirect)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self.bound = (host, int(sock.getsockname()[1]))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    @property
    def url(self) -> str:
        assert self.bound is not None
        host, port = self.bound
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
