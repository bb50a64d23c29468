"""The shared admin server over loopback HTTP: routes, gzip, readiness, stop."""

from __future__ import annotations

import gzip

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge

from raven.admin import AdminRequest, AdminResponse, AdminServer

pytestmark = pytest.mark.usefixtures("no_leaked_tasks")


async def test_admin_server_serves_routes_gzip_and_readiness() -> None:
    registry = CollectorRegistry()
    Gauge("raven_example_value", "An example.", registry=registry).set(7)
    ready = {"ok": False}
    admin = AdminServer("127.0.0.1:0", registry, lambda: (ready["ok"], "warming up"))
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
