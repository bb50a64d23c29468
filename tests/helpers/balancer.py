"""A TCP load balancer for tests and benchmarks: each new connection to it goes to a random one
of its backends, as kube-proxy's DNAT or a cloud load balancer spreads them; bytes are relayed
both ways until either side closes."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field


async def relay(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Copy ``r`` to ``w`` until EOF or an error, then close ``w``."""
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        w.close()


@dataclass
class RandomBalancer:
    """``backends`` (host, port) may change while it runs; ``connections`` counts the dials."""

    backends: list[tuple[str, int]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    server: asyncio.Server | None = None
    connections: int = 0

    async def start(self, host: str = "127.0.0.1") -> int:
        self.server = await asyncio.start_server(self._handle, host, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        self.connections += 1
        if not self.backends:
            w1.close()
            return
        try:
            r2, w2 = await asyncio.open_connection(*self.rng.choice(self.backends))
        except OSError:
            w1.close()
            return
        try:
            await asyncio.gather(relay(r1, w2), relay(r2, w1))
        except asyncio.CancelledError:  # the balancer is going away
            w1.close()
            w2.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
