"""The L7 proxy on loopback: real aiohttp targets, a hand-written HTTP target for framings
aiohttp will not produce, a running ProxyServer, DirectOpener and an opener that always fails."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from cloud_gateway.proxy import ProxyServer
from raven.config.gateway import ProxyConfig
from raven.transport.direct import DirectOpener
from raven.transport.stream import ByteStream, OpenFailure, StreamOpenError

METRICS = b"".join(b'gpu_util{gpu="%d"} %d\n' % (i, i) for i in range(2000))
GZIPPED = gzip.compress(METRICS, mtime=0)
MB = 1 << 20


# --------------------------------------------------------------------------- targets


def target_app() -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=METRICS, content_type="text/plain")

    async def gz(request: web.Request) -> web.Response:
        assert request.headers.get("Accept-Encoding") == "gzip"
        resp = web.Response(body=GZIPPED, content_type="text/plain")
        resp.headers["Content-Encoding"] = "gzip"
        return resp

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(50):
            await resp.write(b"line %d\n" % i)
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.StreamResponse:
        size = int(request.query["mb"]) * MB
        resp = web.StreamResponse()
        resp.content_length = size
        await resp.prepare(request)
        block = b"x" * MB
        for _ in range(size // MB):
            await resp.write(block)
        return resp

    async def die(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        if request.query.get("chunked"):
            resp.enable_chunked_encoding()
        else:
            resp.content_length = 1_000_000
        await resp.prepare(request)
        await resp.write(b"y" * 100_000)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "5")))
        return web.Response(text="late\n")

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(body=body, headers={"X-Host": request.headers.get("Host", "")})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/gzip", gz)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/big", big)
    app.router.add_get("/die", die)
    app.router.add_get("/slow", slow)
    app.router.add_route("*", "/echo", echo)
    return app


@asynccontextmanager
async def serve_app(app: web.Application, **kw: Any) -> AsyncIterator[int]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, **kw)
    await site.start()
    server = cast(asyncio.Server, site._server)  # uvloop's Server is no subclass
    assert server is not None and server.sockets
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        await runner.cleanup()


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_target(handler: RawHandler) -> AsyncIterator[int]:
    """A hand-written HTTP server for framings aiohttp will not produce."""

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            await handler(r, w)
        finally:
            w.close()

    server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def target_port() -> AsyncIterator[int]:
    async with serve_app(target_app()) as port:
        yield port


# --------------------------------------------------------------------------- proxy


def proxy_config(**kw: Any) -> ProxyConfig:
    kw.setdefault("http_listen", "127.0.0.1:0")
    kw.setdefault("tls_listeners", [])
    return ProxyConfig(**kw)


@asynccontextmanager
async def running_proxy(
    opener: Any, **kw: Any
) -> AsyncIterator[tuple[ProxyServer, CollectorRegistry, str]]:
    registry = CollectorRegistry()
    proxy = ProxyServer(opener, proxy_config(**kw), registry)
    await proxy.start()
    host, port = proxy.http_address
    try:
        yield proxy, registry, f"http://{host}:{port}"
    finally:
        await proxy.stop(grace_s=1.0)


def direct(port_allowed: int | None = None) -> DirectOpener:
    ports = None if port_allowed is None else [port_allowed]
    return DirectOpener({"edge-gpu-1": "127.0.0.1", "edge-gpu-2": "localhost"}, ports)


class FailingOpener:
    """An opener whose every open fails with one reason (what a registry reports)."""

    def __init__(self, reason: OpenFailure) -> None:
        self.reason = reason

    async def open_stream(
        self, node: str, port: int, *, timeout_s: float, data: bytes = b""
    ) -> ByteStream:
        raise StreamOpenError(self.reason, f"{node}: simulated")


async def raw_exchange(addr: tuple[str, int], data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; everything received until the proxy closes."""
    reader, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(data)
        async with asyncio.timeout(timeout):
            return await reader.read(-1)
    finally:
        writer.close()
