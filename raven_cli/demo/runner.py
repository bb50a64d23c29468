"""Runs the demo topology in one process: gateway, edge agents, simulated GPU nodes and
the hosts generator; scrapes every node through the gateway in every addressing mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from cloud_gateway.app import GatewayApp
from edge_agent.app import AgentApp
from gpu_exporter.embed import start_embedded_exporter
from raven_cli.demo.portmap import PortMap
from raven_cli.demo.prometheus import (
    DemoPrometheus,
    ScrapeSetup,
    namespaces_work,
    prometheus_binary,
)
from raven_cli.demo.shortlink import ShortLink
from raven_cli.demo.topology import DemoNode, Topology, free_port

log = logging.getLogger(__name__)

#: A line every dcgm-exporter page has.
EXPECTED_METRIC = "DCGM_FI_DEV_GPU_TEMP"


@dataclass(frozen=True)
class ScrapeResult:
    node: str
    mode: str
    ok: bool
    detail: str
    seconds: float


class Demo:
    """Starts and stops every part; knows how to scrape through the gateway."""

    def __init__(self, topology: Topology, *, with_hosts_generator: bool = True) -> None:
        self.topology = topology
        self.with_hosts_generator = with_hosts_generator
        self.gateway: GatewayApp | None = None
        self.agents: dict[str, AgentApp] = {}
        self.exporters: list[Any] = []
        self.hosts_proc: asyncio.subprocess.Process | None = None
        self.hosts_file = topology.workdir / "hosts.d" / "tunnel-nodes"
        self.session: aiohttp.ClientSession | None = None
        self.scrapes = 0
        self.errors = 0
        self.prometheus: DemoPrometheus | None = None
        self.prometheus_note = ""
        self.portmap: PortMap | None = None
        self.shortlink: ShortLink | None = None
        #: when the demo began (the Prometheus link's graph range fits its age)
        self.started_at = time.monotonic()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for node in self.topology.nodes:
            self.exporters.append(await start_embedded_exporter(node.exporter, interval_s=2.0))
        self.gateway = GatewayApp(self.topology.gateway_config())
        await self.gateway.start()
        tunnel_port = self.tunnel_port
        for site in self.topology.sites:
            agent = AgentApp(self.topology.agent_config(site, tunnel_port))
            await agent.start()
            self.agents[site] = agent
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        if self.with_hosts_generator:
            await self._start_hosts_generator()

    async def _start_hosts_generator(self) -> None:
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "raven_cli.main", "coredns-hosts", "run",
            "--source", "registry",
            "--registry-url", f"http://{self.topology.host}:{self.admin_port}",
            "--gateway-address", self.topology.host,
            "--output", str(self.hosts_file),
            "--admin-listen", "off",
            "--poll-interval-s", "1",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    async def start_prometheus(self, port: int) -> None:
        """Start the real Prometheus scraping every node by name through the gateway (DNS mode
        when namespaces allow it, and proxy_url); ``prometheus_note`` says what is missing."""
        binary = prometheus_binary()
        if binary is None:
            self.prometheus_note = (
                "Prometheus is not installed: run scripts/setup as root (it installs Debian's "
                "prometheus package)"
            )
            return
        topo = self.topology
        dns = self.with_hosts_generator and namespaces_work() and await self.wait_hosts_file()
        if dns:  # the Service's port mapping: name:9400 -> gateway -> proxy port
            self.portmap = PortMap((topo.host, topo.gpu_port), (topo.host, self.proxy_port))
            try:
                await self.portmap.start()
            except OSError as exc:
                dns, self.portmap = False, None
                self.prometheus_note = f"DNS mode off: {topo.host}:{topo.gpu_port}: {exc}"
        elif not self.prometheus_note:
            self.prometheus_note = "DNS mode off: no mount namespace (unshare) allowed here"
        setup = ScrapeSetup(
            host=topo.host, proxy_port=self.proxy_port, admin_port=self.admin_port,
            gpu_port=topo.gpu_port, targets=[f"{n.name}:{n.port}" for n in topo.nodes], dns=dns,
        )  # fmt: skip
        prom = DemoPrometheus(topo.workdir, setup, free_port(topo.host, port))
        hosts = self.hosts_file.read_text() if dns else ""
        await prom.start(binary, hosts)
        self.prometheus = prom
        assert self.session is not None
        if not await prom.wait_ready(self.session):
            self.prometheus_note = f"Prometheus did not start: {prom.log_tail()}"
            return
        self.shortlink = ShortLink(prom.graph_url, started=self.started_at)
        try:
            await self.shortlink.start(topo.host, topo.ports.get("link", 0))
        except OSError:  # the fixed port is taken: any free one will do
            await self.shortlink.start(topo.host, 0)

    async def wait_hosts_file(self, timeout_s: float = 15.0) -> bool:
        """Wait until the hosts generator's file lists every node."""
        names = {n.name for n in self.topology.nodes}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and set(self.hosts_entries()) != names:  # noqa: ASYNC110 - polls a file
            await asyncio.sleep(0.2)
        return set(self.hosts_entries()) == names

    async def stop(self) -> None:
        if self.shortlink is not None:
            await self.shortlink.stop()
        if self.prometheus is not None:
            await self.prometheus.stop()
        if self.portmap is not None:
            await self.portmap.stop()
        if self.hosts_proc is not None and self.hosts_proc.returncode is None:
            self.hosts_proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.hosts_proc.wait(), 5)
        if self.session is not None:
            await self.session.close()
        for agent in self.agents.values():
            await agent.stop()
        if self.gateway is not None:
            await self.gateway.stop()
        for exporter in self.exporters:
            await exporter.stop()

    # ------------------------------------------------------------ addresses
    @property
    def tunnel_port(self) -> int:
        assert self.gateway is not None and self.gateway.listener.bound is not None
        return self.gateway.listener.bound[1]

    @property
    def proxy_port(self) -> int:
        assert self.gateway is not None
        return int(self.gateway.proxy.http_address[1])

    @property
    def admin_port(self) -> int:
        assert self.gateway is not None and self.gateway.admin.bound is not None
        return self.gateway.admin.bound[1]

    async def wait_registered(self, timeout_s: float = 20.0) -> bool:
        assert self.gateway is not None
        deadline = time.monotonic() + timeout_s
        names = {n.name for n in self.topology.nodes}
        while time.monotonic() < deadline:
            if all(self.gateway.registry.agents_for(n) for n in names):
                return True
            await asyncio.sleep(0.1)
        return False

    # ------------------------------------------------------------ scraping
    async def scrape(self, node: DemoNode, mode: str) -> ScrapeResult:
        started = time.monotonic()
        try:
            if mode == "connect":
                status, body = await self._scrape_connect(node)
            else:
                status, body = await self._scrape_http(node, mode)
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        else:
            ok = status == 200 and EXPECTED_METRIC in body and f'Hostname="{node.name}"' in body
            detail = f"HTTP {status}" if ok else f"HTTP {status}: {body[:120]!r}"
        self.scrapes += 1
        self.errors += 0 if ok else 1
        return ScrapeResult(node.name, mode, ok, detail, time.monotonic() - started)

    async def _scrape_http(self, node: DemoNode, mode: str) -> tuple[int, str]:
        assert self.session is not None
        gw = f"http://{self.topology.host}:{self.proxy_port}"
        target = f"{node.name}:{node.port}"
        if mode == "dns":  # what Prometheus sends once DNS points the name at the gateway
            req = self.session.get(f"{gw}/metrics", headers={"Host": target})
        elif mode == "proxy":  # proxy_url: absolute-form request line
            req = self.session.get(f"http://{target}/metrics", proxy=gw)
        elif mode == "path":
            req = self.session.get(f"{gw}/proxy/{target}/metrics")
        else:
            raise ValueError(mode)
        async with req as resp:
            return resp.status, await resp.text()

    async def _scrape_connect(self, node: DemoNode) -> tuple[int, str]:
        target = f"{node.name}:{node.port}"
        reader, writer = await asyncio.open_connection(self.topology.host, self.proxy_port)
        try:
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                return status, head.decode(errors="replace")
            writer.write(
                f"GET /metrics HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode()
            )
            raw = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head2, _, body = raw.partition(b"\r\n\r\n")
        status2 = int(head2.split(b" ", 2)[1]) if head2.startswith(b"HTTP/") else 0
        return status2, body.decode(errors="replace")

    async def http_sd_targets(self) -> set[str]:
        assert self.session is not None
        url = f"http://{self.topology.host}:{self.admin_port}/api/v1/targets?port={self.topology.gpu_port}"
        async with self.session.get(url) as resp:
            groups = await resp.json()
        return {t for g in groups for t in g["targets"]}

    def hosts_entries(self) -> dict[str, str]:
        try:
            text = self.hosts_file.read_text()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#"):
                for name in parts[1:]:
                    out[name] = parts[0]
        return out


def workdir_default() -> Path:
    return Path(tempfile.gettempdir()) / f"raven-demo-{os.getpid()}"
