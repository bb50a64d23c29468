"""The gateway and agent applications running together on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from cloud_gateway.app import GatewayApp
from edge_agent.app import AgentApp
from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from tests.helpers import wait_for


@asynccontextmanager
async def gateway_and_agent(
    gateway_config: GatewayConfig, agent_config: Callable[[str], AgentConfig]
) -> AsyncIterator[tuple[GatewayApp, AgentApp]]:
    """Start a gateway, then an agent configured by ``agent_config(tunnel_address)`` with the
    gateway's bound tunnel address, and wait until the agent's tunnel is up. Both are stopped
    on the way out (stopping either earlier in the test is fine)."""
    gateway = GatewayApp(gateway_config)
    await gateway.start()
    try:
        assert gateway.listener.bound is not None
        agent = AgentApp(agent_config(f"127.0.0.1:{gateway.listener.bound[1]}"))
        try:
            await agent.start()
            await wait_for(lambda: any(link.tunnel for link in agent.dialer.all_links()))
            yield gateway, agent
        finally:
            await agent.stop()
    finally:
        await gateway.stop()
