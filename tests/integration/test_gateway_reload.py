"""Live reload of the authorised agents: no gateway restart to add a site or rotate a key."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from raven.config.gateway import GatewayConfig
from raven.config.loader import from_dict
from raven.runtime.service import watch_file
from tests.helpers import KeyPair, agent_config, free_port, gateway_config, wait_for
from tests.helpers.apps import gateway_and_agent


def with_agents(config: GatewayConfig, agents: list[dict[str, object]]) -> GatewayConfig:
    import dataclasses

    return dataclasses.replace(config, agents=from_dict(GatewayConfig, {
        "private_key_file": config.private_key_file, "agents": agents}).agents)  # fmt: skip


async def test_reload_widens_narrows_and_removes_an_agent(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    narrow = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
    wide = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*", "gpu-*"]}]
    nodes = {"edge-1": "127.0.0.1", "gpu-1": "127.0.0.1"}
    apps = gateway_and_agent(
        gateway_config(tmp_path, gw, narrow), lambda address: agent_config(ag, gw, address, nodes)
    )
    async with apps as (gateway, agent):
        await wait_for(lambda: gateway.registry.agents_for("edge-1"))
        assert not gateway.registry.agents_for("gpu-1")  # refused by the narrow rules
        link = agent.dialer.all_links()[0]
        # widen: the agent's tunnel is closed, it reconnects and registers under the new rules
        gateway.reload(with_agents(gateway.config, wide))
        await wait_for(lambda: link.connects == 2, timeout_s=10)
        await wait_for(lambda: gateway.registry.agents_for("gpu-1"), timeout_s=10)
        # remove the key: the tunnel goes and reconnecting is refused
        gateway.reload(with_agents(gateway.config, []))
        await wait_for(lambda: not gateway.registry.sessions, timeout_s=10)
        await asyncio.sleep(1.0)  # several reconnect attempts (backoff <= 0.5 s)
        assert link.connects == 2 and not gateway.registry.sessions
        # unchanged agents: nothing is closed
        gateway.reload(with_agents(gateway.config, wide))
        await wait_for(lambda: link.connects == 3, timeout_s=10)
        gateway.reload(with_agents(gateway.config, wide))
        await asyncio.sleep(0.3)
        assert link.connects == 3 and gateway.registry.sessions


async def test_watch_file_sees_a_replaced_file(tmp_path: Path) -> None:
    target = tmp_path / "gateway.yaml"
    target.write_text("a: 1\n")
    seen: list[int] = []
    task = asyncio.create_task(watch_file(target, lambda: seen.append(1), 0.05))
    try:
        await asyncio.sleep(0.1)
        tmp = tmp_path / ".new"
        tmp.write_text("a: 22\n")
        tmp.rename(target)  # how editors and the kubelet replace files
        await wait_for(lambda: seen == [1], timeout_s=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_sighup_reloads_the_running_gateway_process(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    admin = free_port()
    doc = {
        "private_key_file": str(gw.path), "tunnel_listen": f"127.0.0.1:{free_port()}",
        "admin_listen": f"127.0.0.1:{admin}",
        "proxy": {"http_listen": f"127.0.0.1:{free_port()}", "tls_listeners": []},
        "agents": [],
    }  # fmt: skip
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "raven_cli.main", "gateway", "-c", str(path)],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip

    def metric(name: str) -> float | None:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=2).read()
        except OSError:
            return None
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    try:
        for _ in range(100):
            if metric("raven_gateway_authorised_agents") == 0:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        doc["agents"] = [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}]
        path.write_text(yaml.safe_dump(doc))
        os.kill(proc.pid, signal.SIGHUP)
        for _ in range(100):
            if metric("raven_gateway_authorised_agents") == 1:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert metric("raven_gateway_authorised_agents") == 1
        assert metric("raven_gateway_config_reloads_total") >= 1
        # a broken file is refused and the running config kept
        path.write_text("agents: [{name: x}]\n")
        os.kill(proc.pid, signal.SIGHUP)
        subprocess.run(["sleep", "0.5"], check=True)
        assert proc.poll() is None
        assert metric("raven_gateway_authorised_agents") == 1
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "config reload refused" in err
    assert "Traceback" not in err
