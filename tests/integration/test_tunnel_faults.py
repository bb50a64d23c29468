"""Bad peers at loopback: each is rejected cleanly and the gateway keeps serving others."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.registry import Registry
from cloud_gateway.tunnel_listener import TunnelListener
from raven.config.gateway import AuthorisedAgent
from raven.protocol import events as ev
from raven.protocol.codes import StreamCode
from raven.protocol.connection import TunnelConnection
from raven.protocol.frame_backlog import CONTROL_FRAMES_PER_CALL
from raven.protocol.frames import OpenFrame, encode_frame
from raven.protocol.noise_crypto import dh_operations
from raven.protocol.registration import encode_register
from raven.protocol.secure_channel import Role, SecureChannel
from raven.protocol.suites import Suite, preamble
from tests.helpers import KeyPair, wait_for
from tests.helpers.sansio import initiator
from tests.helpers.tunnel import LIMITS, Site, echo_port


def handshakes(site: Site, result: str) -> float:
    return site.gw_metrics.handshakes.labels(result)._value.get()


async def read_until_closed(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    async with asyncio.timeout(timeout_s):
        return await reader.read()


async def assert_still_serving(site: Site) -> None:
    port = echo_port(site)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [port])
    await wait_for(lambda: link.connects >= 1)
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    stream = await site.registry.open_stream("edge-echo-1", port, timeout_s=5)
    await stream.write(b"ok?")
    assert await stream.read() == b"ok?"
    await stream.aclose()


async def test_http_client_on_tunnel_port_gets_closed(site: Site) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await read_until_closed(reader) == b""  # no useful answer
    writer.close()
    await wait_for(lambda: handshakes(site, "failed") + handshakes(site, "malformed") >= 1)
    await assert_still_serving(site)


async def test_wrong_gateway_key_gets_no_answer(site: Site, tmp_path: Path) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    impostor = KeyPair(tmp_path, "impostor")  # the agent believes this is the gateway
    conn = initiator(site.agent.private, impostor.public, LIMITS)
    dh_before = dh_operations()
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    writer.write(conn.data_to_send())
    assert await read_until_closed(reader) == b""
    writer.close()
    # mac1 is keyed by the gateway's public key: refused before any Diffie-Hellman
    await wait_for(lambda: handshakes(site, "bad_mac1") == 1)
    assert dh_operations() == dh_before
    await assert_still_serving(site)


async def test_an_agent_with_a_wrong_gateway_key_says_the_likely_cause(
    site: Site, tmp_path: Path
) -> None:
    """The gateway answers nothing; the agent's error names the one likely cause (its
    gateway_public_key) and how to check it, and the gateway lists the refusal in words."""
    impostor = KeyPair(tmp_path, "impostor")
    site.gw, real = impostor, site.gw  # the agent's config names the impostor's key
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [echo_port(site)])
    site.gw = real
    await wait_for(lambda: "most likely gateway_public_key" in link.last_error, "the hint")
    assert "raven pubkey < gateway.key" in link.last_error
    (refusal, *_) = site.listener.refusals.to_json()
    assert refusal["reason"] == "bad_mac1" and refusal["site"] is None  # never had a tunnel
    assert refusal["words"].startswith("wrong gateway public key")


async def test_replayed_initiation_is_rejected(site: Site) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    conn = initiator(site.agent.private, site.gw.public, LIMITS)
    first_flight = conn.data_to_send()
    r1, w1 = await asyncio.open_connection(*site.listener.bound)
    w1.write(first_flight)
    answer = await asyncio.wait_for(r1.read(4096), 5)
    assert answer  # the genuine initiation is answered
    conn.receive_data(answer, time.monotonic())
    w1.write(conn.data_to_send())  # and confirmed: the agent's session is live
    await wait_for(lambda: "site-a" in site.registry.sessions)
    r2, w2 = await asyncio.open_connection(*site.listener.bound)
    w2.write(first_flight)  # an eavesdropper replays it
    assert await read_until_closed(r2) == b""
    await wait_for(lambda: handshakes(site, "replay") == 1)
    for w in (w1, w2):
        w.close()
        await w.wait_closed()


async def test_agent_whose_clock_jumped_back_recovers_once_its_session_is_gone(
    site: Site,
) -> None:
    """The agent's clock ran an hour ahead (its handshake recorded that), then was set back.
    While that session lives, older timestamps are refused (replay); once it is gone the
    agent's handshake goes on, counts only after key confirmation, and the guard follows
    the agent's clock back: no lock-out until the clock catches up."""
    await site.listener.start()
    assert site.listener.bound is not None

    async def connect(wall_time_ns: int) -> tuple[TunnelConnection, asyncio.StreamWriter, bytes]:
        assert site.listener.bound is not None
        conn = initiator(site.agent.private, site.gw.public, LIMITS, wall_time_ns)
        reader, writer = await asyncio.open_connection(*site.listener.bound)
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError):
            answer = await asyncio.wait_for(reader.read(4096), 5)
            conn.receive_data(answer, time.monotonic())
            writer.write(conn.data_to_send())
            return conn, writer, answer
        return conn, writer, b""

    _, w_ahead, _ = await connect(time.time_ns() + 3600 * 10**9)
    await wait_for(lambda: "site-a" in site.registry.sessions)
    _, w_back, answer = await connect(time.time_ns())  # clock set back, session still live
    assert answer == b""
    await wait_for(lambda: handshakes(site, "replay") == 1)
    w_back.close()
    w_ahead.close()  # the old session goes
    await wait_for(lambda: not site.registry.sessions)
    back, w_back, _ = await connect(time.time_ns())
    assert back.handshake_complete
    await wait_for(lambda: "site-a" in site.registry.sessions)
    w_back.close()


