"""Benchmark of the hosts generator; prints Markdown.

1. render + atomic write (temp file, fsync, rename, fsync dir) of 10,000 nodes, dual-stack
   (goal: <= 100 ms);
2. a 10,000-node registration burst through the long-running generator (debounce 0.25 s,
   max delay 2 s) -> number of writes, for a burst at once and spread over 1 s and 5 s.

Run: .venv/bin/python bench/bench_hosts.py [--nodes 10000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "coredns-hosts")]

from coredns_hosts.metrics import HostsMetrics  # noqa: E402
from coredns_hosts.model import Snapshot  # noqa: E402
from coredns_hosts.render import render  # noqa: E402
from coredns_hosts.runner import HostsGenerator  # noqa: E402
from coredns_hosts.sinks.file import FileSink  # noqa: E402
from coredns_hosts.sources import OnChange  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

V6 = ipaddress.ip_address("fd00::50")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def bench_render_write(nodes: int, rounds: int) -> list[tuple[str, list[float]]]:
    names = [f"edge-gpu-{i:05d}.site-{i % 97}" for i in range(nodes)]
    renders, writes, totals, unchanged = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        sink = FileSink(Path(tmp) / "tunnel-nodes")

        async def rounds_on_one_loop() -> None:  # the sink is awaited, as the generator does
            for i in range(rounds):
                gateway = ipaddress.ip_address(f"10.96.{i // 250}.{i % 250 + 1}")  # new text
                t0 = time.perf_counter()
                rendered = render(Snapshot.uniform(names, [gateway, V6], "bench"))
                t1 = time.perf_counter()
                assert await sink.write(rendered.text)
                t2 = time.perf_counter()
                assert not await sink.write(rendered.text)
                t3 = time.perf_counter()
                renders.append(t1 - t0)
                writes.append(t2 - t1)
                totals.append(t2 - t0)
                unchanged.append(t3 - t2)

        asyncio.run(rounds_on_one_loop())
        size = (Path(tmp) / "tunnel-nodes").stat().st_size
    print(
        f"\n### Render + atomic write, {nodes} nodes x 2 families ({size} bytes), {rounds} rounds\n"
    )
    return [
        ("render (validate, sort, format)", renders),
        ("atomic write (tmp, fsync, rename, fsync dir)", writes),
        ("**render + write**", totals),
        ("unchanged check (read + compare, no write)", unchanged),
    ]


class BurstSource:
    origin = "bench"

    def __init__(self) -> None:
        self.names: list[str] = []
        self.on_change: OnChange | None = None
        self.ready = asyncio.Event()

    def snapshot(self) -> Snapshot:
        return Snapshot.uniform(self.names, [ipaddress.ip_address("10.96.0.50"), V6], "bench")

    async def load(self) -> Snapshot:
        return self.snapshot()

    async def run(self, on_change: OnChange) -> None:
        self.on_change = on_change
        self.ready.set()
        await asyncio.Event().wait()


async def burst(nodes: int, spread_s: float) -> tuple[int, float]:
    """Register ``nodes`` names over ``spread_s``; return (writes, seconds to the last write)."""
    source = BurstSource()
    with tempfile.TemporaryDirectory() as tmp:
        metrics = HostsMetrics(CollectorRegistry())
        sink = FileSink(Path(tmp) / "tunnel-nodes")
        gen = HostsGenerator(source, [sink], metrics=metrics, debounce_s=0.25, max_delay_s=2.0)
        task = asyncio.create_task(gen.run())
        await source.ready.wait()
        start = time.perf_counter()
        batch = max(1, nodes // 200)
        for i in range(0, nodes, batch):
            for j in range(i, min(i + batch, nodes)):
                source.names.append(f"edge-{j}")
                assert source.on_change is not None
                source.on_change()  # one notification per registration
            await asyncio.sleep(spread_s / 200)
        while gen.last_rendered is None or len(gen.last_rendered.entries) < nodes:
            await asyncio.sleep(0.01)
        done = time.perf_counter() - start
        await asyncio.sleep(0.5)  # nothing more should be written
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        writes = metrics.registry.get_sample_value("raven_hosts_writes_total", {"sink": "file"})
        return int(writes or 0), done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print("## coredns-hosts benchmark\n")
    rows = bench_render_write(args.nodes, args.rounds)
    print("| step | median ms | p95 ms | max ms |\n|---|---|---|---|")
    for label, samples in rows:
        p95 = sorted(samples)[max(0, int(len(samples) * 0.95) - 1)]
        print(f"| {label} | {ms(statistics.median(samples))} | {ms(p95)} | {ms(max(samples))} |")
    goal = statistics.median(rows[2][1]) <= 0.100
    print(f"\nGoal <= 100 ms (median render + write): {'met' if goal else 'NOT met'}")
    print(f"\n### Registration burst of {args.nodes} nodes (debounce 0.25 s, max delay 2 s)\n")
    print("| arrival | notifications | file writes | last write after |\n|---|---|---|---|")
    for spread in (0.0, 1.0, 5.0):
        writes, done = asyncio.run(burst(args.nodes, spread))
        label = "all at once" if spread == 0 else f"spread over {spread:.0f} s"
        print(f"| {label} | {args.nodes} | {writes} | {done:.2f} s |")


if __name__ == "__main__":
    main()
