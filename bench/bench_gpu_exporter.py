"""Benchmark the GPU exporter's scrape path: 8 GPUs x 100 processes.

Measures (1) rendering one snapshot to dcgm-exporter text, (2) a whole collection (simulated
read + render) and (3) serving a scrape (the cached body plus the self-metrics), then runs
10,000 collect+scrape cycles and reports memory growth. Prints a Markdown snippet.

    .venv/bin/python bench/bench_gpu_exporter.py [--scrapes 10000]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_exporter.backend import PodRef, ProcessSample, Snapshot
from gpu_exporter.counters import default_counters
from gpu_exporter.exposition import ExpositionOptions, render
from gpu_exporter.server import GpuExporter
from gpu_exporter.simulated import SimulatedBackend

GPUS = 8
PROCESSES = 100
T0 = 1_763_780_000.0
COLLECT_EVERY = 10


class ManyProcessBackend:
    """The simulated backend with 100 processes (one pod each) on every GPU."""

    name = "bench"

    def __init__(self) -> None:
        self.inner = SimulatedBackend(GPUS, seed=1, load_profile="training")

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        snap = self.inner.collect(fields, now)
        gpus = []
        for g in snap.gpus:
            procs = tuple(
                ProcessSample(
                    pid=10_000 + g.info.index * 1000 + k,
                    used_memory_mib=700 + k,
                    sm_util=k % 100,
                    mem_util=k % 50,
                    pod=PodRef("inference", f"model-server-{g.info.index}-{k}", "server"),
                )
                for k in range(PROCESSES)
            )
            gpus.append(dataclasses.replace(g, processes=procs))
        return dataclasses.replace(snap, gpus=tuple(gpus))

    def close(self) -> None:
        pass


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t) * 1000.0)
    return out


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{statistics.median(ms):.2f} ms | {p99:.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()

    counters = default_counters()
    opts = ExpositionOptions(hostname="edge-gpu-1", kubernetes=True)
    backend = ManyProcessBackend()
    fields = frozenset(c.field for c in counters)
    snap = backend.collect(fields, T0)
    body = render(snap, counters, opts)
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))

    exporter = GpuExporter(backend, counters=counters, options=opts, interval_s=30.0)
    clock = [T0]
    exporter._clock = lambda: clock[0]  # deterministic time for the run
    exporter.collect_blocking()

    render_ms = timed(lambda: render(snap, counters, opts), args.repeat)
    collect_ms = timed(exporter.collect_blocking, args.repeat // 3)
    scrape_ms = timed(exporter.exposition, args.repeat)

    # Memory: N scrapes, with a collection every COLLECT_EVERY scrapes (as with a 30 s
    # collection interval and several scrapers); compare after warm-up with the end.
    gc.collect()
    warm = max(1, args.scrapes // 10)
    rss: dict[int, int] = {}
    objects: dict[int, int] = {}
    for i in range(1, args.scrapes + 1):
        if i % COLLECT_EVERY == 0:
            clock[0] += 1.0
            exporter.collect_blocking()
        exporter.exposition()
        if i in (warm, args.scrapes):
            gc.collect()
            rss[i] = rss_bytes()
            objects[i] = len(gc.get_objects())

    print(f"### GPU exporter: {GPUS} GPUs x {PROCESSES} processes\n")
    print(
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs; one exposition = {series} series, {len(body.encode())} bytes.\n"
    )
    print("| step | median | p99 |")
    print("|---|---|---|")
    print(f"| render one snapshot (text) | {summary(render_ms)} |")
    print(f"| whole collection (read simulated GPUs + render) | {summary(collect_ms)} |")
    print(f"| serve one scrape (cached body + self-metrics) | {summary(scrape_ms)} |")
    print()
    print("| memory after | RSS | live Python objects |")
    print("|---|---|---|")
    for i in (warm, args.scrapes):
        print(f"| {i:,} scrapes | {rss[i] / 2**20:.1f} MiB | {objects[i]:,} |")
    growth = (rss[args.scrapes] - rss[warm]) / 2**20
    print(
        f"\nRSS growth from {warm:,} to {args.scrapes:,} scrapes "
        f"({args.scrapes // COLLECT_EVERY:,} collections): {growth:+.1f} MiB."
    )


if __name__ == "__main__":
    main()
