"""Backfill end to end on loopback with the real Prometheus as the remote-write receiver.

An agent learns a target from two scrapes relayed through the gateway, the gateway goes away
(the tunnel is down), the agent scrapes locally and buffers, a gateway comes back on the same
port, the agent backfills, and Prometheus (``--web.enable-remote-write-receiver``,
``out_of_order_time_window``) has the samples under the scrape's labels.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cloud_gateway.app import GatewayApp
from edge_agent.app import AgentApp
from tests.helpers import KeyPair, agent_config, free_port, gateway_config, require, wait_for

pytestmark = pytest.mark.integration
PROMETHEUS = "/usr/bin/prometheus"


class PromProcess:
    """A real Prometheus on loopback receiving remote write (no scrape jobs)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global: {scrape_interval: 15s}\nstorage:\n  tsdb:\n"
                       "    out_of_order_time_window: 1h\n")  # fmt: skip
        self.log = (tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-remote-write-receiver"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp,
        )  # fmt: skip

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read()) if path.startswith("/api") else r.read()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("/-/ready")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        result: list[dict[str, Any]] = self.get(f"/api/v1/query?{q}")["data"]["result"]
        return result

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


async def start_target(counter: list[int]) -> web.AppRunner:
    async def metrics(_request: web.Request) -> web.Response:
        counter[0] += 1
        body = (
            "# TYPE edge_requests counter\n"
            f'edge_requests_total{{code="200"}} {counter[0]}\n'
            'edge_info{job="page-job",version="1"} 1\n'
        )
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    return runner


