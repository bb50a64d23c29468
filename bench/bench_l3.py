"""L3 benchmark: iperf3 TCP and ping through Raven's tunnel vs wireguard-go, same namespaces.

Builds the e2e topology of tests/e2e/test_l3_netns.py (cloud host, cloud gateway, edge
gateway, edge host), then, one after the other in the same run and between the same
namespaces, measures:

- ``raven``: the real ``raven gateway`` / ``raven agent`` with ``tun.enabled`` (encrypted);
- ``wireguard``: Debian's ``wireguard-go`` (userspace WireGuard over TUN) on the same underlay;
- ``pipe`` (only with ``--pipe``): the unencrypted pipe link of
  tests/integration/test_l3_pipe_link.py, the L3 data path alone.

For each: iperf3 TCP cloud -> edge with 1 and 4 streams (and 1 stream back), ping p50/p99 (ICMP echo, 56
bytes), and the CPU time of the two tunnel processes per Gbit carried. Both tunnels use
MTU 1380. Prints Markdown. Needs root, iperf3, wireguard-go and wg
(`sudo scripts/setup --bench` installs them)::

    sudo .venv/bin/python bench/bench_l3.py [--seconds 5] [--pings 200] [--pipe]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.netns import Lab, Netns, Proc, missing_prerequisites, wait_until  # noqa: E402
from tests.e2e.test_l3_netns import (  # noqa: E402
    CLOUD_SUBNETS,
    EDGE_SUBNETS,
    TUN_MTU,
    L3Lab,
    bps,
    iperf,
    ping,
)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(procs: list[Proc]) -> float:
    """utime + stime of the processes (all their threads)."""
    total = 0
    for p in procs:
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Result:
    name: str
    mbps: dict[int, float] = field(default_factory=dict)
    cpu_per_gbit: dict[int, float] = field(default_factory=dict)
    retransmits: dict[int, int] = field(default_factory=dict)
    rtt_ms: list[float] = field(default_factory=list)
    lost: int = 0


def measure(name: str, t: L3Lab, procs: list[Proc], seconds: float, pings: int) -> Result:
    res = Result(name)
    ping(t.cloud, "192.168.50.7", 20, interval_s=0.005)  # warm up neighbours and caches
    res.rtt_ms = ping(t.cloud, "192.168.50.7", pings, interval_s=0.005)
    res.lost = pings - len(res.rtt_ms)
    for streams in (1, 4):
        before = cpu_seconds(procs)
        run = iperf(t.lab, t.cloud, t.edge, "192.168.50.7", streams=streams, seconds=seconds)
        cpu = cpu_seconds(procs) - before
        rate = bps(run)
        res.mbps[streams] = rate / 1e6
        res.cpu_per_gbit[streams] = cpu / (rate * seconds / 1e9)
        res.retransmits[streams] = int(run["end"]["sum_sent"].get("retransmits", 0))
    back = iperf(t.lab, t.cloud, t.edge, "192.168.50.7", seconds=seconds, reverse=True)
    res.mbps[-1] = bps(back) / 1e6  # edge -> cloud, 1 stream
    return res


def start_wireguard(t: L3Lab) -> list[Proc]:
    """wireguard-go in the gateway and agent namespaces, routing the same prefixes."""
    tag = str(os.getpid())[-6:]
    env = {"WG_PROCESS_FOREGROUND": "1", "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}
    sides: list[tuple[Netns, str, list[str], str | None]] = [
        (t.gw, f"wgg{tag}", EDGE_SUBNETS, None),
        (t.agent, f"wga{tag}", CLOUD_SUBNETS, "10.0.9.1:51820"),
    ]
    keys = {}
    for ns, dev, _, _ in sides:
        private = ns.run(["wg", "genkey"]).strip()
        (t.lab.workdir / f"{dev}.key").write_text(private + "\n")
        os.chmod(t.lab.workdir / f"{dev}.key", 0o600)
        keys[dev] = ns.run(["wg", "pubkey"], input_text=private).strip()
    procs = []
    for i, (ns, dev, routes, endpoint) in enumerate(sides):
        proc = t.lab.process(ns, f"wireguard-{dev}", ["wireguard-go", dev], env=env)
        procs.append(proc)
        wait_until(Path(f"/var/run/wireguard/{dev}.sock").exists, 10, f"{dev} up", procs=[proc])
        peer_dev = sides[1 - i][1]
        peer_allowed = ",".join(routes)  # what this side routes to its peer
        cmd = ["wg", "set", dev, "private-key", str(t.lab.workdir / f"{dev}.key")]
        cmd += ["listen-port", "51820", "peer", keys[peer_dev], "allowed-ips", peer_allowed]
        if endpoint:
            cmd += ["endpoint", endpoint, "persistent-keepalive", "5"]
        ns.run(cmd)
        ns.ip("link", "set", dev, "mtu", str(TUN_MTU), "up")
        for prefix in routes:
            ns.ip("-6" if ":" in prefix else "-4", "route", "replace", prefix, "dev", dev)
    wait_until(
        lambda: ping(t.cloud, "192.168.50.7", 1, timeout_s=0.3), 20, "ping through wireguard"
    )
    return procs


def table(results: list[Result], seconds: float, pings: int) -> str:
    names = [r.name for r in results]
    head = "| | " + " | ".join(names) + " |"
    if len(results) > 1 and results[1].name.startswith("wireguard"):
        head += " raven / wireguard-go |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]

    def row(label: str, values: list[float], fmt: str, ratio: bool = True) -> None:
        cells = [format(v, fmt) for v in values]
        extra = ""
        if head.endswith("wireguard-go |"):
            extra = f" {values[0] / values[1]:.2f} |" if ratio and values[1] else " |"
        lines.append(f"| {label} | " + " | ".join(cells) + " |" + extra)

    for s in (1, 4):
        row(f"iperf3 TCP {s} stream{'s' * (s > 1)} (Mbit/s)", [r.mbps[s] for r in results], ".0f")
    row("iperf3 TCP 1 stream edge -> cloud (Mbit/s)", [r.mbps[-1] for r in results], ".0f")
    row("ping p50 (ms)", [statistics.median(r.rtt_ms) for r in results], ".3f")
    row("ping p99 (ms)", [percentile(r.rtt_ms, 0.99) for r in results], ".3f")
    for s in (1, 4):
        row(
            f"CPU s per Gbit, {s} stream{'s' * (s > 1)}",
            [r.cpu_per_gbit[s] for r in results],
            ".2f",
        )
    for s in (1, 4):
        row(
            f"TCP retransmits, {s} stream{'s' * (s > 1)}",
            [r.retransmits[s] for r in results],
            "d",
            False,
        )
    row("pings lost", [r.lost for r in results], "d", False)
    load = os.getloadavg()[0]
    lines.append("")
    lines.append(
        f"{platform.node()}: {os.cpu_count()} CPUs, load {load:.2f} at the end; iperf3 "
        f"{seconds:g} s per run, cloud host -> edge host; {pings} pings at 5 ms; MTU {TUN_MTU}."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per iperf3 run")
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--pipe", action="store_true", help="also the unencrypted pipe link")
    args = parser.parse_args()
    problems = missing_prerequisites(("iperf3", "wireguard-go", "wg"))
    if problems:
        print("bench_l3: " + "; ".join(problems), file=sys.stderr)
        return 2
    results = []
    with Lab(Path(tempfile.mkdtemp(prefix="bench-l3-"))) as lab:
        runs = [("raven", "raven"), ("wireguard-go", "wireguard")]
        if args.pipe:
            runs.append(("pipe link (no crypto, no offload)", "pipe"))
        topo = L3Lab.build(lab, "raven")
        for label, impl in runs:
            t = L3Lab(lab, topo.cloud, topo.gw, topo.agent, topo.edge, impl)
            if impl == "wireguard":
                procs = start_wireguard(t)
            else:
                t.start()
                procs = [p for p in (t.gateway, t.agent_proc) if p]
            print(f"measuring {label}...", file=sys.stderr)
            results.append(measure(label, t, procs, args.seconds, args.pings))
            for p in procs:
                p.stop()
            time.sleep(0.5)
    print(table(results, args.seconds, args.pings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
