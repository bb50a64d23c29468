"""Every error status of the proxy: real targets over DirectOpener, and a failing registry."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest

from raven.config.gateway import TlsListener
from raven.transport.stream import OpenFailure
from tests.helpers import free_port, sample, wait_for
from tests.helpers.proxy import (
    FailingOpener,
    direct,
    raw_exchange,
    running_proxy,
)

pytestmark = pytest.mark.integration


async def _status(
    base: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(base + path, headers=headers or {}) as r:
        return r.status, r.reason or "", (await r.text())


async def test_error_statuses_from_direct_opener(target_port: int) -> None:
    dead = free_port()
    async with (
        running_proxy(direct(port_allowed=target_port)) as (_, reg, base),
        running_proxy(direct()) as (_, reg2, base2),
    ):
        cases = [
            (base, f"/proxy/no-such-node:{target_port}/metrics", 404, "unknown_node"),
            (base, f"/proxy/edge-gpu-1:{target_port + 1}/metrics", 403, "port_not_allowed"),
            (base, f"/proxy/127.0.0.1:{target_port}/metrics", 400, "ip_literal"),
            (base2, f"/proxy/edge-gpu-1:{dead}/metrics", 502, "target_refused"),
        ]
        for b, path, status, reason in cases:
            got_status, phrase, body = await _status(b, path)
            assert (got_status, body.split(":")[0]) == (status, reason), body
            assert body.endswith("\n") and body.count("\n") == 1
            assert phrase and phrase != "OK"
        got = await _status(
            base,
            f"/proxy/edge-gpu-1:{target_port}/slow?s=5",
            {"X-Prometheus-Scrape-Timeout-Seconds": "0.3"},
        )
        assert got[:2] == (504, "Scrape Timeout")
    assert sample(reg, "raven_proxy_errors_total", reason="unknown_node") == 1
    assert sample(reg, "raven_proxy_requests_total", mode="path", code="404") == 1
    assert sample(reg, "raven_proxy_errors_total", reason="scrape_timeout") == 1
    assert sample(reg2, "raven_proxy_errors_total", reason="target_refused") == 1


@pytest.mark.parametrize(
    ("reason", "status", "phrase"),
    [
        (OpenFailure.NO_AGENT, 503, "No Agent Connected"),
        (OpenFailure.BUSY, 503, "Gateway Busy"),
        (OpenFailure.DRAINING, 503, "Draining"),
        (OpenFailure.TARGET_UNREACHABLE, 502, "Target Unreachable"),
        (OpenFailure.TARGET_TIMEOUT, 504, "Target Timeout"),
    ],
)
async def test_error_statuses_from_registry(reason: OpenFailure, status: int, phrase: str) -> None:
    async with (
        running_proxy(FailingOpener(reason)) as (_, registry, base),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s,
    ):
        for _ in range(2):  # the connection stays usable after an error
            async with s.get(f"{base}/metrics", headers={"Host": "edge-gpu-3:9400"}) as r:
                assert (r.status, r.reason) == (status, phrase)
                assert (await r.text()).startswith(reason.value + ": ")
                assert r.headers["X-Raven-Error"] == reason.value
    assert sample(registry, "raven_proxy_errors_total", reason=reason.value) == 2
    assert sample(registry, "raven_proxy_requests_total", mode="dns", code=str(status)) == 2


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: a:1\r\nHost: b:1\r\n\r\n", 400),
        (
            b"POST / HTTP/1.1\r\nHost: a:1\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GET /m HTTP/1.1\r\nHost: 10.1.1.1:9100\r\nConnection: close\r\n\r\n", 400),
    ],
)
async def test_bad_requests(data: bytes, status: int) -> None:
    async with running_proxy(direct()) as (proxy, _, _):
        out = await raw_exchange(proxy.http_address, data)
    assert out.startswith(b"HTTP/1.1 %d " % status)
    assert b"Connection: close" in out or status == 400


async def test_slowloris_closed_after_header_timeout() -> None:
    # The head trickles in for 3 s; the proxy must answer 408 at its 0.4 s header timeout,
    # while the client still has header lines to send (which timer fired is what is checked,
    # not how fast: a loaded machine only makes the client send fewer lines first).
    lines_total = 30
    async with running_proxy(direct(), header_timeout_s=0.4) as (proxy, registry, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            writer.write(b"GET / HTTP/1.1\r\n")
            for _ in range(lines_total):
                await asyncio.sleep(0.1)
                writer.write(b"X-A: b\r\n")
                sent += 1

        sender = asyncio.create_task(trickle())
        try:
            out = await asyncio.wait_for(reader.read(-1), 30)
            sent_when_closed = sent
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            writer.close()
        silent = await raw_exchange(proxy.http_address, b"")
    assert sent_when_closed < lines_total, "closed only when the client had finished its head"
    assert out.startswith(b"HTTP/1.1 408 ")
    # a connection that never sent a byte is closed at the same bound, with a FIN and no 408
    # (a client picking its spare pooled connection would take the 408 as its answer)
    assert silent == b""
    assert sample(registry, "raven_proxy_errors_total", reason="header_timeout") == 1
    assert sample(registry, "raven_proxy_unused_connections_closed_total") == 1


async def test_idle_keep_alive_connection_closed() -> None:
    async with running_proxy(direct(), idle_timeout_s=0.2) as (proxy, _, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        writer.write(b"GET /proxy/nope:1/ HTTP/1.1\r\n\r\n")
        out = await asyncio.wait_for(reader.read(-1), 2)
        writer.close()
    assert out.startswith(b"HTTP/1.1 404 ")


async def test_busy_when_max_connections_reached(target_port: int) -> None:
    async with running_proxy(direct(), max_connections=1, header_timeout_s=0.3) as (
        proxy,
        registry,
        _,
    ):
        holder_r, holder_w = await asyncio.open_connection(*proxy.http_address)
        holder_w.write(b"GET /proxy/edge-gpu-1:%d/slow?s=1 HTTP/1.1\r\n\r\n" % target_port)
        await wait_for(lambda: len(proxy.connections) == 1, "the holder served")
        out = await raw_exchange(proxy.http_address, b"")
        assert out.startswith(b"HTTP/1.1 503 Gateway Busy")
        first = await asyncio.wait_for(holder_r.readuntil(b"late\n"), 3)
        holder_w.close()
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert sample(registry, "raven_proxy_errors_total", reason="busy") == 1


async def test_tls_listener_config_keeps_http_listener_working(target_port: int) -> None:
    listeners = [TlsListener(listen="127.0.0.1:0", target_port=10250)]
    async with running_proxy(direct(), tls_listeners=listeners) as (proxy, _, base):
        assert len(proxy.tls_addresses) == 1 and proxy.tls_addresses[0][1] > 0
        status, _, _ = await _status(base, f"/proxy/edge-gpu-1:{target_port}/metrics")
        assert status == 200


async def _send(
    addr: tuple[str, int], path: str, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*addr, local_addr=(source, 0))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return reader, writer


async def test_per_client_and_per_node_limits_answer_429_and_503(target_port: int) -> None:
    """No client and no node can take all of a tunnel's streams: beyond the in-flight
    limits the answer is 429 (this client) or 503 (this node), both with Retry-After."""
    slow = f"/proxy/edge-gpu-1:{target_port}/slow?s=2"
    async with running_proxy(direct(), max_requests_per_client=2, max_streams_per_node=3) as (
        proxy,
        registry,
        _,
    ):
        held = [await _send(proxy.http_address, slow) for _ in range(2)]
        held.append(await _send(proxy.http_address, slow, source="127.0.0.2"))
        await wait_for(lambda: sum(proxy.context.by_node.values()) == 3)
        request = f"GET {slow} HTTP/1.0\r\n\r\n".encode()
        over_client = await raw_exchange(proxy.http_address, request)
        assert over_client.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        assert b"\r\nRetry-After: 1\r\n" in over_client
        reader, writer = await _send(proxy.http_address, slow, source="127.0.0.3")
        over_node = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert over_node.startswith(b"HTTP/1.1 503 Node Busy\r\n")
        assert b"\r\nRetry-After: 1\r\n" in over_node
        assert (await reader.readline()).startswith(b"node_limit: ")
        # the same connection goes on to another node: served
        writer.write(b"GET /proxy/edge-gpu-2:%d/metrics HTTP/1.1\r\nHost: x\r\n\r\n" % target_port)
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
        for r, w in held:
            assert (await asyncio.wait_for(r.readline(), 5)).startswith(b"HTTP/1.1 200")
            w.close()
    assert sample(registry, "raven_proxy_errors_total", reason="client_limit") == 1
    assert sample(registry, "raven_proxy_errors_total", reason="node_limit") == 1


async def test_scrape_timeout_is_capped_by_max_timeout(target_port: int) -> None:
    async with running_proxy(direct(), max_timeout_s=0.3, default_timeout_s=0.3) as (_, _reg, base):
        got = await _status(
            base,
            f"/proxy/edge-gpu-1:{target_port}/slow?s=5",
            {"X-Prometheus-Scrape-Timeout-Seconds": "3600"},
        )
    assert got[:2] == (504, "Scrape Timeout")


async def test_clients_outside_the_allow_list_are_closed_at_accept(target_port: int) -> None:
    path = f"/proxy/edge-gpu-1:{target_port}/metrics"
    async with running_proxy(direct(), allowed_clients=["127.0.0.2/32"]) as (proxy, reg, _):
        reader, writer = await _send(proxy.http_address, path, source="127.0.0.1")
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 5) == b""  # no answer at all
        writer.close()
        reader, writer = await _send(proxy.http_address, path, source="127.0.0.2")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
    assert sample(reg, "raven_proxy_errors_total", reason="client_not_allowed") == 1


async def test_a_client_retrying_at_once_is_reset_at_accept_for_its_penalty(
    target_port: int,
) -> None:
    """Past max_refusals_per_client_per_s 429s within a second, the client's next connection
    is reset at accept with no answer; other clients are served as before."""
    slow = f"/proxy/edge-gpu-1:{target_port}/slow?s=2"
    async with running_proxy(
        direct(), max_requests_per_client=1, max_refusals_per_client_per_s=3, refusal_penalty_s=60
    ) as (proxy, registry, _):
        proxy.context.clock = lambda: 1000.0  # every refusal falls in the same second
        held = await _send(proxy.http_address, slow)
        await wait_for(lambda: sum(proxy.context.by_client.values()) == 1)
        request = f"GET {slow} HTTP/1.0\r\n\r\n".encode()
        for _ in range(4):
            out = await raw_exchange(proxy.http_address, request)
            assert out.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        reader, writer = await _send(proxy.http_address, slow)
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 5) == b""  # reset, no answer
        writer.close()
        path = f"/proxy/edge-gpu-2:{target_port}/metrics"
        reader, writer = await _send(proxy.http_address, path, source="127.0.0.2")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
        held[1].close()
    assert sample(registry, "raven_proxy_errors_total", reason="client_limit") == 4
    assert sample(registry, "raven_proxy_errors_total", reason="client_penalised") == 1


async def test_a_client_retrying_in_a_loop_gets_every_refusal_counted_but_few_log_lines(
    target_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A hostile client that retries a refused request at once (ignoring Retry-After)
    made the gateway write one log line per refusal (22,000 in 30 s in bench_soak). Each
    refusal is still answered and counted; the log gets a burst per reason, then a line
    saying how many were left out."""
    caplog.set_level(logging.INFO, logger="cloud_gateway.proxy")
    slow = f"/proxy/edge-gpu-1:{target_port}/slow?s=2"
    async with running_proxy(
        direct(), max_requests_per_client=1, max_refusals_per_client_per_s=0
    ) as (proxy, registry, _):
        held = await _send(proxy.http_address, slow)
        await wait_for(lambda: sum(proxy.context.by_client.values()) == 1)
        request = f"GET {slow} HTTP/1.0\r\n\r\n".encode()
        for _ in range(50):
            out = await raw_exchange(proxy.http_address, request)
            assert out.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        held[1].close()
    assert sample(registry, "raven_proxy_errors_total", reason="client_limit") == 50
    lines = [r for r in caplog.records if r.name == "cloud_gateway.proxy"]
    refusals = [r for r in lines if r.getMessage() == "proxy error"]
    assert 1 <= len(refusals) <= 10  # LogThrottle's default burst
