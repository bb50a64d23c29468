"""Memory under the proxy-client attacks of issue 13: many clients that make the gateway and the
agent hold bytes for them (4 MiB request bodies whose answer is never read, 16 MiB answers never
read). Before issue 13, 120 such body clients cost +122 MiB in the gateway and +129 MiB in the
agent. All on loopback, in the same lab as bench_soak.py (real `raven gateway`, two real
`raven agent`s, aiohttp targets, Prometheus scraping the watched site every second).

For each attack, in turn: --clients connections from distinct source addresses (127.0.2.x, so
the per-client in-flight limit does not stop them; this is the strongest form), held for
--hold-s while the gateway's and the busy agent's RSS are sampled every 0.25 s; then the clients
are cut and the memory after --settle-s is read. The watched site's scrapes during each attack
come from Prometheus.

Usage: python bench/bench_memory_attack.py [--clients 120] [--hold-s 20] [--settle-s 10]
Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_soak import (  # noqa: E402
    BUSY_NODES,
    Lab,
    Ports,
    busy,
    phase_stats,
    print_gateway_counters,
    rss_mib,
    start,
    write_configs,
)

ATTACKS = {
    "huge-body": "POST /upload, Content-Length 4 MiB sent in full, answer never read",
    "never-read": "GET /big (16 MiB answer), never read",
}


async def attacker(kind: str, lab: Lab, i: int, held: list[asyncio.StreamWriter]) -> str:
    """One attacking connection; returns how far it got."""
    node = f"{busy(i % BUSY_NODES)}:{lab.ports.target}"
    try:
        _, w = await asyncio.open_connection(
            "127.0.0.1", lab.ports.proxy, local_addr=(f"127.0.2.{1 + i % 250}", 0)
        )
    except OSError:
        return "connect failed"
    held.append(w)
    w.transport.set_write_buffer_limits(0)
    # the client's own receive buffer stays small: the bytes it does not read stay upstream
    sock = w.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    if kind == "huge-body":
        w.write(
            f"POST /upload HTTP/1.1\r\nHost: {node}\r\nContent-Length: {4 << 20}\r\n\r\n".encode()
        )
        w.write(os.urandom(4 << 20))
    else:
        w.write(f"GET /big HTTP/1.1\r\nHost: {node}\r\n\r\n".encode())
    try:
        await asyncio.wait_for(w.drain(), 30)
        return "sent"
    except (OSError, TimeoutError):
        return "send blocked or cut"


async def sample_peak(pids: dict[str, int], seconds: float) -> dict[str, float]:
    peak = dict.fromkeys(pids, 0.0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, pid in pids.items():
            peak[name] = max(peak[name], rss_mib(pid)[0])
        await asyncio.sleep(0.25)
    return peak


async def one_attack(kind: str, lab: Lab, args: argparse.Namespace) -> dict[str, object]:
    pids = {n: lab.procs.procs[n].pid for n in ("gateway", "busy")}
    before = {n: rss_mib(pid)[0] for n, pid in pids.items()}
    held: list[asyncio.StreamWriter] = []
    t0 = time.time()
    sent = asyncio.gather(*(attacker(kind, lab, i, held) for i in range(args.clients)))
    peak = await sample_peak(pids, args.hold_s)
    outcomes = await sent
    for w in held:
        with contextlib.suppress(Exception):
            w.transport.abort()
    t1 = time.time()
    await asyncio.sleep(args.settle_s)
    after = {n: rss_mib(pid)[0] for n, pid in pids.items()}
    return {
        "before": before,
        "peak": peak,
        "after": after,
        "outcomes": {o: outcomes.count(o) for o in set(outcomes)},
        "watched": phase_stats(lab.ports.prom, t0, t1),
    }


def report(results: dict[str, dict[str, object]], lab: Lab, args: argparse.Namespace) -> None:
    print(f"### {args.clients} attacking clients per attack, held {args.hold_s:g} s\n")
    print(
        "| attack | gateway RSS before / peak / after | busy agent RSS before / peak / after"
        " | clients' sends | watched site: scrapes, success |"
    )
    print("|---|---|---|---|---|")
    for kind, res in results.items():
        b, p, a = res["before"], res["peak"], res["after"]
        assert isinstance(b, dict) and isinstance(p, dict) and isinstance(a, dict)
        w = res["watched"]
        assert isinstance(w, dict)
        cells = [
            f"{b[n]:.0f} / **{p[n]:.0f}** (+{p[n] - b[n]:.0f}) / {a[n]:.0f} MiB"
            for n in ("gateway", "busy")
        ]
        counts = res["outcomes"]
        assert isinstance(counts, dict)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(
            f"| {kind}: {ATTACKS[kind]} | {cells[0]} | {cells[1]} | {outcomes} |"
            f" {w['scrapes']:.0f}, {w['success']:.2%} |"
        )
    print_gateway_counters(lab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=120)
    ap.add_argument("--hold-s", type=float, default=20.0)
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-memattack-"))
    lab = write_configs(tmp, Ports())
    try:
        start(lab)
        time.sleep(5)
        results = {kind: asyncio.run(one_attack(kind, lab, args)) for kind in args.attacks}
        report(results, lab, args)
    finally:
        lab.procs.stop_all()
        print(f"\n(work dir {tmp})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