async def test_tampered_record_closes_only_that_tunnel(site: Site) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    conn = initiator(site.agent.private, site.gw.public, LIMITS)
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    writer.write(conn.data_to_send())
    conn.receive_data(await asyncio.wait_for(reader.read(4096), 5), time.monotonic())
    assert conn.handshake_complete
    conn.register(["edge-x-1"], [])
    record = bytearray(conn.data_to_send(None, time.monotonic()))
    record[-1] ^= 0x01  # flip one bit of the tag
    writer.write(bytes(record))
    await read_until_closed(reader)  # the gateway hangs up
    writer.close()
    await wait_for(lambda: not site.registry.sessions)
    # the forged record was the one that had to confirm the keys: counted under a fixed
    # label, never the error's text
    await wait_for(lambda: handshakes(site, "bad_record") == 1)
    await assert_still_serving(site)


class FreezableRelay:
    """A TCP relay between agent and gateway that can stop forwarding (a dead path)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frozen = False
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pump(r, uw), self._pump(ur, w), return_exceptions=True)

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                if not self.frozen:
                    w.write(data)
                    await w.drain()
        finally:
            w.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_dead_peer_detected_on_both_sides(site: Site) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    relay = FreezableRelay(site.listener.bound)
    relay_port = await relay.start()
    listener_port = site.listener.bound[1]
    site.listener.bound = ("127.0.0.1", relay_port)  # the agent dials the relay
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [echo_port(site)])
    site.listener.bound = ("127.0.0.1", listener_port)
    await wait_for(lambda: link.connects == 1 and bool(site.registry.sessions))
    await wait_for(lambda: link.accepted_nodes == ("edge-echo-1",), "the node accepted")
    relay.frozen = True
    # both sides find out through their keepalives (dead_peer_timeout_s is 2 s here), not
    # through TCP, which would take minutes on a silent path: the reason says which; the
    # wait's bound only detects a hang
    await wait_for(lambda: link.tunnel is None and not site.registry.sessions, timeout_s=30)
    assert link.last_error.startswith("keepalive_timeout"), link.last_error
    assert link.accepted_nodes == ()  # the status no longer counts that tunnel's answer
    await link.stop(graceful=False)
    site.links.remove(link)
    await relay.stop()


async def test_garbage_floods_do_not_grow_memory(site: Site) -> None:
    await site.listener.start()
    assert site.listener.bound is not None
    for _ in range(20):
        reader, writer = await asyncio.open_connection(*site.listener.bound)
        writer.write(preamble(Suite.CHACHAPOLY) + os.urandom(70000))  # garbage past the suite
        await read_until_closed(reader)
        writer.close()
    assert not site.listener.tunnels or all(t.closed.done() for t in site.listener.tunnels)
    await assert_still_serving(site)


async def _raw_agent(
    site: Site,
) -> tuple[TunnelConnection, asyncio.StreamReader, asyncio.StreamWriter]:
    """An authorised agent driven by hand over a raw socket, after the handshake."""
    assert site.listener.bound is not None
    conn = initiator(site.agent.private, site.gw.public, LIMITS)
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    writer.write(conn.data_to_send())
    conn.receive_data(await asyncio.wait_for(reader.read(4096), 5), time.monotonic())
    assert conn.handshake_complete
    writer.write(conn.data_to_send(None, time.monotonic()))  # the key-confirming record
    await wait_for(lambda: "site-a" in site.registry.sessions)
    return conn, reader, writer


async def _opens_acted_at_most_a_share_per_turn(gateway: TunnelConnection, count: int) -> None:
    """Step the loop one turn at a time until ``count`` OPENs were acted on; no turn acted
    on more than CONTROL_FRAMES_PER_CALL."""
    acted = [0]
    async with asyncio.timeout(10):
        while acted[-1] < count:  # one loop turn per step
            await asyncio.sleep(0)
            acted.append(gateway.stats.frames_received.get("open", 0))
    assert max(b - a for a, b in itertools.pairwise(acted)) <= CONTROL_FRAMES_PER_CALL


async def test_hundreds_of_opens_in_one_read_are_refused_iteratively(site: Site) -> None:
    """The gateway serves no streams: each OPEN is refused from inside the event loop
    of the adapter. Processed re-entrantly, a few hundred in one read raised
    RecursionError and killed the tunnel; now each gets its refusal. And they are acted
    on CONTROL_FRAMES_PER_CALL per loop turn: all at once, 1,024 held the loop 30-100 ms."""
    await site.listener.start()
    conn, reader, writer = await _raw_agent(site)
    gateway = site.registry.sessions["site-a"].tunnel.conn
    count = 800
    for _ in range(count):
        conn.open_stream("edge-x-1", 80)
    wire = conn.data_to_send(None, time.monotonic())
    writer.write(wire)
    await _opens_acted_at_most_a_share_per_turn(gateway, count)
    refused = 0
    async with asyncio.timeout(10):
        while refused < count:
            data = await reader.read(65536)
            assert data, "the gateway closed the tunnel"
            conn.receive_data(data, time.monotonic())
            while conn.input_waiting:  # what an adapter does on its next turns
                conn.resume_input(time.monotonic())
            while (event := conn.next_event()) is not None:
                if isinstance(event, ev.StreamRefused):
                    assert event.code is StreamCode.UNKNOWN_NODE
                    refused += 1
    assert "site-a" in site.registry.sessions
    writer.close()
    await writer.wait_closed()


async def test_a_read_of_several_slices_of_opens_stays_within_the_per_turn_bound(
    site: Site,
) -> None:
    """4,000 OPENs (~76 KB: a read the turn budget feeds in two slices) are acted on at
    most CONTROL_FRAMES_PER_CALL per loop turn: a slice fed while frames still wait adds
    to them, not a second stream of resume calls."""
    await site.listener.start()
    conn, _reader, writer = await _raw_agent(site)
    gateway = site.registry.sessions["site-a"].tunnel.conn
    count = 4000
    for i in range(count):  # raw frames: past this side's own stream table
        frame = encode_frame(OpenFrame(1_000_001 + 2 * i, "edge-x-1", 80))
        conn._channel.seal(frame, time.monotonic())
    writer.write(conn.data_to_send(None, time.monotonic()))
    await _opens_acted_at_most_a_share_per_turn(gateway, count)
    assert "site-a" in site.registry.sessions
    writer.close()
    await writer.wait_closed()


async def test_message_1_replayed_at_another_replica_never_evicts_the_live_session(
    site: Site,
) -> None:
    """Two gateway replicas, each with its own registry and replay guard. The agent's
    message 1 to replica A is recorded and replayed at replica B, where the agent's
    live tunnel is: B answers it (its guard never saw that timestamp) but the session
    counts only after key confirmation, which a replayer cannot give."""
    # the agent's live tunnel lands on replica B (short handshake deadline for the test)
    replica_b = site.listener = TunnelListener(
        listen="127.0.0.1:0", static_private=site.gw.private, psk=bytes(32),
        limits=replace(LIMITS, handshake_timeout_s=1.0), registry=site.registry,
        metrics=site.gw_metrics, handshake_rate_per_s=100, handshake_burst=100,
    )  # fmt: skip
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [])
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    live = site.registry.sessions["site-a"].tunnel
    own_registry = Registry(list(site.registry.by_key.values()), site.gw_metrics)
    replica_a = TunnelListener(
        listen="127.0.0.1:0", static_private=site.gw.private, psk=bytes(32), limits=LIMITS,
        registry=own_registry,
        metrics=site.gw_metrics, handshake_rate_per_s=100, handshake_burst=100,
    )  # fmt: skip
    await replica_a.start()
    assert replica_a.bound is not None and replica_b.bound is not None
    later = initiator(site.agent.private, site.gw.public, LIMITS)
    recorded = later.data_to_send()  # the agent's message 1 on its way to replica A
    ra, wa = await asyncio.open_connection(*replica_a.bound)
    wa.write(recorded)
    assert await asyncio.wait_for(ra.read(4096), 5)  # A answers the genuine one
    rb, wb = await asyncio.open_connection(*replica_b.bound)
    wb.write(recorded)  # the attacker replays it at B
    assert await asyncio.wait_for(rb.read(4096), 5)  # B answers too: it cannot know yet
    await wait_for(lambda: handshakes(site, "unconfirmed") == 1)  # B's deadline passed
    assert site.registry.sessions["site-a"].tunnel is live and not live.closed.done()
    assert link.connects == 1
    for w in (wa, wb):
        w.close()
        await w.wait_closed()
    await replica_a.drain(0.1)


def tunnel_closes(site: Site, code: str) -> float:
    return site.gw_metrics.tunnel_closes.labels(code)._value.get()


async def test_registration_flood_closes_that_tunnel_and_spares_other_sites(
    site: Site, tmp_path: Path
) -> None:
    """An authorised agent sends full-size REGISTERs back to back. Its tunnel is closed
    (control budget, LIMIT_EXCEEDED, counted); another site's tunnel, scraped
    throughout, is never declared dead. On a gateway that validated each REGISTER on
    the loop with no budget, the flood held the loop for seconds."""
    other = KeyPair(tmp_path, "site-b")
    site_b = AuthorisedAgent(name="site-b", public_key=other.public_b64, nodes=["edge-b-*"])
    site.registry.update_agents([*site.registry.by_key.values(), site_b])
    port = echo_port(site)
    link = await site.start({"edge-b-1": "127.0.0.1"}, [port], key=other)
    await wait_for(lambda: site.registry.agents_for("edge-b-1"))
    live = site.registry.sessions["site-b"].tunnel
    names = [f"edge-{i}-{'x' * 40}" for i in range(LIMITS.max_registration_entries)]
    # encoding takes a while: in a thread, before the hostile agent connects
    frames = await asyncio.to_thread(lambda: list(encode_register(names, [], 60_000)))
    channel = SecureChannel(role=Role.INITIATOR, static_private=site.agent.private,
                            remote_static=site.gw.public, limits=LIMITS,
                            now=time.monotonic(), wall_time_ns=time.time_ns())  # fmt: skip
    assert site.listener.bound is not None
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    writer.write(channel.data_to_send())
    channel.receive_data(await asyncio.wait_for(reader.read(4096), 5), time.monotonic())
    writer.write(channel.data_to_send())  # key confirmation
    await wait_for(lambda: "site-a" in site.registry.sessions)
    for _ in range(20):  # twenty full registrations back to back
        for frame in frames:
            channel.seal(frame, time.monotonic())
    writer.write(channel.data_to_send())
    with contextlib.suppress(ConnectionError):
        await read_until_closed(reader, timeout_s=20)
    await wait_for(lambda: tunnel_closes(site, "limit_exceeded") == 1)
    loop = asyncio.get_running_loop()
    until = loop.time() + 2 * LIMITS.dead_peer_timeout_s
    while loop.time() < until:  # site-b keeps being scraped
        stream = await site.registry.open_stream("edge-b-1", port, timeout_s=5)
        await stream.write(b"scrape")
        assert await stream.read() == b"scrape"
        await stream.aclose()
        await asyncio.sleep(0.2)
    assert site.registry.sessions["site-b"].tunnel is live and not live.closed.done()
    assert link.connects == 1
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_nodes_and_their_series_are_forgotten_after_the_ttl(site: Site) -> None:
    """A node whose agent left stays known (no_agent) for node_ttl_s, then is forgotten
    with its per-node latency series: state and metric cardinality do not grow forever."""
    proxy_registry = CollectorRegistry()
    proxy_metrics = ProxyMetrics(proxy_registry)
    site.registry.on_forget = proxy_metrics.forget_nodes
    site.registry.node_ttl_s = 0.3
    nodes = {f"edge-gone-{i}": "127.0.0.1" for i in range(50)}
    link = await site.start(nodes, [])
    await wait_for(lambda: all(site.registry.agents_for(n) for n in nodes))
    for node in nodes:
        proxy_metrics.observe(node, 0.01)
    series = "raven_proxy_request_duration_seconds_count"
    await link.stop(graceful=False)
    site.links.remove(link)
    await wait_for(lambda: not site.registry.sessions)
    assert site.registry.is_known("edge-gone-1") and not site.registry.agents_for("edge-gone-1")
    await wait_for(lambda: site.registry.expire() and not site.registry.seen_nodes)
    assert not site.registry.is_known("edge-gone-1")
    assert site.registry.nodes_json() == {"nodes": []}
    assert proxy_registry.get_sample_value(series, {"node": "edge-gone-1"}) is None


async def test_half_open_handshakes_are_capped_globally(site: Site) -> None:
    """Connections that never finish a handshake hold a slot each; beyond the global cap
    new ones are closed at accept (counted "overloaded"), whatever their source."""
    site.listener.max_half_open = 3
    await site.listener.start()
    assert site.listener.bound is not None
    holders = [await asyncio.open_connection(*site.listener.bound) for _ in range(3)]
    await wait_for(lambda: len(site.listener.tunnels) == 3)
    reader, writer = await asyncio.open_connection(*site.listener.bound)
    with contextlib.suppress(ConnectionError):
        assert await read_until_closed(reader) == b""
    writer.close()
    assert handshakes(site, "overloaded") == 1
    for _, w in holders:
        w.close()
    await wait_for(lambda: not site.listener.tunnels)
    await assert_still_serving(site)
