"""The real ProxyServer over DirectOpener against real aiohttp targets on 127.0.0.1.

Covers the HTTP modes (DNS, forward-proxy, path), keep-alive, gzip passthrough, response framings,
streaming with bounded memory, targets dying mid-body, every error status and the slowloris bound.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from cloud_gateway.proxy import ProxyServer
from raven.config.gateway import ProxyConfig
from raven.transport.direct import DirectOpener
from raven.transport.stream import ByteStream, OpenFailure, StreamOpenError
from tests.helpers import sample

pytestmark = pytest.mark.integration

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

    async def open_stream(self, node: str, port: int, *, timeout_s: float) -> ByteStream:
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


# --------------------------------------------------------------------------- modes


async def test_all_http_modes_and_metrics(target_port: int) -> None:
    async with running_proxy(direct()) as (_proxy, registry, base), aiohttp.ClientSession() as s:
        host = f"edge-gpu-1:{target_port}"
        async with s.get(f"{base}/metrics", headers={"Host": host}) as r:
            assert r.status == 200 and await r.read() == METRICS
        async with s.get(f"http://{host}/metrics", proxy=base) as r:
            assert r.status == 200 and await r.read() == METRICS
        async with s.get(f"{base}/proxy/{host}/metrics") as r:
            assert r.status == 200 and await r.read() == METRICS
        async with s.post(f"{base}/proxy/edge-gpu-2:{target_port}/echo", data=b"ping") as r:
            assert await r.read() == b"ping"
            assert r.headers["X-Host"] == f"edge-gpu-2:{target_port}"
    for mode in ("dns", "forward", "path"):
        assert sample(registry, "raven_proxy_requests_total", mode=mode, code="200") >= 1
    assert sample(registry, "raven_proxy_request_duration_seconds_count", node="edge-gpu-1") == 3
    assert sample(registry, "raven_proxy_response_bytes_total") > 3 * len(METRICS)
    assert sample(registry, "raven_proxy_active_connections") == 0


async def test_keep_alive_many_scrapes_one_connection(target_port: int) -> None:
    created: list[object] = []
    trace = aiohttp.TraceConfig()

    async def on_create(*args: object) -> None:
        created.append(args)

    trace.on_connection_create_end.append(on_create)
    connector = aiohttp.TCPConnector(limit=1)
    async with (
        running_proxy(direct()) as (_, registry, base),
        aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as s,
    ):
        for _ in range(50):
            async with s.get(
                f"{base}/metrics",
                headers={"Host": f"edge-gpu-1:{target_port}", "Accept-Encoding": "gzip"},
            ) as r:
                assert r.status == 200 and await r.read() == METRICS
    assert len(created) == 1
    assert sample(registry, "raven_proxy_requests_total", mode="dns", code="200") == 50


async def test_pipelined_requests_and_chunked_request_body(target_port: int) -> None:
    async with running_proxy(direct()) as (proxy, _, _base):
        host = f"edge-gpu-1:{target_port}".encode()
        data = (
            b"POST /echo HTTP/1.1\r\nHost: " + host + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"GET /metrics HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n"
        )
        out = await raw_exchange(proxy.http_address, data)
    assert out.count(b"HTTP/1.1 200 OK") == 2
    assert b"\r\n\r\nabcde" in out and out.endswith(METRICS)


async def test_gzip_passes_untouched(target_port: int) -> None:
    async with (
        running_proxy(direct()) as (_, _, base),
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.get(
            f"{base}/proxy/edge-gpu-1:{target_port}/gzip", headers={"Accept-Encoding": "gzip"}
        ) as r,
    ):
        assert r.headers["Content-Encoding"] == "gzip"
        assert int(r.headers["Content-Length"]) == len(GZIPPED)
        assert await r.read() == GZIPPED


async def test_chunked_response_passes_chunked(target_port: int) -> None:
    async with running_proxy(direct()) as (proxy, _, _):
        req = (
            b"GET /proxy/edge-gpu-1:%d/chunked HTTP/1.1\r\nConnection: close\r\n\r\n" % target_port
        )
        out = await raw_exchange(proxy.http_address, req)
    assert b"Transfer-Encoding: chunked" in out
    assert out.endswith(b"0\r\n\r\n") and b"line 49\n" in out


async def test_close_delimited_response_is_rechunked_and_keeps_connection() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + METRICS)
        await w.drain()

    async with raw_target(handler) as port, running_proxy(direct()) as (_, _, base):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            for _ in range(3):
                async with s.get(f"{base}/proxy/edge-gpu-1:{port}/") as r:
                    assert r.headers["Transfer-Encoding"] == "chunked"
                    assert await r.read() == METRICS
        async with running_proxy(direct()) as (proxy, _, _):
            out = await raw_exchange(
                proxy.http_address, b"GET /proxy/edge-gpu-1:%d/ HTTP/1.0\r\n\r\n" % port
            )
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(METRICS)
    assert b"Connection: close" in out and b"chunked" not in out


async def test_interim_100_continue_from_target_is_dropped() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()

    async with raw_target(handler) as port, running_proxy(direct()) as (proxy, _, _):
        out = await raw_exchange(
            proxy.http_address,
            b"GET /proxy/edge-gpu-1:%d/ HTTP/1.1\r\nConnection: close\r\n\r\n" % port,
        )
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\nok")


async def test_50_mb_streams_with_bounded_memory(target_port: int) -> None:
    async with running_proxy(direct()) as (_, _, base), aiohttp.ClientSession() as s:
        tracemalloc.start()
        try:
            total = 0
            async with s.get(f"{base}/proxy/edge-gpu-1:{target_port}/big?mb=50") as r:
                assert r.status == 200
                async for piece in r.content.iter_chunked(MB):
                    total += len(piece)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert total == 50 * MB
    assert peak < 12 * MB, f"peak {peak / MB:.1f} MiB while streaming 50 MiB"


@pytest.mark.parametrize("chunked", [False, True])
async def test_target_killed_mid_body_is_visibly_incomplete(
    target_port: int, chunked: bool
) -> None:
    query = "?chunked=1" if chunked else ""
    async with (
        running_proxy(direct()) as (_, registry, base),
        aiohttp.ClientSession() as s,
        s.get(f"{base}/proxy/edge-gpu-1:{target_port}/die{query}") as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    assert sample(registry, "raven_proxy_errors_total", reason="incomplete_response") == 1


async def test_concurrent_requests_on_different_connections(target_port: int) -> None:
    async with (
        running_proxy(direct()) as (_, registry, base),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32, force_close=True)) as s,
    ):

        async def one(i: int) -> bytes:
            node = "edge-gpu-1" if i % 2 else "edge-gpu-2"
            async with s.get(f"{base}/proxy/{node}:{target_port}/metrics") as r:
                return await r.read()

        bodies = await asyncio.gather(*(one(i) for i in range(64)))
    assert all(b == METRICS for b in bodies)
    assert sample(registry, "raven_proxy_requests_total", mode="path", code="200") == 64


async def test_expect_100_continue_answered_by_the_proxy(target_port: int) -> None:
    async with running_proxy(direct()) as (proxy, _, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        writer.write(
            b"PUT /proxy/edge-gpu-1:%d/echo HTTP/1.1\r\nContent-Length: 5\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n" % target_port
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        out = await asyncio.wait_for(reader.read(-1), 3)
        writer.close()
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\nhello")


async def test_client_gone_mid_response_resets_the_target_stream(target_port: int) -> None:
    async with running_proxy(direct()) as (proxy, registry, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        writer.write(b"GET /proxy/edge-gpu-1:%d/big?mb=20 HTTP/1.1\r\n\r\n" % target_port)
        await reader.readexactly(1000)
        writer.transport.abort()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if sample(registry, "raven_proxy_errors_total", reason="client_gone"):
                break
    assert sample(registry, "raven_proxy_errors_total", reason="client_gone") == 1
    assert sample(registry, "raven_proxy_active_connections") == 0
