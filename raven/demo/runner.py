"""Runs the demo topology in one process: gateway, edge agents, simulated GPU nodes and
the hosts generator; scrapes every node through the gateway in every addressing mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
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
from raven.demo.topology import DemoNode, Topology

log = logging.getLogger(__name__)

MODES = ("dns", "proxy", "path", "connect")
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
            sys.executable, "-m", "raven.cli", "coredns-hosts", "run",
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

    async def stop(self) -> None:
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


async def run_check(demo: Demo) -> int:
    """Scrape every node in every mode, check http_sd and the hosts file; 0 if all pass."""
    failures = 0
    if not await demo.wait_registered():
        print("FAIL: not every node registered within 20 s")
        return 1
    results = await asyncio.gather(*(demo.scrape(n, m) for n in demo.topology.nodes for m in MODES))
    for r in sorted(results, key=lambda r: (r.node, r.mode)):
        mark = "ok  " if r.ok else "FAIL"
        print(f"{mark} {r.node:<16} {r.mode:<8} {r.seconds * 1000:7.1f} ms  {r.detail}")
        failures += 0 if r.ok else 1
    expected = {f"{n.name}:{n.port}" for n in demo.topology.nodes}
    sd = await demo.http_sd_targets()
    sd_ok = sd == expected
    print(f"{'ok  ' if sd_ok else 'FAIL'} http_sd lists {len(sd)} of {len(expected)} targets")
    failures += 0 if sd_ok else 1
    if demo.with_hosts_generator:
        deadline = time.monotonic() + 15
        names = {n.name for n in demo.topology.nodes}
        while time.monotonic() < deadline and set(demo.hosts_entries()) != names:  # noqa: ASYNC110 - polls a file
            await asyncio.sleep(0.2)
        entries = demo.hosts_entries()
        proc = demo.hosts_proc
        if set(entries) != names and proc and proc.returncode is not None and proc.stderr:
            err = (await proc.stderr.read()).decode(errors="replace")
            print(f"hosts generator exited {proc.returncode}: {err[-600:]}")
        hosts_ok = set(entries) == names and set(entries.values()) == {demo.topology.host}
        print(
            f"{'ok  ' if hosts_ok else 'FAIL'} hosts file maps {len(entries)} names "
            f"to the gateway ({demo.hosts_file})"
        )
        failures += 0 if hosts_ok else 1
    total = len(results) + 1 + (1 if demo.with_hosts_generator else 0)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


def print_intro(demo: Demo) -> None:
    host, proxy, admin = demo.topology.host, demo.proxy_port, demo.admin_port
    first = demo.topology.nodes[0].name
    print(f"""
Raven demo: cloud gateway + {len(demo.agents)} edge sites + {len(demo.topology.nodes)} GPU nodes
  tunnel   {host}:{demo.tunnel_port}     proxy {host}:{proxy}     admin http://{host}:{admin}
  hosts file for CoreDNS/dnsmasq: {demo.hosts_file}

Prometheus scrape configs (one per addressing mode):
  - job_name: dns-mode        # CoreDNS hosts file maps node names to the gateway
    static_configs: [{{targets: ["{first}:9400"]}}]
  - job_name: proxy-mode
    proxy_url: http://{host}:{proxy}
    http_sd_configs: [{{url: "http://{host}:{admin}/api/v1/targets?port=9400"}}]
  - job_name: path-mode
    static_configs: [{{targets: ["{first}:9400"]}}]
    relabel_configs:
      - {{source_labels: [__address__, __metrics_path__], regex: "(.+);(.*)",
         target_label: __metrics_path__, replacement: "/proxy/${{1}}${{2}}"}}
      - {{source_labels: [__address__], target_label: instance}}
      - {{target_label: __address__, replacement: "{host}:{proxy}"}}

Try:
  curl -s -H 'Host: {first}:9400' http://{host}:{proxy}/metrics | head
  curl -s -x http://{host}:{proxy} http://{first}:9400/metrics | head
  curl -s http://{host}:{proxy}/proxy/{first}:9400/metrics | head
  curl -s http://{host}:{admin}/api/v1/nodes
  curl -s http://{host}:{proxy}/proxy/no-such-node:9400/metrics     # 404, one-line reason
""")


async def status_loop(demo: Demo, interval_s: float = 3.0) -> None:
    """Scrape every node like Prometheus would and print a status table."""
    assert demo.gateway is not None
    last_scrapes, last_t = 0, time.monotonic()
    while True:
        await asyncio.gather(*(demo.scrape(n, "dns") for n in demo.topology.nodes))
        await asyncio.sleep(interval_s)
        now = time.monotonic()
        rate = (demo.scrapes - last_scrapes) / (now - last_t)
        last_scrapes, last_t = demo.scrapes, now
        rows = demo.gateway.registry.agents_json()["agents"]
        assert isinstance(rows, list)
        print(f"\n{time.strftime('%H:%M:%S')}  scrapes/s {rate:5.1f}  errors {demo.errors}")
        print(f"  {'agent':<10} {'peer':<22} {'nodes':>5} {'streams':>7} {'rtt ms':>8}")
        for row in rows:
            rtt = row["rtt_seconds"]
            rtt_text = f"{rtt * 1000:8.2f}" if isinstance(rtt, float) else "       -"
            print(
                f"  {row['agent']:<10} {row['remote_address']:<22} {len(row['nodes']):>5} "
                f"{row['open_streams']:>7} {rtt_text}"
            )
        if not rows:
            print("  (no agent connected)")


async def run_demo(topology: Topology, *, check: bool, duration_s: float | None) -> int:
    demo = Demo(topology)
    try:
        await demo.start()
        if check:
            return await run_check(demo)
        print_intro(demo)
        await demo.wait_registered()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C and kill both stop cleanly
            loop.add_signal_handler(sig, stop.set)
        status = asyncio.create_task(status_loop(demo))
        try:
            async with asyncio.timeout(duration_s):
                await stop.wait()
        except TimeoutError:
            pass
        status.cancel()
        await asyncio.gather(status, return_exceptions=True)
        print("\nstopping: agents, gateway, exporters, hosts generator")
        return 0
    finally:
        await demo.stop()


def workdir_default() -> Path:
    return Path(tempfile.gettempdir()) / f"raven-demo-{os.getpid()}"
