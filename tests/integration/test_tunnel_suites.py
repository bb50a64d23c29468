"""Transport suites end to end: a real gateway and agent on loopback, the agent configured
with ``cipher: aes-256-gcm``, a scrape through the gateway's HTTP proxy; and the same agent
against a gateway that accepts only ChaCha20-Poly1305 (refused, with a reason)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from cloud_gateway.app import GatewayApp
from edge_agent.app import AgentApp
from raven.protocol.suites import Suite
from tests.helpers import KeyPair, agent_config, gateway_config, sample, wait_for
from tests.helpers.apps import gateway_and_agent
from tests.helpers.proxy import METRICS, serve_app, target_app

#: Both suites, whatever CPU runs the test (`auto` would depend on it).
BOTH = ["chacha20-poly1305", "aes-256-gcm"]


async def scrape(address: tuple[str, int], node: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(
            b"GET /proxy/%s:%d/metrics HTTP/1.1\r\nHost: x\r\n\r\n" % (node.encode(), port)
        )
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_scrape_through_an_aes_256_gcm_tunnel(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    agents = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
    async with serve_app(target_app()) as port:
        apps = gateway_and_agent(
            gateway_config(tmp_path, gw, agents, transport_suites=BOTH),
            lambda address: agent_config(
                ag, gw, address, {"edge-gpu-1": "127.0.0.1"}, allowed_ports=[port],
                cipher="aes-256-gcm",
            ),
        )  # fmt: skip
        async with apps as (gateway, agent):
            assert gateway.proxy is not None
            await wait_for(lambda: gateway.registry.agents_for("edge-gpu-1"))
            [session] = gateway.registry.agents_for("edge-gpu-1")
            assert session.tunnel.conn.suite is Suite.AESGCM
            [link] = agent.dialer.all_links()
            assert link.tunnel is not None and link.tunnel.conn.suite is Suite.AESGCM
            response = await scrape(gateway.proxy.http_address, "edge-gpu-1", port)
            assert response.startswith(b"HTTP/1.1 200")
            assert response.endswith(METRICS)
            labels = {"agent": "site-a", "suite": "aes-256-gcm"}
            assert sample(gateway.metrics_registry, "raven_tunnels_by_suite", **labels) == 1
            assert session.to_json()["suite"] == "aes-256-gcm"


async def test_an_agent_forcing_aes_is_refused_by_a_gateway_that_does_not_accept_it(
    tmp_path: Path,
) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    agents = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
    gateway = GatewayApp(
        gateway_config(tmp_path, gw, agents, transport_suites=["chacha20-poly1305"])
    )
    await gateway.start()
    try:
        assert gateway.listener.bound is not None
        address = f"127.0.0.1:{gateway.listener.bound[1]}"
        agent = AgentApp(agent_config(ag, gw, address, {}, cipher="aes-256-gcm"))
        await agent.start()
        try:
            registry = gateway.metrics_registry
            await wait_for(
                lambda: sample(registry, "raven_handshakes_total", result="unsupported_suite") >= 1
            )
            [link] = agent.dialer.all_links()
            await wait_for(lambda: "offered aes-256-gcm" in link.last_error)
            assert link.connects == 0 and not gateway.registry.sessions
        finally:
            await agent.stop()
    finally:
        await gateway.stop()


async def test_an_auto_agent_upgrades_then_follows_a_gateway_that_stops_accepting_aes(
    tmp_path: Path,
) -> None:
    """An agent preferring AES (cipher auto on an AES CPU) starts on the default suite and
    upgrades by a re-handshake in the tunnel; after the gateway restarts without AES in its
    transport_suites, the remembered suite is refused once and the agent reconnects on
    ChaCha20-Poly1305."""
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    agents = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
    first = GatewayApp(gateway_config(tmp_path, gw, agents, transport_suites=BOTH))
    await first.start()
    assert first.listener.bound is not None
    port = first.listener.bound[1]
    agent = AgentApp(agent_config(ag, gw, f"127.0.0.1:{port}", {"edge-gpu-1": "127.0.0.1"}))
    agent.settings = dataclasses.replace(
        agent.settings, suites=(Suite.AESGCM, Suite.CHACHAPOLY)
    )  # as `cipher: auto` on a CPU with AES instructions, whatever runs this test
    second: GatewayApp | None = None
    try:
        await agent.start()
        await wait_for(lambda: any(link.tunnel for link in agent.dialer.all_links()))
        [link] = agent.dialer.all_links()
        await wait_for(lambda: link.tunnel is not None and link.tunnel.conn.suite is Suite.AESGCM)
        assert link.tunnel is not None and link.tunnel.conn.stats.wire.rehandshakes == 1
        await first.stop()
        await wait_for(lambda: link.tunnel is None)
        second = GatewayApp(
            gateway_config(
                tmp_path, gw, agents, tunnel_listen=f"127.0.0.1:{port}",
                transport_suites=["chacha20-poly1305"],
            )
        )  # fmt: skip
        await second.start()
        await wait_for(lambda: link.tunnel is not None, timeout_s=20)
        assert link.tunnel is not None and link.tunnel.conn.suite is Suite.CHACHAPOLY
        registry = second.metrics_registry
        assert sample(registry, "raven_handshakes_total", result="unsupported_suite") == 1
        assert link.peer_suites == {Suite.CHACHAPOLY}
    finally:
        await agent.stop()
        await first.stop()
        if second is not None:
            await second.stop()
