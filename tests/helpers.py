"""Shared test helpers: keys, configs, echo and HTTP targets on loopback."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from raven import keys
from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import from_dict


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class KeyPair:
    def __init__(self, directory: Path, name: str) -> None:
        self.private = keys.generate_private_key()
        self.public = keys.public_key(self.private)
        self.public_b64 = keys.encode_key(self.public)
        self.path = directory / f"{name}.key"
        keys.write_private_key_file(self.path, self.private)


def gateway_config(
    tmp: Path, gw: KeyPair, agents: list[dict[str, Any]], **overrides: Any
) -> GatewayConfig:
    data: dict[str, Any] = {
        "private_key_file": str(gw.path),
        "tunnel_listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "agents": agents,
        "proxy": {"http_listen": "127.0.0.1:0", "tls_listeners": []},
        "limits": {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 3.0, "drain_timeout_s": 2.0},
    }
    data.update(overrides)
    return from_dict(GatewayConfig, data)


def agent_config(
    agent: KeyPair, gw: KeyPair, gateway: str, nodes: dict[str, str], **overrides: Any
) -> AgentConfig:
    data: dict[str, Any] = {
        "private_key_file": str(agent.path),
        "gateway": gateway,
        "gateway_public_key": gw.public_b64,
        "nodes": nodes,
        "admin_listen": "127.0.0.1:0",
        "allowed_ports": [],
        "reconnect": {"min_backoff_s": 0.1, "max_backoff_s": 0.5},
        "limits": {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 3.0, "drain_timeout_s": 2.0},
    }
    data.update(overrides)
    return from_dict(AgentConfig, data)


async def start_echo_server(host: str = "127.0.0.1") -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()
        except ConnectionError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(echo, host, 0)


async def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Poll ``predicate()`` until true; fail the test after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


def require(condition: bool, why: str) -> None:
    """Skip when a prerequisite is missing, but fail when RAVEN_REQUIRE_E2E=1 (CI)."""
    import os

    import pytest

    if condition:
        return
    if os.environ.get("RAVEN_REQUIRE_E2E") == "1":
        pytest.fail(f"prerequisite missing and RAVEN_REQUIRE_E2E=1: {why}")
    pytest.skip(why)
