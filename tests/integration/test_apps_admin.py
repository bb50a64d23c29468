"""The gateway and agent processes' admin APIs: health, readiness, metrics, agents/nodes."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from edge_agent.app import AgentApp
from tests.helpers import KeyPair, agent_config, gateway_config, start_echo_server, wait_for
from tests.helpers.apps import gateway_and_agent


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_admin_endpoints_of_gateway_and_agent(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    echo = await start_echo_server()
    echo_port = int(echo.sockets[0].getsockname()[1])
    apps = gateway_and_agent(
        gateway_config(tmp_path, gw, [
            {"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]),
        lambda address: agent_config(ag, gw, address,
                                     {"edge-echo-1": "127.0.0.1", "intruder-1": "127.0.0.1"},
                                     allowed_ports=[echo_port]),
    )  # fmt: skip
    try:
        async with apps as (gateway, agent), aiohttp.ClientSession() as s:
            assert gateway.admin.bound and agent.admin.bound
            gw_url = f"http://127.0.0.1:{gateway.admin.bound[1]}"
            ag_url = f"http://127.0.0.1:{agent.admin.bound[1]}"
            await wait_for(lambda: gateway.registry.agents_for("edge-echo-1"))
            for url in (gw_url, ag_url):
                assert await get(s, f"{url}/healthz") == (200, "ok\n")
                assert (await get(s, f"{url}/readyz"))[0] == 200
            status, body = await get(s, f"{gw_url}/api/v1/nodes")
            assert status == 200 and '"edge-echo-1"' in body and "intruder-1" not in body
            status, body = await get(s, f"{gw_url}/api/v1/agents")
            assert '"refused"' in body and "intruder-1" in body  # refused entry is listed
            status, body = await get(s, f"{gw_url}/api/v1/targets?port=9100")
            assert '"edge-echo-1:9100"' in body
            assert (await get(s, f"{gw_url}/api/v1/targets?port=x"))[0] == 400
            assert (await get(s, f"{gw_url}/api/v1/targets?port=9100"))[1] == body  # cached
            _, text = await get(s, f"{gw_url}/metrics")
            samples = {
                (smp.name, tuple(sorted(smp.labels.items()))): smp.value
                for fam in text_string_to_metric_families(text)
                for smp in fam.samples
            }
            assert samples[("raven_tunnels_connected", (("agent", "site-a"),))] == 1
            assert samples[("raven_handshakes_total", (("result", "ok"),))] == 1
            assert samples[("raven_registrations_refused_total", (("agent", "site-a"),))] == 1
            rx = (("agent", "site-a"), ("direction", "rx"))
            assert samples[("raven_tunnel_bytes_total", rx)] > 0
            assert samples[("raven_tunnel_frames_total", rx)] >= 1
            _, text = await get(s, f"{ag_url}/metrics")
            assert "raven_tunnels_connected{gateway=" in text
            tx = re.search(
                r'raven_tunnel_bytes_total\{direction="tx",gateway="[^"]+"\} (\S+)', text
            )
            assert tx is not None and float(tx.group(1)) > 0  # read live, no keepalive needed
            assert "raven_agent_nodes_served 2.0" in text
            await agent.stop()
            await wait_for(lambda: not gateway.registry.sessions)
            # the cached http_sd body follows the registry: the node left with its agent
            assert (await get(s, f"{gw_url}/api/v1/targets?port=9100")) == (200, "[]")
            # the node is known but its agent is gone
            status, body = await get(s, f"{gw_url}/api/v1/nodes")
            assert '"reachable": false' in body
    finally:
        echo.close()
        await echo.wait_closed()
    # agent readiness without any tunnel
    lonely = AgentApp(agent_config(ag, gw, "127.0.0.1:1", {}))
    ok, reason = lonely._ready()
    assert not ok and "no tunnel" in reason
