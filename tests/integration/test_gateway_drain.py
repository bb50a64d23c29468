"""SIGTERM drain of the gateway follows limits.drain_timeout_s (it was 10 s, fixed)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.helpers import KeyPair, agent_config, gateway_config, wait_for
from tests.helpers.apps import gateway_and_agent

DRAIN_S = 0.5


async def test_stop_with_a_hanging_scrape_takes_the_configured_drain(tmp_path: Path) -> None:
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionResetError):  # the agent aborts with an RST
            await reader.read()  # holds the request until the client goes
        writer.close()

    target = await asyncio.start_server(never_answers, "127.0.0.1", 0)
    port = int(target.sockets[0].getsockname()[1])
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    limits = {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 3.0, "drain_timeout_s": DRAIN_S}
    agents = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
    apps = gateway_and_agent(
        gateway_config(tmp_path, gw, agents, limits=limits),
        lambda address: agent_config(
            ag, gw, address, {"edge-hang-1": "127.0.0.1"}, allowed_ports=[port]
        ),
    )
    try:
        async with apps as (gateway, _agent):
            assert gateway.proxy is not None
            reader, writer = await asyncio.open_connection(*gateway.proxy.http_address)
            try:
                await wait_for(lambda: gateway.registry.agents_for("edge-hang-1"))
                request = b"GET /proxy/edge-hang-1:%d/metrics HTTP/1.1\r\nHost: x\r\n\r\n" % port
                writer.write(request)
                await wait_for(lambda: gateway.proxy is not None and gateway.proxy.context.by_node)
                # bounded by the configured drain (twice: proxy, then tunnels), far below 10 s
                await asyncio.wait_for(gateway.stop(), timeout=20 * DRAIN_S)
                assert await asyncio.wait_for(reader.read(), 5) == b""  # cut, never answered 200
            finally:
                writer.close()
    finally:
        target.close()
        await target.wait_closed()
