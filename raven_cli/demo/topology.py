"""The demo's topology: keys, configs and simulated GPU nodes, all on loopback."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raven import keys
from raven.config.agent import AgentConfig, GpuExporterConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import from_dict

GPU_PORT = 9400
FAST_LIMITS = {"keepalive_interval_s": 2.0, "dead_peer_timeout_s": 6.0, "drain_timeout_s": 3.0}


@dataclass(frozen=True)
class DemoNode:
    site: str
    name: str
    address: str  # a loopback address of its own, so every node listens on :9400
    port: int = 9400

    @property
    def exporter(self) -> GpuExporterConfig:
        return GpuExporterConfig(
            enabled=True,
            listen=f"{self.address}:{self.port}",
            simulate=2,
            model="H100",
            seed=sum(self.name.encode()),
            hostname=self.name,
        )


@dataclass
class Topology:
    workdir: Path
    gateway_key: Path
    agent_keys: dict[str, Path]
    nodes: list[DemoNode]
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    gpu_port: int = GPU_PORT

    @property
    def sites(self) -> list[str]:
        return sorted({n.site for n in self.nodes})

    def gateway_config(self) -> GatewayConfig:
        p = self.ports
        data: dict[str, Any] = {
            "private_key_file": str(self.gateway_key),
            "tunnel_listen": f"{self.host}:{p.get('tunnel', 0)}",
            "admin_listen": f"{self.host}:{p.get('admin', 0)}",
            "proxy": {"http_listen": f"{self.host}:{p.get('proxy', 0)}", "tls_listeners": []},
            "agents": [
                {
                    "name": site,
                    "public_key": keys.encode_key(
                        keys.public_key(keys.read_private_key_file(self.agent_keys[site]))
                    ),
                    "nodes": [f"{site}-*"],
                    "prefixes": [],
                }
                for site in self.sites
            ],
            "limits": FAST_LIMITS,
            "log": {"level": "warning"},
        }
        return from_dict(GatewayConfig, data)

    def agent_config(self, site: str, tunnel_port: int) -> AgentConfig:
        gw_pub = keys.encode_key(keys.public_key(keys.read_private_key_file(self.gateway_key)))
        data: dict[str, Any] = {
            "name": site,
            "private_key_file": str(self.agent_keys[site]),
            "gateway": f"{self.host}:{tunnel_port}",
            "gateway_public_key": gw_pub,
            "nodes": {n.name: n.address for n in self.nodes if n.site == site},
            "admin_listen": f"{self.host}:0",
            "allowed_ports": sorted({self.gpu_port, 9100}),
            "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 5.0},
            "limits": FAST_LIMITS,
        }
        return from_dict(AgentConfig, data)


def build_topology(
    workdir: Path, *, sites: int = 2, nodes_per_site: int = 3, base_port: int | None = None
) -> Topology:
    """Generate keys (mode 0600) and the node list for ``sites`` edge sites."""
    if not 1 <= sites <= 26 or not 1 <= nodes_per_site <= 200:
        raise ValueError("demo: 1-26 sites with 1-200 nodes each")
    workdir.mkdir(parents=True, exist_ok=True)
    gw_key = workdir / "gateway.key"
    keys.write_private_key_file(gw_key, keys.generate_private_key())
    agent_keys: dict[str, Path] = {}
    nodes: list[DemoNode] = []
    gpu_port = gpu_port_for("127.0.10.1")
    for s in range(sites):
        site = f"site-{chr(ord('a') + s)}"
        agent_keys[site] = workdir / f"{site}.key"
        keys.write_private_key_file(agent_keys[site], keys.generate_private_key())
        for i in range(1, nodes_per_site + 1):
            nodes.append(DemoNode(site, f"{site}-gpu-{i}", f"127.0.{10 * (s + 1)}.{i}", gpu_port))
    ports = {}
    if base_port is not None:
        ports = {
            "tunnel": base_port,
            "proxy": base_port + 2,
            "admin": base_port + 3,
            "link": base_port + 6,
        }
    return Topology(workdir, gw_key, agent_keys, nodes, ports=ports, gpu_port=gpu_port)


def gpu_port_for(address: str) -> int:
    """9400 (dcgm-exporter's port) when it is free on the demo's loopback addresses, else a free
    port: a real dcgm-exporter on 0.0.0.0:9400 must not stop the demo."""
    return free_port(address, GPU_PORT)


def free_port(host: str, preferred: int) -> int:
    """``preferred`` when it is free on ``host``, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"demo: no free port on {host}")
