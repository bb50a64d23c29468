"""Live-registry and static sources, the admin endpoints, and the CLI as a process (loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.render import parse_hosts
from coredns_hosts.runner import HostsGenerator, admin_server
from coredns_hosts.sinks.file import FileSink
from coredns_hosts.sources.registry import RegistrySource
from coredns_hosts.sources.static import StaticSource
from prometheus_client import CollectorRegistry

from tests.helpers import free_port, python_env, wait_for

pytestmark = pytest.mark.integration
V4, V6 = ipaddress.ip_address("10.96.0.50"), ipaddress.ip_address("fd00::50")


def hosts(path: Path) -> dict[str, frozenset[object]]:
    try:
        return dict(parse_hosts(path.read_text()))
    except FileNotFoundError:
        return {}


class FakeGateway:
    def __init__(self) -> None:
        self.status = 200
        self.body = json.dumps({"nodes": []})

    def set_nodes(self, **reachable: bool) -> None:
        nodes = [
            {
                "node": n.replace("_", "-"),
                "reachable": r,
                "agents": [
                    {
                        "agent": "site-a",
                        "connected_since": "2026-11-22T04:00:00Z",
                        "rtt_seconds": 0.001,
                    }
                ]
                if r
                else [],
            }
            for n, r in reachable.items()
        ]
        self.body = json.dumps({"nodes": nodes})

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(status=self.status, text=self.body, content_type="application/json")


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve_admin(gen: HostsGenerator) -> AsyncIterator[str]:
    admin = admin_server(gen, "127.0.0.1:0")
    await admin.start()
    assert admin.bound is not None
    try:
        yield f"http://127.0.0.1:{admin.bound[1]}"
    finally:
        await admin.stop()


@contextlib.asynccontextmanager
async def running(gen: HostsGenerator) -> AsyncIterator[None]:
    task = asyncio.create_task(gen.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def err(reg: CollectorRegistry, stage: str, reason: str) -> float:
    return reg.get_sample_value("raven_hosts_errors_total", {"stage": stage, "reason": reason}) or 0


async def test_registry_source_reachable_names_and_garbage(tmp_path: Path) -> None:
    gw = FakeGateway()
    gw.set_nodes(edge_gpu_1=True, edge_gpu_2=False)
    app = web.Application()
    app.router.add_get("/api/v1/nodes", gw.handle)
    out = tmp_path / "tunnel-nodes"
    metrics = HostsMetrics(CollectorRegistry())
    async with serve(app) as url:
        source = RegistrySource([url], gateway_addresses=[V4, V6], metrics=metrics, interval_s=0.05)
        gen = HostsGenerator(source, [FileSink(out)], metrics=metrics, debounce_s=0.01)
        async with running(gen), serve_admin(gen) as admin:
            both = frozenset({V4, V6})
            await wait_for(lambda: hosts(out) == {"edge-gpu-1": both}, "reachable only")
            gw.set_nodes(edge_gpu_1=True, edge_gpu_2=True)
            await wait_for(lambda: len(hosts(out)) == 2, "second node reachable")
            good = out.read_text()
            gw.body = '{"nodes": [{"node": "edge-gpu-1", "reach'
            await wait_for(lambda: err(metrics.registry, "source", "registry") >= 2, "garbage")
            gw.body, gw.status = "upstream down", 502
            await wait_for(lambda: err(metrics.registry, "source", "registry") >= 4, "502")
            assert out.read_text() == good  # last good view kept
            async with aiohttp.ClientSession() as session:
                async with session.get(admin + "/metrics") as resp:
                    text = await resp.text()
                    assert resp.status == 200
                    assert 'raven_hosts_writes_total{sink="file"} 2.0' in text
                    assert "raven_hosts_entries 2.0" in text
                    assert "raven_hosts_last_success_timestamp_seconds" in text
                for path in ("/healthz", "/readyz"):
                    async with session.get(admin + path) as resp:
                        assert resp.status == 200, path
            gw.status = 200
            gw.set_nodes(edge_gpu_2=False, edge_gpu_1=False, edge_gpu_3=True)
            await wait_for(lambda: set(hosts(out)) == {"edge-gpu-3"}, "recovered")


async def test_registry_never_answering_is_not_ready(tmp_path: Path) -> None:
    metrics = HostsMetrics(CollectorRegistry())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        source = RegistrySource([dead], gateway_addresses=[V4], metrics=metrics, interval_s=0.05)
        gen = HostsGenerator(source, [FileSink(tmp_path / "h")], metrics=metrics, retry_s=0.05)
        async with running(gen), serve_admin(gen) as admin:
            await wait_for(lambda: err(metrics.registry, "source", "registry") >= 2, "errors")
            async with aiohttp.ClientSession() as session, session.get(admin + "/readyz") as r:
                assert r.status == 503
                assert "not ready" in await r.text()
    assert not (tmp_path / "h").exists()


async def test_static_source_follows_file_and_keeps_last_good(tmp_path: Path) -> None:
    static = tmp_path / "nodes.yaml"
    static.write_text("gateway_addresses: [10.96.0.50]\nnodes: [edge-a]\n")
    out = tmp_path / "hosts"
    metrics = HostsMetrics(CollectorRegistry())
    source = StaticSource(static, gateway_addresses=[], metrics=metrics, interval_s=0.05)
    gen = HostsGenerator(source, [FileSink(out)], metrics=metrics, debounce_s=0.01)
    async with running(gen):
        await wait_for(lambda: set(hosts(out)) == {"edge-a"}, "first read")
        static.write_text("gateway_addresses: [10.96.0.50]\nnodes: [edge-a, edge-b, x_bad]\n")
        await wait_for(lambda: set(hosts(out)) == {"edge-a", "edge-b"}, "file changed")
        good = out.read_text()
        static.write_text("nodes: [edge-c\n")
        await wait_for(lambda: err(metrics.registry, "source", "static_input") >= 1, "bad YAML")
        assert out.read_text() == good
        assert metrics.registry.get_sample_value("raven_hosts_invalid_names") == 1


async def test_cli_run_process_serves_admin_and_stops_on_sigterm(tmp_path: Path) -> None:
    static = tmp_path / "nodes.yaml"
    static.write_text("- edge-a\n- edge-b\n")
    out, port = tmp_path / "hosts", free_port()
    env = {**os.environ, **python_env()}
    cmd = [
        sys.executable,
        "-m",
        "coredns_hosts",
        "run",
        "--source",
        "static",
        "--static-file",
        str(static),
        "--gateway-address",
        "10.96.0.50",
        "--gateway-address",
        "fd00::50",
        "--output",
        str(out),
        "--admin-listen",
        f"127.0.0.1:{port}",
        "--poll-interval-s",
        "0.05",
    ]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        await wait_for(lambda: set(hosts(out)) == {"edge-a", "edge-b"}, "process wrote")
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("readyz never answered 200")
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 10)
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    from coredns_hosts.__main__ import main

    assert main(["run", "--once", "--source", "registry"]) == 2
    assert main(["run", "--once", "--source", "static", "--static-file", str(tmp_path / "x")]) == 2
    assert main(["check", "--server", "not-an-ip", "--hosts-file", str(tmp_path / "x")]) == 2
