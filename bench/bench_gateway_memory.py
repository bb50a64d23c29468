"""Gateway memory per connected agent (issue 12: goal <= 16 KiB per agent with 1 node each).

A real `raven gateway` with --agents authorised keys (one node each) starts alone; its RSS is
read once it is idle (every key configured, no tunnel). Then real agents connect (each its own
key, handshake, tunnel and registration: bench_fleet.py's agent role, spread over
--agent-procs processes) in two waves of half each; after each, the gateway's /metrics is
scraped once (its collectors read every tunnel) and, after --settle-s (idle tunnels release
their AEAD contexts at their next quiet keepalive; the process returns freed heap pages every
30 s), the RSS is read. Two figures per agent: from idle (all tunnels' RSS less the idle RSS,
over --agents: what the first tunnels cost once, the code and caches they bring in, included)
and marginal (the second wave's RSS over its count: what one more agent costs, for sizing).
Python's allocator keeps freed arenas, so the figure includes what the handshakes and the
registration left behind, as an operator's RSS graph would.

Usage: python bench/bench_gateway_memory.py [--agents 1000] [--agent-procs 2] [--waves 2]
Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_fleet import Procs, http_json, status_kib, wait_port, write_setup  # noqa: E402

FLEET = str(ROOT / "bench" / "bench_fleet.py")


def settled_rss_kib(pid: int, seconds: float = 3.0) -> int:
    """VmRSS once it stops moving (read every 0.5 s for ``seconds``; the last value)."""
    end = time.monotonic() + seconds
    value = status_kib(pid, "VmRSS")
    while time.monotonic() < end:
        time.sleep(0.5)
        value = status_kib(pid, "VmRSS")
    return value


def run(args: argparse.Namespace, tmp: Path, procs: Procs) -> None:
    setup = argparse.Namespace(
        agents=args.agents, nodes_per_agent=1, node_port=9400, gpus=1, gzip=False,
        interval_s=15, timeout_s=10,
    )  # fmt: skip
    spec = write_setup(tmp, setup)
    gateway = [
        sys.executable,
        "-m",
        "raven_cli.main",
        "gateway",
        "--config",
        str(tmp / "gateway.yaml"),
    ]
    pid = procs.start("gateway", gateway, tmp / "gateway.log").pid
    wait_port("127.0.0.1", spec["admin_port"], 60)
    spec_path = str(tmp / "spec.json")
    admin = f"http://127.0.0.1:{spec['admin_port']}"
    # idle as in production: scraped already (the first /metrics request builds the admin
    # server's request machinery once; every reading below follows a scrape too)
    with urllib.request.urlopen(f"{admin}/metrics") as r:
        r.read()
    idle = settled_rss_kib(pid, args.settle_s)  # after a heap trim too, like the readings below
    half = args.agents // 2 if args.waves == 2 else 0
    t0 = time.monotonic()
    readings = []
    waves = ((0, half), (half, args.agents)) if half else ((0, args.agents),)
    for first, last in waves:  # two waves: the slope between them; one: a gateway restart
        per = -(-(last - first) // args.agent_procs)
        for start in range(first, last, per):
            count = min(per, last - start)
            cmd = [sys.executable, FLEET, "--role", "agents", spec_path, str(start), str(count)]
            procs.start("agents", cmd, tmp / f"agents-{start}.log")
        while len(http_json(f"{admin}/api/v1/targets?port=9400")) < last:
            if time.monotonic() - t0 > 300:
                raise RuntimeError("agents did not all register within 300 s")
            procs.check()
            time.sleep(1.0)
        up_s = time.monotonic() - t0
        with urllib.request.urlopen(f"{admin}/metrics") as r:  # its collectors read every tunnel
            metrics_bytes = len(r.read())
        readings.append(settled_rss_kib(pid, args.settle_s))
    connected = readings[-1]
    per_agent = (connected - idle) / args.agents
    print(f"### Gateway memory, {args.agents} agents x 1 node, {args.waves} wave(s)\n")
    print("| measure | value |\n|---|---|")
    print(f"| gateway RSS, keys configured, no tunnel | {idle / 1024:.1f} MiB |")
    if half:
        print(f"| gateway RSS, {half} tunnels up and registered | {readings[0] / 1024:.1f} MiB |")
    print(f"| gateway RSS, {args.agents} tunnels up and registered | {connected / 1024:.1f} MiB |")
    print(f"| **per connected agent**, from idle ((all - idle) / {args.agents}) | "
          f"**{per_agent:.1f} KiB** (goal <= 16 KiB) |")  # fmt: skip
    if half:
        marginal = (readings[1] - readings[0]) / (args.agents - half)
        print(f"| **per connected agent**, marginal (second {args.agents - half} / their count) | "
              f"**{marginal:.1f} KiB** |")  # fmt: skip
    print(f"| all agents registered after | {up_s:.1f} s ({args.waves} wave(s)) |")
    print(f"| gateway /metrics size with every tunnel | {metrics_bytes / 1024:.0f} KiB |")
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--agent-procs", type=int, default=2)
    ap.add_argument(
        "--waves",
        type=int,
        choices=(1, 2),
        default=2,
        help="2: half the agents, then the rest (from idle and marginal); 1: all at once, as "
        "after a gateway restart",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=40.0,
        help="wait after registration: idle tunnels trim on their next keepalive (5 s) and "
        "the process returns freed heap every 30 s (raven.runtime.heap)",
    )
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (8192, hard))
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-gwmem-"))
    procs = Procs()
    try:
        run(args, tmp, procs)
    finally:
        procs.stop_all()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