def backfill_configs(
    tmp_path: Path, prom_port: int, target_port: int, job: str, agent_backfill: dict[str, Any]
) -> tuple[Any, Any]:
    """A gateway writing backfill to the Prometheus on ``prom_port`` and an agent serving
    edge-node-1 (the target on ``target_port``) with its own backfill settings."""
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    tunnel_port = free_port()
    gw_cfg = gateway_config(
        tmp_path, gw, [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-*"]}],
        tunnel_listen=f"127.0.0.1:{tunnel_port}",
        backfill={"enabled": True,
                  "remote_write_url": f"http://127.0.0.1:{prom_port}/api/v1/write",
                  "jobs": [{"port": target_port, "job": job}]},
    )  # fmt: skip
    ag_cfg = agent_config(
        ag, gw, f"127.0.0.1:{tunnel_port}", {"edge-node-1": "127.0.0.1"},
        allowed_ports=[target_port],
        backfill={"enabled": True, "dir": str(tmp_path / "buffer"), **agent_backfill},
    )  # fmt: skip
    return gw_cfg, ag_cfg


async def test_outage_backfilled_into_real_prometheus(tmp_path: Path) -> None:
    require(os.path.exists(PROMETHEUS) and shutil.which("prometheus") is not None,
            "prometheus not installed (scripts/setup installs it as root)")  # fmt: skip
    prom = PromProcess(tmp_path)
    counter = [0]
    target = await start_target(counter)
    target_port = free_port()
    await web.TCPSite(target, "127.0.0.1", target_port).start()
    gw_cfg, ag_cfg = backfill_configs(tmp_path, prom.port, target_port, "edge-node", {})
    gateway = GatewayApp(gw_cfg)
    agent = AgentApp(ag_cfg)
    try:
        await asyncio.to_thread(prom.wait_ready)
        await gateway.start()
        await agent.start()
        await wait_for(lambda: gateway.registry.agents_for("edge-node-1"))
        assert gateway.proxy is not None
        proxy = f"http://127.0.0.1:{gateway.proxy.http_address[1]}"
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # Prometheus's scrapes, 0.5 s apart, through the tunnel
                async with http.get(
                    f"{proxy}/metrics",
                    headers={
                        "Host": f"edge-node-1:{target_port}",
                        "X-Prometheus-Scrape-Timeout-Seconds": "0.4",
                    },
                ) as r:
                    assert r.status == 200  # fmt: skip
                await asyncio.sleep(0.5)
        served = counter[0]
        assert agent.backfill is not None
        (learned,) = agent.backfill.table.targets.values()
        assert learned.interval_s is not None and abs(learned.interval_s - 0.5) < 0.2
        assert learned.timeout_s == 0.4
        # the gateway goes away: the tunnel is down, the agent scrapes on its own
        await gateway.stop()
        await wait_for(lambda: agent.backfill is not None and agent.backfill.store is not None
                       and agent.backfill.store.totals.rows >= 6, timeout_s=20)  # fmt: skip
        local_scrapes = agent.backfill.store.totals.rows
        assert local_scrapes >= 6 and counter[0] > served
        gateway = GatewayApp(gw_cfg)
        await gateway.start()
        await wait_for(lambda: gateway.backfill is not None
                       and gateway.backfill.status.get("site-a") is not None
                       and gateway.backfill.status["site-a"].samples_written >= 12,
                       timeout_s=30)  # fmt: skip
        result = await asyncio.to_thread(
            prom.query, 'count_over_time(edge_requests_total{job="edge-node"}[10m])'
        )
        assert len(result) == 1
        labels = result[0]["metric"]
        assert labels == {"code": "200", "instance": f"edge-node-1:{target_port}",
                          "job": "edge-node"}  # fmt: skip
        assert int(result[0]["value"][1]) >= 6
        info = await asyncio.to_thread(prom.query, "edge_info")
        # honor_labels false: the page's own job is kept as exported_job
        assert info[0]["metric"]["exported_job"] == "page-job"
        assert info[0]["metric"]["job"] == "edge-node"
        # the values are the target's own (its counter at each local scrape)
        values = await asyncio.to_thread(prom.query, 'edge_requests_total{job="edge-node"}[10m]')
        seen = [int(float(v)) for _, v in values[0]["values"]]
        assert seen == sorted(seen) and seen[0] > served and len(set(seen)) == len(seen)
        admin = gateway.admin.bound
        assert admin is not None
        url = f"http://127.0.0.1:{admin[1]}/api/v1/agents"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            body = await r.json()
        (site,) = body["agents"]
        assert site["backfill"]["samples_written"] >= 12
        url = f"http://127.0.0.1:{admin[1]}/api/v1/status"  # what `raven status` reads
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            status = await r.json()
        (row,) = status["agents"]
        assert row["site"] == "site-a" and row["backfill"]["samples_written"] >= 12
    finally:
        await agent.stop()
        await gateway.stop()
        await target.cleanup()
        await asyncio.to_thread(prom.stop)


MIB = 1024 * 1024
CAP_SERIES = 5000


async def start_big_target() -> tuple[web.AppRunner, int, dict[str, bool]]:
    """A page of 5000 series whose (stable) random label values make each stored scrape
    about 200 KiB, so a 10 MiB buffer overflows in seconds. Its counter counts the pages
    served; with ``switch["down"]`` it answers 503 (no page, nothing stored)."""
    labels = [os.urandom(24).hex() for _ in range(CAP_SERIES)]
    scrapes = [0]
    switch = {"down": False}

    async def metrics(_request: web.Request) -> web.Response:
        if switch["down"]:
            return web.Response(status=503)
        scrapes[0] += 1
        lines = [f'cap_test{{i="{i}",id="{v}"}} {scrapes[0]}' for i, v in enumerate(labels)]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port, switch


def local_failures(agent: AgentApp) -> float:
    """Local scrapes the agent counted as failed by an HTTP error status."""
    value = agent.metrics_registry.get_sample_value(
        "raven_agent_backfill_local_scrapes_total", {"result": "http_error"}
    )
    return value or 0.0


async def wait_store_settled(store: Any, quiet_s: float, timeout_s: float) -> None:
    """Until the store's rows and drops have not moved for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = (store.totals.rows, store.dropped["cap"])
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the backfill store kept changing for {timeout_s} s")


async def test_buffer_cap_overflow_keeps_the_newest(tmp_path: Path) -> None:
    """A 10 MiB buffer overflowed while the gateway is away: the oldest scrapes are dropped
    and counted, the disk stays within the cap, and the newest are all backfilled."""
    require(os.path.exists(PROMETHEUS), "prometheus not installed (scripts/setup installs it)")
    prom = PromProcess(tmp_path)
    target, target_port, switch = await start_big_target()
    gw_cfg, ag_cfg = backfill_configs(
        tmp_path, prom.port, target_port, "cap",
        {"max_bytes": 10 * MIB,
         "targets": [{"node": "edge-node-1", "port": target_port,
                      "interval_s": 0.2, "timeout_s": 0.2}]},
    )  # fmt: skip
    agent = AgentApp(ag_cfg)
    gateway = GatewayApp(gw_cfg)
    try:
        await asyncio.to_thread(prom.wait_ready)
        await agent.start()  # no gateway yet: the tunnel is down, the agent scrapes alone
        bf = agent.backfill
        assert bf is not None and bf.store is not None
        store = bf.store
        await wait_for(lambda: store.dropped["cap"] > 0, timeout_s=120, interval_s=0.1)
        rows_at_first_drop = store.totals.rows
        await wait_for(lambda: store.totals.rows >= 1 and store.dropped["cap"] >= 3 * CAP_SERIES,
                       timeout_s=60, interval_s=0.1)  # fmt: skip
        # disk within the cap: the rows' bytes, the file (freed pages reused) plus the WAL
        assert store.totals.bytes <= 10 * MIB
        assert store.file_bytes() <= 10 * MIB * 1.15 + store.journal_limit_bytes
        assert store.dropped["cap"] % CAP_SERIES == 0
        # The target stops serving before the tunnel is back, so that nothing is stored once
        # sending starts: a row stored then overflows the cap again with a batch in flight,
        # and eviction spares the batch (its rows are on their way), taking newer rows
        # instead; the ordering asserted below holds for what overflowed while down.
        switch["down"] = True
        await wait_for(lambda: local_failures(agent) >= 3, timeout_s=30)
        # pages scraped before the switch may still wait to be parsed and stored (a thread):
        # the store is settled once nothing changed for 2 s
        await wait_store_settled(store, quiet_s=2.0, timeout_s=60)
        await gateway.start()  # the tunnel comes up; Prometheus never scrapes this target
        await wait_for(lambda: bf.table.local_count == 0, timeout_s=20)
        await wait_for(lambda: store.totals.rows == 0, timeout_s=120, interval_s=0.2)
        dropped = store.dropped["cap"]
        assert gateway.backfill is not None
        written = gateway.backfill.status["site-a"].samples_written
        result = await asyncio.to_thread(prom.query, 'count_over_time(cap_test{i="0"}[1h])')
        backfilled = int(result[0]["value"][1])
        assert written == backfilled * CAP_SERIES  # every kept scrape reached Prometheus
        assert backfilled >= rows_at_first_drop - 2
        values = await asyncio.to_thread(prom.query, 'cap_test{i="0"}[1h]')
        got = [int(float(v)) for _, v in values[0]["values"]]
        # the target's counter at each scrape (a scrape that timed out under load skips
        # one): the oldest were dropped, the newest kept, in order
        assert got == sorted(got) and len(set(got)) == len(got)
        assert got[0] >= dropped // CAP_SERIES + 1
        gauge = agent.metrics_registry.get_sample_value(
            "raven_agent_backfill_samples_dropped_total", {"reason": "cap"}
        )
        assert gauge == dropped
    finally:
        await agent.stop()
        await gateway.stop()
        await target.cleanup()
        await asyncio.to_thread(prom.stop)
