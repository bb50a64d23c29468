"""The floor of a Python L7 hop: a TCP byte relay on uvloop that does nothing else.

One process listens; each client connection gets its own upstream connection to ``--to``,
kept as long as the client keeps its own (what nginx with upstream keep-alive and Raven's
agent do), and bytes go both ways by protocol callbacks: no HTTP parsing, no routing, no
tunnel, no cipher, no metrics. Back-pressure is the transports' own (reading pauses while
the other side's write buffer is over its mark). bench_l7.py's ``floor`` path chains two of
them (wrk -> relay -> relay -> target), the process topology of gateway -> agent -> target:
what two Python processes on this machine cost before Raven does any of its work.

Usage: python bench/l7_floor_relay.py LISTEN_PORT TO_PORT
"""

from __future__ import annotations

import asyncio
import sys


class _Side(asyncio.Protocol):
    """One socket of a pair; what it reads goes to its peer's transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []
        self.connecting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)  # the upstream is still connecting
            return
        peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # the peer's write buffer is over its mark: stop reading this side until it drains
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def serve(listen_port: int, to_port: int) -> None:
    loop = asyncio.get_running_loop()

    def client() -> _Side:
        side = _Side()
        side.connecting = loop.create_task(_connect(side))
        return side

    async def _connect(down: _Side) -> None:
        _, up = await loop.create_connection(_Side, "127.0.0.1", to_port)
        up.peer, down.peer = down, up
        for data in down.early:
            assert up.transport is not None
            up.transport.write(data)
        down.early.clear()

    server = await loop.create_server(client, "127.0.0.1", listen_port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
