"""Backfill rate and its effect on live scrapes: 100 nodes behind one agent, a 30-minute
outage simulated by pre-filling the agent's buffer, real Prometheus, all on loopback.

    targets process (100 node pages on 127.0.0.1) <-- `raven agent` ==tunnel== `raven gateway`
        <--proxy_url-- Prometheus (scrapes the 100 nodes every --interval-s)
                       Prometheus <--remote write-- gateway (backfill)

1. Quiet: the agent runs with an empty buffer; the driver sends live scrapes through the
   gateway's proxy (one at a time, round robin over the nodes) for --probe-s and records
   their latency.
2. The agent stops; its buffer is pre-filled with the scrapes of a --outage-s outage (every
   node, every --interval-s, --samples samples each, timestamps in the past); the agent starts
   again and backfills while the driver keeps probing.
3. Rate: buffered samples written to Prometheus (acknowledged) per second, from the agent's
   start to an empty buffer; live latency p50/p99 during the backfill against the quiet run.
   Prometheus's count of one backfilled series is checked against what was buffered.

Usage: python bench/bench_backfill.py [--nodes 100] [--outage-s 1800] [--interval-s 15]
                                      [--samples 200] [--probe-s 20]
Needs Prometheus (apt-get install -y prometheus). Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_agent.backfill.learn import Target  # noqa: E402
from edge_agent.backfill.store import BufferStore  # noqa: E402
from raven.backfill.wire import Sample, Scrape  # noqa: E402
from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file  # noqa: E402
from tests.helpers import free_port  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
RAVEN = [sys.executable, "-m", "raven_cli.main"]

TARGETS_CODE = """
import asyncio, sys
from aiohttp import web
samples = int(sys.argv[2])
page = "".join(f'bench_metric{{i="{i}",kind="k{i % 7}"}} {i * 1.5}\\n' for i in range(samples))
async def metrics(_):
    return web.Response(text=page, content_type="text/plain")
app = web.Application(); app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def node(i: int) -> str:
    return f"bench-n{i:03d}"


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def wait(what: str, predicate: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if predicate():
                return time.monotonic() - started
        except (OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def agent_metric(admin: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    return 0.0


def prefill(db: Path, args: argparse.Namespace, target_port: int, end: float) -> int:
    """Scrapes of every node every interval over the outage, ending at ``end`` (before
    Prometheus's first live scrape: only scrapes Prometheus missed are backfilled)."""
    store = BufferStore(db, max_bytes=1 << 30, max_age_s=86400)
    now = time.time()
    count = 0
    rng = random.Random(1)
    slots = int(args.outage_s / args.interval_s)
    for k in range(slots):
        ts = int((end - (slots - k) * args.interval_s) * 1000)
        for i in range(args.nodes):
            samples: list[Sample] = [
                (
                    "bench_metric",
                    (("i", str(j)), ("kind", f"k{j % 7}")),
                    j * 1.5 + rng.random(),
                    None,
                )
                for j in range(args.samples)
            ]
            store.add(Scrape(node(i), target_port, "/metrics", ts, tuple(samples)), int(now * 1000))
            count += args.samples
    for i in range(args.nodes):
        store.save_target(Target(node(i), target_port, "/metrics", "", 10.0, args.interval_s, now))
    store.close()
    return count


async def probe(proxy: int, target_port: int, nodes: int, seconds: float) -> list[float]:
    """Live scrapes through the gateway, one at a time, round robin; latencies in seconds."""
    import aiohttp

    out: list[float] = []
    deadline = time.monotonic() + seconds
    i = 0
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            host = f"{node(i % nodes)}:{target_port}"
            started = time.monotonic()
            async with s.get(f"http://127.0.0.1:{proxy}/metrics", headers={"Host": host}) as r:
                await r.read()
                if r.status == 200:
                    out.append(time.monotonic() - started)
            i += 1
            await asyncio.sleep(0.05)
    return out


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


@dataclass
class Ports:
    target: int = field(default_factory=free_port)
    prom: int = field(default_factory=free_port)
    proxy: int = field(default_factory=free_port)
    tunnel: int = field(default_factory=free_port)
    gw_admin: int = field(default_factory=free_port)
    ag_admin: int = field(default_factory=free_port)


def write_configs(tmp: Path, args: argparse.Namespace, p: Ports) -> None:
    gw_priv, ag_priv = generate_private_key(), generate_private_key()
    write_private_key_file(tmp / "gw.key", gw_priv)
    write_private_key_file(tmp / "ag.key", ag_priv)
    targets = [f"{node(i)}:{p.target}" for i in range(args.nodes)]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{int(args.interval_s)}s", "scrape_timeout": "10s"},
        "storage": {"tsdb": {"out_of_order_time_window": "2h"}},
        "scrape_configs": [{"job_name": "bench", "proxy_url": f"http://127.0.0.1:{p.proxy}",
                            "static_configs": [{"targets": targets}]}],
    }))  # fmt: skip
    (tmp / "gateway.yaml").write_text(yaml.safe_dump({
        "private_key_file": str(tmp / "gw.key"), "tunnel_listen": f"127.0.0.1:{p.tunnel}",
        "admin_listen": f"127.0.0.1:{p.gw_admin}",
        "agents": [{"name": "site", "public_key": encode_key(public_key(ag_priv)),
                    "nodes": ["bench-*"]}],
        "proxy": {"http_listen": f"127.0.0.1:{p.proxy}", "tls_listeners": []},
        "backfill": {"enabled": True, "out_of_order_window_s": 7200,
                     "remote_write_url": f"http://127.0.0.1:{p.prom}/api/v1/write",
                     "jobs": [{"port": p.target, "job": "bench"}]},
    }))  # fmt: skip
    (tmp / "agent.yaml").write_text(yaml.safe_dump({
        "private_key_file": str(tmp / "ag.key"), "gateway": f"127.0.0.1:{p.tunnel}",
        "gateway_public_key": encode_key(public_key(gw_priv)),
        "nodes": {node(i): "127.0.0.1" for i in range(args.nodes)},
        "allowed_ports": [p.target], "admin_listen": f"127.0.0.1:{p.ag_admin}",
        "backfill": {"enabled": True, "dir": str(tmp / "buffer")},
    }))  # fmt: skip


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: list[str]) -> None:
        with (self.tmp / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, name: str) -> None:
        p = self.procs.pop(name)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the process's peak resident memory."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def agent_status(p: Ports) -> Any:
    return http_json(f"http://127.0.0.1:{p.ag_admin}/api/v1/status")


