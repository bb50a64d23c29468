"""Benchmark of raven.kube's reflector against the fake API server (tests/helpers/fakekube/, real HTTP
and wire format on loopback); prints Markdown.

1. first sync: a paged list (500 per page) of N edge Nodes into the agent's node table;
2. watch throughput: N MODIFIED events (an address change on every node) applied;
3. memory: what the cache retains for N nodes (decoded values only: name and InternalIP), and
   the RSS cost of importing raven.kube vs the ``kubernetes`` client.

The fake server runs in a thread of this process, so wall times include it (it is the slower
part); the CPU time of the reflector's own thread (client, JSON, decode, cache) is given apart.

Run: .venv/bin/python bench/bench_kube.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_agent.nodes_k8s import KubernetesNodeWatcher  # noqa: E402
from raven.kube.client import ApiConfig, KubeClient  # noqa: E402
from tests.helpers.fakekube import FakeKube  # noqa: E402

EDGE = {"raven.io/site": "a"}


def cache_bytes(watcher: KubernetesNodeWatcher) -> int:
    """What the cache retains: its dict, keys and decoded (name, address) values."""
    items = watcher.cache.items
    total = sys.getsizeof(items)
    for key, value in items.items():
        total += sys.getsizeof(key) + sys.getsizeof(value) + sum(map(sys.getsizeof, value))
    return total


def import_rss_mib(modules: str) -> float:
    code = (
        f"import {modules}, pathlib; print(next(l.split()[1] for l in "
        "pathlib.Path('/proc/self/status').read_text().splitlines() if l.startswith('VmRSS:')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


def ip(i: int) -> str:
    return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"


async def run(nodes: int) -> list[str]:
    rows: list[str] = []
    with FakeKube(bookmark_interval_s=5) as kube:
        for i in range(nodes):
            kube.put_node(f"edge-{i:05d}", EDGE, ip(i))
        tables: list[dict[str, str]] = []

        async def record(table: dict[str, str]) -> None:
            tables.append(table)

        client = KubeClient(ApiConfig(kube.url))
        watcher = KubernetesNodeWatcher(client, "raven.io/site=a", record, debounce_s=0.05)
        started, cpu = time.perf_counter(), time.thread_time()
        task = asyncio.create_task(watcher.run())
        while not tables or len(tables[-1]) < nodes:
            await asyncio.sleep(0.005)
        listed, listed_cpu = time.perf_counter() - started, time.thread_time() - cpu
        retained = cache_bytes(watcher)
        while kube.open_watches == 0:
            await asyncio.sleep(0.01)
        started, cpu = time.perf_counter(), time.thread_time()
        for i in range(nodes):
            kube.put_node(f"edge-{i:05d}", EDGE, ip(i + nodes))
        want = ip(2 * nodes - 1)
        while watcher.nodes.get(f"edge-{nodes - 1:05d}") != want:
            await asyncio.sleep(0.005)
        watched, watched_cpu = time.perf_counter() - started, time.thread_time() - cpu
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    rows.append(
        f"| first list of {nodes:,} Nodes (pages of 500) into the table | {listed:.2f} s wall, "
        f"{listed_cpu:.2f} s CPU on the reflector's thread |"
    )
    rows.append(
        f"| {nodes:,} MODIFIED events (put by the test, streamed, applied) | {watched:.2f} s wall, "
        f"{watched_cpu:.2f} s CPU ({nodes / watched_cpu:,.0f} events per CPU-second) |"
    )
    rows.append(f"| retained by the cache for {nodes:,} nodes | {retained / 1024 / 1024:.1f} MiB |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    rows = asyncio.run(run(args.nodes))
    base = import_rss_mib("yaml")
    ours = import_rss_mib("yaml, raven.kube.reflector")
    theirs = import_rss_mib("yaml, kubernetes.client, kubernetes.watch, kubernetes.config")
    print("| reflector against tests/helpers/fakekube (loopback) | |")
    print("|---|---|")
    print("\n".join(rows))
    print(f"| import: Python + PyYAML | {base:.1f} MiB RSS |")
    print(f"| import: + raven.kube (aiohttp included) | {ours:.1f} MiB (+{ours - base:.1f}) |")
    print(
        f"| import: + kubernetes client (what the agent loaded before) | {theirs:.1f} MiB "
        f"(+{theirs - base:.1f}) |"
    )


if __name__ == "__main__":
    main()
