"""CONNECT and the SNI passthrough listener (TLS end to end), drain, and DirectOpener itself."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.proxy import ProxyServer
from raven.config.gateway import TlsListener
from raven.protocol.codes import StreamCode
from raven.transport.direct import DirectOpener
from raven.transport.stream import OpenFailure, StreamOpenError, StreamResetError
from tests.helpers import free_port, sample, wait_for
from tests.helpers.certs import self_signed
from tests.helpers.proxy import (
    METRICS,
    direct,
    proxy_config,
    raw_exchange,
    running_proxy,
    serve_app,
    target_app,
)

pytestmark = pytest.mark.integration


def _self_signed(tmp: Path) -> tuple[ssl.SSLContext, Path]:
    """The target's TLS context for edge-gpu-1, and the CA file a client trusts it with."""
    cert_file, key_file = self_signed(tmp, "edge-gpu-1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, cert_file


@pytest.fixture
async def https_target(tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    server_ctx, ca_file = _self_signed(tmp_path)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    async with serve_app(target_app(), ssl_context=server_ctx) as port:
        yield port, client_ctx


async def test_connect_keeps_tls_end_to_end(https_target: tuple[int, ssl.SSLContext]) -> None:
    port, client_ctx = https_target
    async with running_proxy(direct()) as (_, registry, base), aiohttp.ClientSession() as s:
        for _ in range(3):  # the certificate verifies: the target, not the gateway, speaks TLS
            async with s.get(f"https://edge-gpu-1:{port}/metrics", proxy=base, ssl=client_ctx) as r:
                assert r.status == 200 and await r.read() == METRICS
    assert sample(registry, "raven_proxy_requests_total", mode="connect", code="200") >= 1


async def test_connect_errors(https_target: tuple[int, ssl.SSLContext]) -> None:
    port, _ = https_target
    async with running_proxy(direct()) as (proxy, registry, _):
        out = await raw_exchange(proxy.http_address, b"CONNECT nope:%d HTTP/1.1\r\n\r\n" % port)
        assert out.startswith(b"HTTP/1.1 404 Unknown Node")
        out = await raw_exchange(
            proxy.http_address, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port
        )
        assert out.startswith(b"HTTP/1.1 400 IP Literal Not Allowed")
    assert sample(registry, "raven_proxy_requests_total", mode="connect", code="404") == 1


async def test_sni_listener_routes_by_server_name(
    https_target: tuple[int, ssl.SSLContext],
) -> None:
    port, client_ctx = https_target
    listeners = [TlsListener(listen="127.0.0.1:0", target_port=port)]
    async with running_proxy(direct(), tls_listeners=listeners) as (proxy, registry, _):
        addr = proxy.tls_addresses[0]
        reader, writer = await asyncio.open_connection(
            *addr, ssl=client_ctx, server_hostname="edge-gpu-1"
        )
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: edge-gpu-1\r\nConnection: close\r\n\r\n")
        out = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(METRICS)
        # A name that is no node: a TLS alert, never a connection somewhere else.
        with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
            await asyncio.open_connection(*addr, ssl=client_ctx, server_hostname="other-node")
        garbage = await raw_exchange(addr, b"GET / HTTP/1.1\r\n\r\n")
        assert garbage == b"\x15\x03\x03\x00\x02\x02\x28"
    assert sample(registry, "raven_proxy_requests_total", mode="tls", code="200") == 1
    assert sample(registry, "raven_proxy_errors_total", reason="unknown_node") == 1
    assert sample(registry, "raven_proxy_errors_total", reason="bad_client_hello") == 1


async def test_stop_lets_in_flight_finish_and_closes_idle() -> None:
    async with serve_app(target_app()) as port:
        proxy = ProxyServer(direct(), proxy_config(), CollectorRegistry())
        await proxy.start()
        addr = proxy.http_address
        writers: list[asyncio.StreamWriter] = []
        try:
            idle_r, idle_w = await asyncio.open_connection(*addr)
            fresh_r, fresh_w = await asyncio.open_connection(*addr)  # never sends anything
            busy_r, busy_w = await asyncio.open_connection(*addr)
            writers += [idle_w, fresh_w, busy_w]
            idle_w.write(b"GET /proxy/nope:1/ HTTP/1.1\r\n\r\n")  # idle after one request
            assert (await idle_r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 404")
            assert (await idle_r.readline()).startswith(b"unknown_node")
            busy_w.write(b"GET /proxy/edge-gpu-1:%d/slow?s=0.3 HTTP/1.1\r\n\r\n" % port)
            await wait_for(  # in flight before the stop, or it is one more idle connection
                lambda: any(c.task is not None for c in proxy.connections), "the request in flight"
            )
            await proxy.stop(grace_s=3)
            answer = await asyncio.wait_for(busy_r.read(-1), 2)
            assert answer.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in answer
            assert await asyncio.wait_for(idle_r.read(-1), 2) == b""
            assert await asyncio.wait_for(fresh_r.read(-1), 2) == b""
            with pytest.raises(OSError):
                await asyncio.open_connection(*addr)
        finally:
            for w in writers:
                w.close()
            await proxy.stop(grace_s=0.5)


async def test_stop_cancels_after_grace() -> None:
    async with serve_app(target_app()) as port:
        proxy = ProxyServer(direct(), proxy_config(), CollectorRegistry())
        await proxy.start()
        _reader, writer = await asyncio.open_connection(*proxy.http_address)
        writer.write(b"GET /proxy/edge-gpu-1:%d/slow?s=10 HTTP/1.1\r\n\r\n" % port)
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await proxy.stop(grace_s=0.2)
        # the grace period ended the 10 s request (a wide margin: which bound applied, not speed)
        assert loop.time() - start < 5.0
        writer.close()


# --------------------------------------------------------------------------- DirectOpener


async def test_direct_opener_failures() -> None:
    opener = DirectOpener({"edge-1": "127.0.0.1", "edge-x": "no-such-host.invalid"}, [1, 2, 9])
    cases = [
        ("nope", 1, OpenFailure.UNKNOWN_NODE),
        ("edge-1", 5, OpenFailure.PORT_NOT_ALLOWED),
        ("edge-x", 9, OpenFailure.TARGET_UNREACHABLE),
    ]
    for node, port, reason in cases:
        with pytest.raises(StreamOpenError) as info:
            await opener.open_stream(node, port, timeout_s=2)
        assert info.value.reason is reason
    dead = free_port()
    with pytest.raises(StreamOpenError) as info:
        await DirectOpener({"edge-1": "127.0.0.1"}).open_stream("EDGE-1", dead, timeout_s=2)
    assert info.value.reason is OpenFailure.TARGET_REFUSED


async def test_direct_opener_connect_timeout() -> None:
    # A listener that never accepts, its backlog full: further SYNs go unanswered.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    fillers: list[socket.socket] = []
    opener = DirectOpener({"edge-1": "127.0.0.1"}, connect_timeout_s=0.3)
    try:
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(StreamOpenError) as info:
            await opener.open_stream("edge-1", port, timeout_s=30)
        assert info.value.reason is OpenFailure.TARGET_TIMEOUT
        # the 0.3 s connect timeout applied, not the 30 s request deadline (a wide margin)
        assert loop.time() - start < 15.0
    finally:
        for c in fillers:
            c.close()
        sock.close()


async def test_direct_stream_round_trip_half_close_and_reset() -> None:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            data = await r.read(-1)  # until our write_eof
        except ConnectionResetError:  # the reset stream: an RST, as the agent cuts a target
            w.close()
            return
        w.write(data.upper())
        await w.drain()
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    opener = DirectOpener({"edge-1": "127.0.0.1"})
    try:
        stream = await opener.open_stream("edge-1", port, timeout_s=2)
        await stream.write(b"hello ")
        await stream.write(b"edge")
        await stream.write_eof()
        got = b""
        while piece := await stream.read(3):
            assert len(piece) <= 3
            got += piece
        assert got == b"HELLO EDGE"
        await stream.aclose()
        stream = await opener.open_stream("edge-1", port, timeout_s=2)
        stream.reset(StreamCode.CANCELLED, "test")
        with pytest.raises(StreamResetError):
            await stream.read()
        with pytest.raises(StreamResetError):
            await stream.write(b"x")
        await stream.aclose()
    finally:
        server.close()
        await server.wait_closed()


async def test_sni_listener_slow_client_hello_closed() -> None:
    listeners = [TlsListener(listen="127.0.0.1:0", target_port=10250)]
    async with running_proxy(direct(), tls_listeners=listeners, header_timeout_s=0.3) as (
        proxy,
        registry,
        _,
    ):
        reader, writer = await asyncio.open_connection(*proxy.tls_addresses[0])
        writer.write(b"\x16\x03\x01")  # a ClientHello that never completes
        out = await asyncio.wait_for(reader.read(-1), 2)
        writer.close()
    assert out == b""
    assert sample(registry, "raven_proxy_errors_total", reason="header_timeout") == 1


def test_proxy_and_direct_opener_on_uvloop() -> None:
    """Production runs on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> tuple[int, bytes, bytes]:
        async with (
            serve_app(target_app()) as port,
            running_proxy(direct()) as (_, _, base),
            aiohttp.ClientSession() as s,
        ):
            async with s.get(f"{base}/proxy/edge-gpu-1:{port}/metrics") as r:
                body = await r.read()
            async with s.get(f"{base}/proxy/edge-gpu-1:{port}/chunked") as r:
                chunked = await r.read()
            return r.status, body, chunked

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        status, body, chunked = runner.run(scenario())
    assert status == 200 and body == METRICS and chunked.endswith(b"line 49\n")
