"""Our metrics follow Prometheus's conventions: the gateway's and the agent's /metrics pass
`promtool check metrics` (Debian's prometheus package), carry raven_build_info and the
process collectors, and have no _created series unless asked."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest

from raven_cli.demo.runner import Demo
from raven_cli.demo.topology import build_topology

PROMTOOL = shutil.which("promtool")


async def fetch(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


def promtool_check(text: str) -> str:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return (proc.stdout + proc.stderr).strip() if proc.returncode else ""


@pytest.mark.integration
@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: run scripts/setup as root")
async def test_gateway_and_agent_metrics_pass_promtool(tmp_path: Path) -> None:
    demo = Demo(build_topology(tmp_path, sites=1, nodes_per_site=1), with_hosts_generator=False)
    await demo.start()
    try:
        assert await demo.wait_registered()
        node = demo.topology.nodes[0]
        for mode in ("dns", "proxy", "path", "connect"):
            assert (await demo.scrape(node, mode)).ok
        await asyncio.sleep(1.5)  # a keepalive round trip fills the RTT histogram
        host = demo.topology.host
        agent = next(iter(demo.agents.values()))
        assert agent.admin.bound is not None
        pages = {
            "gateway": await fetch(f"http://{host}:{demo.admin_port}/metrics"),
            "agent": await fetch(f"http://{host}:{agent.admin.bound[1]}/metrics"),
        }
        gpu_page = await fetch(f"http://{node.address}:{node.port}/metrics")
    finally:
        await demo.stop()
    for name, text in pages.items():
        assert promtool_check(text) == "", f"{name}: promtool check metrics failed"
        assert "raven_build_info{" in text, name
        assert "process_resident_memory_bytes" in text, name
        assert "python_info{" in text, name
        assert "raven_event_loop_lag_seconds_bucket{" in text, name
        assert "_created" not in text, name
    assert "raven_tunnel_keepalive_rtt_seconds_bucket" in pages["gateway"]
    # the agent's relay counts (plain integers exported by its collector) moved with the scrapes
    relayed = {
        line.split('"')[1]: float(line.split()[-1])
        for line in pages["agent"].splitlines()
        if line.startswith("raven_agent_relay_bytes_total{")
    }
    assert relayed.keys() == {"to_target", "from_target"}
    assert relayed["to_target"] > 0 and relayed["from_target"] > relayed["to_target"]
    # the GPU exporter's own metrics (its DCGM_* families keep dcgm-exporter's names and labels)
    own = (
        "\n".join(
            line
            for line in gpu_page.splitlines()
            if not line.startswith(("DCGM_", "# HELP DCGM_", "# TYPE DCGM_"))
        )
        + "\n"
    )
    assert "raven_gpu_exporter_collections_total" in own
    assert promtool_check(own) == "", "gpu exporter: promtool check metrics failed"
    assert "histogram" not in " ".join(
        line.split()[2] for line in pages["gateway"].splitlines() if line.startswith("# TYPE")
    )
