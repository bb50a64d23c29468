"""The one set of test helpers.

This module: free ports, keys and configs, an echo server, polling (``wait_for``), prerequisites
(``require``), metric samples and the ``raven`` command. Beside it:

- ``threads``: calls in a thread with its own network namespace or capabilities;
- ``tunnel``: a gateway listener plus agent links on loopback (the ``site`` fixture);
- ``proxy``: the L7 proxy, its targets and openers on loopback (the ``target_port`` fixture);
- ``dnsmasq``: a real DNS server on loopback;
- ``kube``: a kubeconfig file (the fake API server itself is tests/helpers/fakekube);
- ``apps``: the gateway and agent applications together on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from raven import keys
from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import from_dict

#: The repository's root folder.
REPO_ROOT = Path(__file__).resolve().parents[2]


def python_env(root: Path = REPO_ROOT) -> dict[str, str]:
    """PYTHONPATH for a child Python process importing the packages of the checkout at
    ``root`` (this one by default; the hosts generator lives in coredns-hosts/)."""
    return {"PYTHONPATH": f"{root}:{root / 'coredns-hosts'}"}


def free_port(host: str = "127.0.0.1", *, udp_too: bool = False) -> int:
    """A TCP port free on ``host`` now (and the same UDP port, with ``udp_too``: a DNS server
    listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((host, 0))
            port = int(tcp.getsockname()[1])
            if not udp_too:
                return port
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
                return port
    raise RuntimeError(f"no port free for both TCP and UDP on {host}")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now: all are held bound until every one
    is chosen (``free_port`` called in a loop can get the same port back twice)."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        for _ in range(count):
            tcp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            tcp.bind((host, 0))
            ports.append(int(tcp.getsockname()[1]))
        return ports


def write_key(path: Path) -> str:
    """A new private key written to ``path``; returns its public key in text form."""
    private = keys.generate_private_key()
    keys.write_private_key_file(path, private)
    return keys.encode_key(keys.public_key(private))


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


async def wait_for(
    predicate: Callable[[], object],
    what: str = "the condition",
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
) -> None:
    """Poll ``predicate()`` until true; fail the test, naming ``what``, after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The value of one sample, 0 when it does not exist (yet)."""
    return registry.get_sample_value(name, labels) or 0.0


def require(condition: bool, why: str) -> None:
    """Skip the test when a prerequisite is missing. In CI (RAVEN_REQUIRE_E2E=1) the skip fails
    the run, as every skip does there (tests/conftest.py)."""
    if not condition:
        pytest.skip(why)


def raven_cmd() -> list[str]:
    """The ``raven`` command of this environment (its script, else ``python -m raven_cli.main``)."""
    script = Path(sys.executable).parent / "raven"
    return [str(script)] if script.exists() else [sys.executable, "-m", "raven_cli.main"]


def load_script(path: Path) -> ModuleType:
    """A Python script of the repository (``scripts/gen_*.py``, ``compose/gen_keys.py``), loaded
    as a module named after its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
