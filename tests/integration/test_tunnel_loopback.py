"""Loopback integration: a real gateway listener and agent links over TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from raven.transport.stream import OpenFailure, StreamOpenError
from tests.helpers import KeyPair, wait_for
from tests.helpers.sansio import holds_aead
from tests.helpers.tunnel import LIMITS, Site, echo_port


async def test_stream_echoed_through_tunnel(site: Site) -> None:
    port = echo_port(site)
    await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
    payload = os.urandom(3 * 1024 * 1024 + 17)  # several windows' worth
    writer = asyncio.create_task(stream.write(payload))
    received = bytearray()
    while len(received) < len(payload):
        chunk = await stream.read()
        assert chunk, "stream ended early"
        received += chunk
    await writer
    await stream.write_eof()
    assert await stream.read() == b""
    assert bytes(received) == payload


async def test_errors_are_explicit(site: Site) -> None:
    port = echo_port(site)
    await site.start({"edge-echo-1": "127.0.0.1", "edge-dead-1": "127.0.0.1"}, [port, 1])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    with pytest.raises(StreamOpenError) as e1:
        await site.registry.open_stream("nope", port, timeout_s=2)
    assert e1.value.reason is OpenFailure.UNKNOWN_NODE
    with pytest.raises(StreamOpenError) as e2:
        await site.registry.open_stream("edge-echo-1", port + 1 if port < 65535 else 2, timeout_s=2)
    assert e2.value.reason is OpenFailure.PORT_NOT_ALLOWED
    with pytest.raises(StreamOpenError) as e3:
        await site.registry.open_stream("edge-dead-1", 1, timeout_s=2)
    assert e3.value.reason is OpenFailure.TARGET_REFUSED


async def test_unauthorised_names_refused_and_reported(site: Site) -> None:
    port = echo_port(site)
    link = await site.start({"edge-ok-1": "127.0.0.1", "cloud-db-1": "127.0.0.1"}, [port])
    await wait_for(lambda: link.refused)
    assert [e for e, _ in link.refused] == ["cloud-db-1"]
    assert site.registry.agents_for("edge-ok-1")
    assert not site.registry.agents_for("cloud-db-1")


async def test_unknown_agent_key_gets_nothing(site: Site, tmp_path: Path) -> None:
    port = echo_port(site)
    stranger = KeyPair(tmp_path, "stranger")
    link = await site.start({"edge-x-1": "127.0.0.1"}, [port], key=stranger)
    await wait_for(lambda: link.attempt >= 2, timeout_s=10)
    assert link.connects == 0
    assert not site.registry.sessions
    # the gateway keeps serving authorised agents meanwhile
    good = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: good.connects == 1)


async def test_agent_reconnects_after_gateway_restart(site: Site) -> None:
    port = echo_port(site)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: link.connects == 1)
    assert site.listener.bound is not None
    gw_port = site.listener.bound[1]
    await site.listener.drain(0.5)
    await wait_for(lambda: link.tunnel is None)
    site.listener = site.make_listener(gw_port)
    await site.listener.start()
    await wait_for(lambda: link.connects == 2, timeout_s=5)  # backoff bound is 0.3 s
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
    await stream.write(b"ping")
    assert await stream.read() == b"ping"
    await stream.aclose()


async def _start_source_server() -> asyncio.Server:
    """A target that streams bytes as fast as the reader takes them."""
    block = os.urandom(64 * 1024)

    async def source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                writer.write(block)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(source, "127.0.0.1", 0)


async def test_stalled_stream_does_not_slow_another(site: Site) -> None:
    source = await _start_source_server()
    try:
        port = int(source.sockets[0].getsockname()[1])
        await site.start({"edge-src-1": "127.0.0.1"}, [port])
        await wait_for(lambda: site.registry.agents_for("edge-src-1"))
        stalled = await site.registry.open_stream("edge-src-1", port, timeout_s=5)
        busy = await site.registry.open_stream("edge-src-1", port, timeout_s=5)
        window = LIMITS.stream_window_bytes
        got = 0
        while got < 20 * window:  # far more than the stalled stream may buffer
            got += len(await busy.read())
        # the stalled stream holds at most its window, and nothing was lost or mixed up
        assert stalled._inbox.chunks, "stalled stream received nothing at all"
        buffered = sum(len(c) for c in stalled._inbox.chunks)
        assert buffered <= window
        await stalled.aclose()
        await busy.aclose()
    finally:
        source.close()
        await source.wait_closed()


async def test_drain_lets_open_streams_finish_and_refuses_new(site: Site) -> None:
    port = echo_port(site)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: link.connects == 1)
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
    session = site.registry.agents_for("edge-echo-1")[0]
    session.tunnel.go_away("test drain")
    with pytest.raises(StreamOpenError) as exc:
        await session.tunnel.open_stream("edge-echo-1", port, timeout_s=2)
    assert exc.value.reason is OpenFailure.DRAINING
    await stream.write(b"still flowing")
    assert await stream.read() == b"still flowing"
    await stream.write_eof()
    assert await stream.read() == b""
    assert await session.tunnel.streams.wait_done(2.0)


async def test_rehandshakes_under_traffic_do_not_disturb_a_stream(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh Diffie-Hellman keys every 0.2 s inside the tunnel while a stream echoes
    megabytes both ways: every byte arrives, in order, and the tunnel never closes."""
    fast = dataclasses.replace(LIMITS, rehandshake_after_s=0.2)
    monkeypatch.setattr("tests.helpers.tunnel.LIMITS", fast)
    site.listener.limits = fast
    port = echo_port(site)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    tunnel = site.registry.sessions["site-a"].tunnel
    stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
    received = bytearray()
    sent = bytearray()
    while tunnel.conn.stats.wire.rehandshakes < 3:
        chunk = os.urandom(256 * 1024)
        sent += chunk
        await stream.write(chunk)
        while len(received) < len(sent):
            data = await stream.read()
            assert data, "stream ended early"
            received += data
    assert bytes(received) == bytes(sent)
    await stream.aclose()
    assert link.connects == 1 and not tunnel.closed.done()


