"""The real ProxyServer over DirectOpener against real aiohttp targets on 127.0.0.1.

Covers the HTTP modes (DNS, forward-proxy, path), keep-alive, gzip passthrough, response framings,
streaming with bounded memory, targets dying mid-body, every error status and the slowloris bound.
"""

from __future__ import annotations

import asyncio
import tracemalloc

import aiohttp
import pytest

from raven.transport.reset import abort_with_rst
from tests.helpers import sample
from tests.helpers.proxy import (
    GZIPPED,
    MB,
    METRICS,
    direct,
    raw_exchange,
    raw_target,
    running_proxy,
)

pytestmark = pytest.mark.integration

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


async def test_http10_close_delimited_response_cut_short_ends_with_rst() -> None:
    """An HTTP/1.0 client of a close-delimited response has only the connection's end to
    tell a whole body from a cut one: when the target dies mid-body the proxy resets the
    client connection (RST), never closes it cleanly (FIN)."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + METRICS[:40])
        await w.drain()
        await asyncio.sleep(0.05)
        abort_with_rst(w.transport)  # the target dies

    async with raw_target(handler) as port, running_proxy(direct()) as (proxy, registry, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        writer.write(b"GET /proxy/edge-gpu-1:%d/ HTTP/1.0\r\n\r\n" % port)
        received = b""
        with pytest.raises(ConnectionResetError):
            async with asyncio.timeout(5):
                while data := await reader.read(65536):
                    received += data
        writer.close()
    assert received.startswith(b"HTTP/1.1 200 OK") and METRICS[:40] in received
    assert sample(registry, "raven_proxy_errors_total", reason="incomplete_response") == 1