def run(tmp: Path, args: argparse.Namespace, procs: Procs) -> None:
    p = Ports()
    write_configs(tmp, args, p)
    first_live = time.time()
    procs.start("targets", [sys.executable, "-c", TARGETS_CODE, str(p.target), str(args.samples)])
    procs.start("prometheus", [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{p.prom}",
                               "--web.enable-remote-write-receiver"])  # fmt: skip
    procs.start("gateway", [*RAVEN, "gateway", "--config", str(tmp / "gateway.yaml")])
    procs.start("agent", [*RAVEN, "agent", "--config", str(tmp / "agent.yaml")])
    wait("the tunnel", lambda: agent_status(p)["gateways"][0]["up"], 60)
    wait("Prometheus", lambda: urllib.request.urlopen(f"http://127.0.0.1:{p.prom}/-/ready"), 60)
    quiet = asyncio.run(probe(p.proxy, p.target, args.nodes, args.probe_s))
    procs.stop("agent")
    t0 = time.monotonic()
    total = prefill(tmp / "buffer" / "buffer.sqlite3", args, p.target, first_live - 1)
    prefill_s = time.monotonic() - t0
    db_mib = (tmp / "buffer" / "buffer.sqlite3").stat().st_size / 2**20
    started = time.monotonic()
    procs.start("agent", [*RAVEN, "agent", "--config", str(tmp / "agent.yaml")])
    wait("the tunnel again", lambda: agent_status(p)["gateways"][0]["up"], 60)
    during = asyncio.run(probe(p.proxy, p.target, args.nodes, args.probe_s))
    wait("an empty buffer", lambda: agent_status(p)["backfill"]["buffered_samples"] == 0, 3600)
    elapsed = time.monotonic() - started
    rss = {name: peak_rss_mib(procs.procs[name].pid) for name in ("agent", "gateway")}
    sent = agent_metric(p.ag_admin, "raven_agent_backfill_sent_samples_total")
    sent_mib = agent_metric(p.ag_admin, "raven_agent_backfill_sent_bytes_total") / 2**20
    series = f'bench_metric{{i="0",instance="{node(0)}:{p.target}"}}'
    q = urllib.parse.urlencode({"query": f"count_over_time({series}[3h])"})
    stored = http_json(f"http://127.0.0.1:{p.prom}/api/v1/query?{q}")["data"]["result"]
    after = asyncio.run(probe(p.proxy, p.target, args.nodes, args.probe_s))
    print(f"### Backfill: {args.nodes} nodes, a {args.outage_s / 60:.0f}-minute outage, a scrape"
          f" every {args.interval_s:g} s of {args.samples} samples\n")  # fmt: skip
    print("| | value |\n|---|---|")
    print(f"| buffered (pre-filled) | {total:,} samples, {db_mib:.1f} MiB on disk"
          f" (filled in {prefill_s:.0f} s) |")  # fmt: skip
    print(f"| backfilled, agent start to empty buffer | {sent:,.0f} samples in {elapsed:.1f} s"
          f" = **{sent / elapsed:,.0f} samples/s** ({sent_mib / elapsed:.2f} MiB/s in the tunnel) |")  # fmt: skip
    print(f"| peak RSS (VmHWM) | agent {rss['agent']:.0f} MiB (restarted with the full buffer),"
          f" gateway {rss['gateway']:.0f} MiB |")  # fmt: skip
    got = stored[0]["value"][1] if stored else "none"
    print(f"| Prometheus: samples of one series over 3 h | {got} (outage slots:"
          f" {int(args.outage_s / args.interval_s)}, plus the live scrapes) |")  # fmt: skip
    for name, lat in (
        ("quiet, before", quiet),
        ("during backfill", during),
        ("quiet, after", after),
    ):
        print(f"| live scrape latency, {name} | p50 {pct(lat, 50) * 1000:.1f} ms,"
              f" p99 {pct(lat, 99) * 1000:.1f} ms (n={len(lat)}) |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--outage-s", type=float, default=1800)
    ap.add_argument("--interval-s", type=float, default=15)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--probe-s", type=float, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-backfill-"))
    procs = Procs(tmp)
    try:
        run(tmp, args, procs)
    finally:
        procs.stop_all()
        print(f"\n(work dir {tmp})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
