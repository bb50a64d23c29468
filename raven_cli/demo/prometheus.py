"""The demo's real Prometheus (Debian's ``prometheus``): it scrapes the simulated edge GPU nodes
by name through the gateway, in DNS mode and through ``proxy_url``, exactly as in a cluster.

DNS mode needs the node names to resolve to the gateway. On loopback, without touching the
machine's /etc/hosts, Prometheus runs in a mount namespace of its own (``unshare``; a user
namespace too when not root) where /etc/hosts is the machine's plus the hosts file the hosts
generator wrote. Where namespaces are not allowed, only the ``proxy_url`` job runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

#: The ready-made query of the printed graph URL.
GPU_QUERY = 'avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{job="edge-gpu-dns"})'
PROXY_GPU_QUERY = 'avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{job="edge-gpu-proxy"})'
DEFAULT_PORT = 9090


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def namespaces_work() -> bool:
    """Whether ``unshare`` can give Prometheus its own /etc/hosts here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, *_unshare_flags(), "true"]
    return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0


def _unshare_flags() -> list[str]:
    return ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]


@dataclass(frozen=True)
class ScrapeSetup:
    """Where Prometheus finds the gateway and the nodes."""

    host: str
    proxy_port: int
    admin_port: int
    gpu_port: int
    targets: list[str]  # node:port
    dns: bool


def config(setup: ScrapeSetup) -> dict[str, Any]:
    """The prometheus.yml: one job per addressing mode the demo can run."""
    jobs: list[dict[str, Any]] = []
    if setup.dns:
        jobs.append({
            "job_name": "edge-gpu-dns",  # names resolve to the gateway (the hosts file)
            "static_configs": [{"targets": setup.targets}],
        })  # fmt: skip
    jobs.append({
        "job_name": "edge-gpu-proxy",  # the gateway as forward proxy, targets from http_sd
        "proxy_url": f"http://{setup.host}:{setup.proxy_port}",
        "http_sd_configs": [{
            "url": f"http://{setup.host}:{setup.admin_port}/api/v1/targets?port={setup.gpu_port}",
            "refresh_interval": "5s",
        }],
    })  # fmt: skip
    return {
        "global": {"scrape_interval": "5s", "scrape_timeout": "4s"},
        "scrape_configs": jobs,
    }


class DemoPrometheus:
    """Runs Prometheus for the demo; ``url`` is its web UI."""

    def __init__(self, workdir: Path, setup: ScrapeSetup, port: int) -> None:
        self.dir = workdir / "prometheus"
        self.setup = setup
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None
        self.log_path = self.dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{self.setup.host}:{self.port}"

    def graph_url(self, range_input: str = "5m") -> str:
        """The GPU utilisation graph over the last ``range_input`` (a Prometheus duration)."""
        query = GPU_QUERY if self.setup.dns else PROXY_GPU_QUERY
        params = {"g0.expr": query, "g0.tab": "0", "g0.range_input": range_input}
        return f"{self.url}/graph?{urllib.parse.urlencode(params)}"

    def command(self, binary: str, hosts_entries: str) -> list[str]:
        """Write prometheus.yml (and the hosts file of DNS mode); the command line to run."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config(self.setup), sort_keys=False))
        argv = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address={self.setup.host}:{self.port}",
            "--log.level=warn",
        ]
        if not self.setup.dns:
            return argv
        hosts = self.dir / "hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + "\n# raven demo\n" + hosts_entries)
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        unshare = shutil.which("unshare") or "unshare"
        return [unshare, *_unshare_flags(), "sh", "-c", script, str(hosts), *argv]

    async def start(self, binary: str, hosts_entries: str) -> None:
        argv = self.command(binary, hosts_entries)
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL
            )

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float = 30.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                return False
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"{self.url}/-/ready") as resp:
                    if resp.status == 200:
                        return True
            await asyncio.sleep(0.2)
        return False

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-800:]
        except OSError:
            return ""

    async def query(self, session: aiohttp.ClientSession, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        async with session.get(url) as resp:
            body = json.loads(await resp.text())
        result: list[dict[str, Any]] = body.get("data", {}).get("result", [])
        return result

    async def targets(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        async with session.get(f"{self.url}/api/v1/targets?state=active") as resp:
            body = json.loads(await resp.text())
        active: list[dict[str, Any]] = body.get("data", {}).get("activeTargets", [])
        return active

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
