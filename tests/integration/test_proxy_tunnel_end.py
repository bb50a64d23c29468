"""The whole scrape path over a real tunnel: the proxy's streams end with END both ways.

A complete response is not a cancellation: after many scrapes (length-delimited, chunked,
gzip) neither side has sent or received a RESET and every stream is gone from both ends. A
client that goes away mid-response still gets its stream reset (the only real cancellation).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from raven.transport.tunnel import Tunnel
from tests.helpers import wait_for
from tests.helpers.proxy import GZIPPED, METRICS, running_proxy, serve_app, target_app
from tests.helpers.tunnel import Site

pytestmark = pytest.mark.integration

NODE = "edge-end-1"


def tunnels(site: Site) -> tuple[Tunnel, Tunnel]:
    (session,) = site.registry.sessions.values()
    (link,) = site.links
    assert link.tunnel is not None
    return session.tunnel, link.tunnel


async def test_scrapes_end_cleanly_both_ways(site: Site) -> None:
    """Each request on its own connection with Connection: close: the first opens a stream,
    the others take it from the gateway's pool (the target's connection stays behind it);
    when the pool lets it go it ENDs both ways, never RESET."""
    async with serve_app(target_app()) as port:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        async with running_proxy(site.registry) as (proxy, _r, base), aiohttp.ClientSession() as s:
            host = {"Host": f"{NODE}:{port}", "Connection": "close"}
            for _ in range(5):
                async with s.get(f"{base}/metrics", headers=host) as r:
                    assert r.status == 200 and await r.read() == METRICS
                    assert r.headers.get("Connection") == "close"  # the client's wish holds
            async with s.get(f"{base}/chunked", headers=host) as r:
                assert (await r.read()).count(b"line ") == 50
            gz = {**host, "Accept-Encoding": "gzip"}
            async with s.get(f"{base}/gzip", headers=gz, auto_decompress=False) as r:
                assert await r.read() == GZIPPED
            gateway, agent = tunnels(site)
            assert len(proxy.context.streams) == 1 and len(gateway.streams) == 1
            proxy.context.streams.close()
            await wait_for(lambda: not gateway.streams and not agent.streams)
            for tunnel in (gateway, agent):
                stats = tunnel.conn.stats
                assert stats.streams_reset == {}
                assert stats.streams_opened == 1
                assert stats.frames_sent.get("end") == 1
                assert stats.frames_received.get("end") == 1
                assert "reset" not in stats.frames_sent


async def test_clients_of_many_targets_share_the_pool(site: Site) -> None:
    """Connections that each scrape another target than before (Prometheus's pooled
    connections to a proxy_url) take the streams left by the others: one stream per target."""
    nodes = {f"edge-pool-{i}": "127.0.0.1" for i in range(3)}
    async with serve_app(target_app()) as port:
        await site.start(nodes, [port])
        await wait_for(lambda: all(site.registry.agents_for(n) for n in nodes))
        async with running_proxy(site.registry) as (proxy, _r, base):
            connector = aiohttp.TCPConnector(limit=2)
            async with aiohttp.ClientSession(connector=connector) as s:
                for _ in range(4):
                    for node in nodes:  # two connections take turns over three targets
                        async with s.get(
                            f"{base}/metrics", headers={"Host": f"{node}:{port}"}
                        ) as r:
                            assert r.status == 200 and await r.read() == METRICS
            gateway, _agent = tunnels(site)
            assert gateway.conn.stats.streams_opened == 3  # not one per scrape
            assert gateway.conn.stats.streams_reset == {}
            assert len(proxy.context.streams) == 3


async def test_keep_alive_client_reuses_one_stream_and_one_target_connection(site: Site) -> None:
    """A keep-alive client's scrapes of one target ride one stream, and the agent's one
    connection to the target: no OPEN, no TCP connect per scrape; the stream ENDs both ways
    when the pool lets it go (the client went first: the stream waited in the pool)."""
    accepted: list[object] = []
    async with serve_app(target_app()) as port:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        async with running_proxy(site.registry) as (proxy, _r, base):
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector) as s:
                host = {"Host": f"{NODE}:{port}"}
                for _ in range(10):
                    async with s.get(f"{base}/metrics", headers=host) as r:
                        assert r.status == 200 and await r.read() == METRICS
                    accepted.append(r.headers.get("Connection"))
                async with s.get(f"{base}/chunked", headers=host) as r:
                    assert (await r.read()).count(b"line ") == 50
                gateway, agent = tunnels(site)
                assert len(gateway.streams) == 1 and len(agent.streams) == 1
            await wait_for(lambda: len(proxy.context.streams) == 1)  # the client went: pooled
            proxy.context.streams.close()
            await wait_for(lambda: not gateway.streams and not agent.streams)
            for tunnel in (gateway, agent):
                stats = tunnel.conn.stats
                assert stats.streams_opened == 1
                assert stats.streams_reset == {}
                assert stats.frames_sent.get("end") == 1
                assert stats.frames_received.get("end") == 1
    assert accepted == [None] * 10  # the client connection stayed keep-alive throughout


async def test_kept_stream_whose_target_closed_is_retried_once_afresh(site: Site) -> None:
    """The target closes a kept connection on the next request without answering (the race
    of an idle timeout): the gateway sends the request again once on a new stream."""
    served: list[int] = []
    unanswered: list[int] = []

    async def once_per_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            served.append(1)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            await r.readuntil(b"\r\n\r\n")  # the next request: closed without an answer
            unanswered.append(1)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(once_per_connection, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        async with running_proxy(site.registry) as (proxy, _r, _base):
            reader, writer = await asyncio.open_connection(*proxy.http_address)
            request = f"GET /m HTTP/1.1\r\nHost: {NODE}:{port}\r\n\r\n".encode()
            for _ in range(3):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 ") and await reader.readexactly(3) == b"ok\n"
            writer.close()
        assert len(served) == 3  # three target connections, each answering once
        assert len(unanswered) == 2  # requests 2 and 3 went first to the kept connection
    finally:
        server.close()
        await server.wait_closed()


async def test_client_gone_mid_response_still_resets(site: Site) -> None:
    async with serve_app(target_app()) as port:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        async with running_proxy(site.registry) as (proxy, _r, _base):
            host, proxy_port = proxy.http_address
            reader, writer = await asyncio.open_connection(host, proxy_port)
            writer.write(f"GET /big?mb=64 HTTP/1.1\r\nHost: {NODE}:{port}\r\n\r\n".encode())
            assert (await reader.readexactly(12)) == b"HTTP/1.1 200"
            writer.transport.abort()
            gateway, agent = tunnels(site)
            await wait_for(lambda: gateway.conn.stats.streams_reset.get("cancelled") == 1)
            await wait_for(lambda: not gateway.streams and not agent.streams)


async def test_peer_that_never_ends_is_reset_after_the_linger(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)  # answers, then keeps the connection open: the agent never ENDs
        w.write(b"answer")

    monkeypatch.setattr("raven.transport.tunnel_stream.END_LINGER_S", 0.05)
    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        stream = await site.registry.open_stream(NODE, port, timeout_s=5)
        assert await stream.read() == b"answer"
        await stream.write_eof()
        await stream.aclose()  # our side is done; the peer's END never comes
        gateway, agent = tunnels(site)
        await wait_for(lambda: gateway.conn.stats.streams_reset.get("cancelled") == 1)
        await wait_for(lambda: not gateway.streams and not agent.streams)
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_kept_stream_is_checked_again_for_each_request(site: Site) -> None:
    """A node leaving the agent's table ends what a kept stream may carry: the next request
    on it is refused as a new stream would be (the allow-list holds per request)."""
    async with serve_app(target_app()) as port:
        await site.start({NODE: "127.0.0.1", "edge-end-2": "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        async with running_proxy(site.registry) as (proxy, _r, _base):
            reader, writer = await asyncio.open_connection(*proxy.http_address)
            request = f"GET /metrics HTTP/1.1\r\nHost: {NODE}:{port}\r\n\r\n".encode()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert await reader.readexactly(len(METRICS)) == METRICS
            gateway, agent = tunnels(site)
            assert len(gateway.streams) == 1  # kept for the next request
            (relay,) = site.relays
            relay.set_nodes({"edge-end-2": "127.0.0.1"})
            writer.write(request)
            refused = await reader.readuntil(b"\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 404 ")
            writer.close()
            assert agent.conn.stats.streams_reset == {"target_reset": 1}


async def test_requests_ride_with_open_no_data_frame_to_the_agent(site: Site) -> None:
    """A new stream's request (head, and a small body already read) leaves inside the OPEN:
    the agent receives no DATA frame for it; a body over 16 KiB follows as DATA."""
    async with serve_app(target_app()) as port:
        await site.start({NODE: "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for(NODE))
        _gateway, agent = tunnels(site)
        received = agent.conn.stats.frames_received
        async with running_proxy(site.registry) as (proxy, _r, base), aiohttp.ClientSession() as s:
            host = {"Host": f"{NODE}:{port}", "Connection": "close"}
            async with s.get(f"{base}/metrics", headers=host) as r:
                assert r.status == 200 and await r.read() == METRICS
            # head and body in one write: the proxy has the whole body when it opens
            reader, writer = await asyncio.open_connection(*proxy.http_address)
            head = b"POST /echo HTTP/1.1\r\nHost: %s:%d\r\n" % (NODE.encode(), port)
            writer.write(head + b"Connection: close\r\nContent-Length: 10\r\n\r\nsmall body")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nsmall body")
            assert received.get("open") == 2 and "data" not in received
            big = b"b" * (64 * 1024)
            async with s.post(f"{base}/echo", headers=host, data=big) as r:
                assert r.status == 200 and await r.read() == big
            assert received.get("open") == 3 and received.get("data", 0) >= 1