async def test_idle_tunnels_hold_no_aead_between_keepalives_whoever_pings(site: Site) -> None:
    """The agent PINGs every 0.5 s, the gateway every 0.37 s: their phases drift through
    every order. An idle tunnel drops its AEAD objects after each write of keepalive traffic
    (the PONG it answers, the PING it sends), not only at the PONG to its own PING: sampled
    over 4 s, neither end keeps them (when only its own PONG released them, the gateway held
    them for a third to a half of the samples)."""
    site.listener = site.make_listener(
        limits=dataclasses.replace(LIMITS, keepalive_interval_s=0.37)
    )
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [echo_port(site)])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    agent, gateway = link.tunnel, site.registry.sessions["site-a"].tunnel
    assert agent is not None
    await wait_for(lambda: not holds_aead(agent.conn) and not holds_aead(gateway.conn))
    pings = gateway.conn.stats.frames_received.get("ping", 0)
    held = {"agent": 0, "gateway": 0}
    samples = 400
    for _ in range(samples):  # 4 s: 8 PINGs one way, 10 the other
        await asyncio.sleep(0.01)
        held["agent"] += holds_aead(agent.conn)
        held["gateway"] += holds_aead(gateway.conn)
    assert gateway.conn.stats.frames_received.get("ping", 0) - pings >= 6  # they ran
    assert held["agent"] <= samples // 20 and held["gateway"] <= samples // 20, held


async def test_an_idle_tunnel_releases_its_aead_objects_and_still_serves(site: Site) -> None:
    """After a keepalive round trip with nothing else on the tunnel, both ends drop their
    AEAD objects (TunnelConnection.trim); the next stream works as before."""
    port = echo_port(site)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    gateway_tunnel = site.registry.sessions["site-a"].tunnel

    await wait_for(lambda: link.tunnel is not None and not holds_aead(link.tunnel.conn))
    await wait_for(lambda: not holds_aead(gateway_tunnel.conn))
    for _ in range(2):
        stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
        await stream.write(b"still there?")
        assert await stream.read() == b"still there?"
        await stream.aclose()
