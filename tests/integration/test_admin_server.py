"""The shared admin server over loopback HTTP: routes, gzip, readiness, stop."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge

from raven.admin import AdminRequest, AdminResponse, AdminServer
from raven.admin.asyncio_backend import MAX_HEAD_BYTES, AsyncioBackend
from raven.admin.server import AdminBackend


def make_backend(name: str) -> AdminBackend | None:
    return AsyncioBackend() if name == "asyncio" else None  # None: the default (aiohttp)


@pytest.mark.parametrize("backend", ["aiohttp", "asyncio"])
async def test_admin_server_serves_routes_gzip_and_readiness(backend: str) -> None:
    registry = CollectorRegistry()
    Gauge("raven_example_value", "An example.", registry=registry).set(7)
    ready = {"ok": False}
    admin = AdminServer(
        "127.0.0.1:0", registry, lambda: (ready["ok"], "warming up"), backend=make_backend(backend)
    )
    admin.add_route("/api/v1/echo", lambda r: AdminResponse.json(dict(r.query)))
    await admin.start()
    assert admin.bound is not None and admin.bound[1] != 0
    url = f"http://127.0.0.1:{admin.bound[1]}"
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.get(url + "/metrics", headers={"Accept-Encoding": "gzip"}) as r:
                assert r.status == 200 and r.headers["Content-Encoding"] == "gzip"
                assert b"raven_example_value 7.0" in gzip.decompress(await r.read())
            async with http.get(url + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
                assert "Content-Encoding" not in r.headers
                assert r.headers["Content-Type"].startswith("text/plain; version=")
            async with http.get(url + "/readyz") as r:
                assert (r.status, await r.text()) == (503, "not ready: warming up\n")
            ready["ok"] = True
            async with http.get(url + "/readyz") as r:
                assert r.status == 200
            async with http.get(url + "/api/v1/echo?port=9100&port=1") as r:
                assert await r.json() == {"port": "9100"}
            async with http.post(url + "/healthz") as r:
                assert r.status == 405
            async with http.get(url + "/missing") as r:
                assert r.status == 404
    finally:
        await admin.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(url + "/healthz"):
            pass


async def test_a_taken_port_fails_start_and_leaves_nothing_open() -> None:
    first = AdminServer("127.0.0.1:0", CollectorRegistry())
    await first.start()
    assert first.bound is not None
    second = AdminServer(f"127.0.0.1:{first.bound[1]}", CollectorRegistry())
    try:
        with pytest.raises(OSError):
            await second.start()
        assert second.bound is None
    finally:
        await first.stop()
        await second.stop()


def test_request_headers_are_case_insensitive_by_lower_case_names() -> None:
    request = AdminRequest("GET", "/metrics", {}, {"accept-encoding": "br, gzip"})
    assert request.header("Accept-Encoding") == "br, gzip" and request.accepts_gzip()


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()  # the server sees the end of the request bytes
        return await reader.read(-1)
    finally:
        writer.close()


async def test_asyncio_backend_keep_alive_and_refusals() -> None:
    admin = AdminServer("127.0.0.1:0", CollectorRegistry(), backend=AsyncioBackend())
    await admin.start()
    assert admin.bound is not None
    port = admin.bound[1]
    try:
        two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + (
            b"HEAD /healthz?a=%20 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = await _raw(port, two)
        first, _, second = answer.partition(b"HTTP/1.1 200 OK\r\n")[2].partition(b"HTTP/1.1 ")
        assert second.startswith(b"200 OK\r\n") and b"Connection: close" in second
        assert second.endswith(b"\r\n\r\n")  # HEAD: no body
        assert b"Connection: close" not in first
        refused = {
            b"GARBAGE\r\n\r\n": b"HTTP/1.1 400 ",
            b"GET /x HTTP/2.0\r\n\r\n": b"HTTP/1.1 400 ",
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello": b"HTTP/1.1 413 ",
            b"GET /x HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n": b"HTTP/1.1 431 ",
        }
        for request, status in refused.items():
            assert (await _raw(port, request)).startswith(status)
        assert await _raw(port, b"GET /healthz HTTP/1.1\r\n") == b""  # EOF mid-head: closed
    finally:
        await admin.stop()
