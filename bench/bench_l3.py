"""L3 benchmark: iperf3 TCP and ping through Raven's tunnel vs wireguard-go, same namespaces.

Builds the e2e topology of tests/helpers/e2e/l3_lab.py (cloud host, cloud gateway, edge
gateway, edge host) and runs both tunnels side by side between the same namespaces:

- ``raven``: the real ``raven gateway`` / ``raven agent`` with ``tun.enabled`` (encrypted),
  carrying the site's prefix 192.168.50.0/24;
- ``wireguard``: Debian's ``wireguard-go`` (userspace WireGuard over TUN) on the same underlay,
  carrying a second address of the same edge host, 192.168.51.7 (its replies leave through
  wireguard-go by a source rule in the edge gateway);
- ``pipe`` (only with ``--pipe``, after the others): the unencrypted pipe link of
  tests/integration/test_l3_pipe_link.py, the L3 data path alone;
- ``minimal`` (only with ``--minimal``, after the others): bench/l3_minimal_hop.py, the least a
  Python hop can do (TUN, AES-256-GCM, TCP; no checks): what CPython costs a packet here.

For each: iperf3 TCP cloud -> edge with 1 and 4 streams (and 1 stream back), one tunnel after
the other, and the CPU time of its two processes per Gbit carried. Ping (ICMP echo, 56 bytes,
one per 5 ms) runs in ``--rounds`` rounds that alternate between the tunnels, so that both
meet the same machine: on a shared VM a process's wake-up cost drifts by 2x within minutes,
and a ratio of two runs minutes apart measured that drift; the pipe link and the minimal hop,
which take the site's prefix over from Raven, alternate with wireguard-go in the same way. The
CPU of each tunnel's two processes (``/proc/PID/task/*/schedstat``, nanoseconds) is divided by
the pings it carried. All use MTU 1380. Prints Markdown. Needs root, iperf3, wireguard-go and wg (`sudo scripts/setup --bench`
installs them)::

    sudo .venv/bin/python bench/bench_l3.py [--seconds 5] [--pings 200] [--rounds 10] [--pipe]
        [--minimal]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.e2e.l3_lab import (  # noqa: E402
    CLOUD_SUBNETS,
    EDGE_SUBNETS,
    TUN_MTU,
    L3Lab,
    bps,
    iperf,
    ping,
)
from tests.helpers.e2e.netns import Lab, Netns, Proc, missing_prerequisites, wait_until  # noqa: E402

MINIMAL_HOP = Path(__file__).resolve().parent / "l3_minimal_hop.py"


def cpu_ns(procs: list[Proc]) -> int:
    """Time on CPU of the processes' threads, in nanoseconds (schedstat: finer than ticks)."""
    total = 0
    for p in procs:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):  # a thread just ended
                total += int(Path(f"/proc/{p.pid}/task/{tid}/schedstat").read_text().split()[0])
    return total


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
    #: this tunnel's per-round p50 over wireguard-go's in the same round
    round_ratio: list[float] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    cpu_ns: int = 0
    pings: int = 0


#: The second address of the edge host, reached through wireguard-go (raven carries
#: EDGE_SUBNETS: 192.168.50.0/24)
WG_PREFIX, WG_HOST, WG_GATEWAY_ADDR = "192.168.51.0/24", "192.168.51.7", "192.168.51.1/24"
RAVEN_HOST = "192.168.50.7"
#: The edge gateway's routing table for replies from WG_PREFIX
WG_TABLE = "51"


def measure_throughput(res: Result, t: L3Lab, procs: list[Proc], dst: str, seconds: float) -> None:
    for streams in (1, 4):
        before = cpu_ns(procs)
        run = iperf(t.lab, t.cloud, t.edge, dst, streams=streams, seconds=seconds)
        cpu = (cpu_ns(procs) - before) / 1e9
        rate = bps(run)
        res.mbps[streams] = rate / 1e6
        res.cpu_per_gbit[streams] = cpu / (rate * seconds / 1e9)
        res.retransmits[streams] = int(run["end"]["sum_sent"].get("retransmits", 0))
    back = iperf(t.lab, t.cloud, t.edge, dst, seconds=seconds, reverse=True)
    res.mbps[-1] = bps(back) / 1e6  # edge -> cloud, 1 stream


def measure_pings(t: L3Lab, targets: list[tuple[Result, str]], pings: int, rounds: int) -> None:
    """``pings`` echoes per target in ``rounds`` rounds, the targets alternating (and their
    order too); each round's p50 over the second target's (wireguard-go) is kept, and each
    target's CPU per ping."""
    per_round = max(1, pings // rounds)
    for _, dst in targets:
        ping(t.cloud, dst, 20, interval_s=0.005)  # warm up neighbours and caches
    for r in range(rounds):
        p50: dict[str, float] = {}
        for res, dst in targets if r % 2 == 0 else targets[::-1]:
            before = cpu_ns(res.procs)
            rtts = ping(t.cloud, dst, per_round, interval_s=0.005)
            res.cpu_ns += cpu_ns(res.procs) - before
            res.pings += per_round
            res.lost += per_round - len(rtts)
            res.rtt_ms += rtts
            if rtts:
                p50[res.name] = statistics.median(rtts)
        first, reference = targets[0][0], targets[-1][0]
        if first is not reference and first.name in p50 and reference.name in p50:
            first.round_ratio.append(p50[first.name] / p50[reference.name])


def add_wireguard_site(t: L3Lab) -> None:
    """WG_HOST on the edge host, routed from the cloud host like the site's prefix; the edge
    gateway sends replies from it back through wireguard-go (source rule, table WG_TABLE)."""
    t.edge.ip("addr", "add", f"{WG_HOST}/24", "dev", "e0")
    t.agent.ip("addr", "add", WG_GATEWAY_ADDR, "dev", "a0")
    t.cloud.ip("route", "add", WG_PREFIX, "via", "10.1.0.1")
    t.agent.ip("rule", "add", "from", WG_PREFIX, "lookup", WG_TABLE, "priority", "100")
    for ns in (t.gw, t.agent):  # the two tunnels route the same cloud prefix differently
        ns.run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])


def start_wireguard(t: L3Lab) -> list[Proc]:
    """wireguard-go in the gateway and agent namespaces: WG_PREFIX one way, the cloud
    prefixes back (from WG_PREFIX only: see add_wireguard_site)."""
    tag = str(os.getpid())[-6:]
    env = {"WG_PROCESS_FOREGROUND": "1", "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}
    sides: list[tuple[Netns, str, list[str], str | None, str | None]] = [
        (t.gw, f"wgg{tag}", [WG_PREFIX], None, None),
        (t.agent, f"wga{tag}", CLOUD_SUBNETS[:1], "10.0.9.1:51820", WG_TABLE),
    ]
    keys = {}
    for ns, dev, _, _, _ in sides:
        private = ns.run(["wg", "genkey"]).strip()
        (t.lab.workdir / f"{dev}.key").write_text(private + "\n")
        os.chmod(t.lab.workdir / f"{dev}.key", 0o600)
        keys[dev] = ns.run(["wg", "pubkey"], input_text=private).strip()
    procs = []
    for i, (ns, dev, routes, endpoint, table) in enumerate(sides):
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
            ns.ip("route", "replace", prefix, "dev", dev, *(["table", table] if table else []))
    wait_until(lambda: ping(t.cloud, WG_HOST, 1, timeout_s=0.3), 20, "ping through wireguard")
    return procs


def table(results: list[Result], seconds: float, pings: int) -> str:
    """Markdown: one column per tunnel (raven, wireguard-go first), raven / wireguard-go."""
    raven, wireguard = results[0], results[1]
    head = "| | " + " | ".join(r.name for r in results) + " | raven / wireguard-go |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]

    def row(label: str, values: list[float], fmt: str, ratio: bool = True) -> None:
        cells = [format(v, fmt) for v in values]
        extra = f" {values[0] / values[1]:.2f} |" if ratio and values[1] else " |"
        lines.append(f"| {label} | " + " | ".join(cells) + " |" + extra)

    def spread(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for s in (1, 4):
        row(f"iperf3 TCP {s} stream{'s' * (s > 1)} (Mbit/s)", [r.mbps[s] for r in results], ".0f")
    row("iperf3 TCP 1 stream edge -> cloud (Mbit/s)", [r.mbps[-1] for r in results], ".0f")
    row("ping p50 (ms)", [statistics.median(r.rtt_ms) for r in results], ".3f")
    rounds = len(raven.round_ratio)
    cells = [spread(r.round_ratio) if r is not wireguard else "1" for r in results]
    lines.append(
        f"| ping p50 / wireguard-go's in the same round: median (min-max of {rounds}) | "
        + " | ".join(cells)
        + f" | {spread(raven.round_ratio)} |"
    )
    row("ping p99 (ms)", [percentile(r.rtt_ms, 0.99) for r in results], ".3f")
    row("CPU µs per ping, both processes", [r.cpu_ns / 1e3 / max(1, r.pings) for r in results],
        ".0f")  # fmt: skip
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
        f"{seconds:g} s per run, cloud host -> edge host; {pings} pings at 5 ms per tunnel, in "
        f"rounds alternating with wireguard-go; MTU {TUN_MTU}."
    )
    return "\n".join(lines)


def start_minimal(t: L3Lab) -> list[Proc]:
    """bench/l3_minimal_hop.py in the gateway and agent namespaces, routing the site's
    prefix and the cloud's like Raven did (Raven is stopped first)."""
    tag = str(os.getpid())[-6:]
    argv = [sys.executable, str(MINIMAL_HOP)]
    gateway = t.lab.process(t.gw, "minimal-gateway",
                            [*argv, "gateway", f"mhg{tag}", "10.0.9.1:7100", EDGE_SUBNETS[0]])  # fmt: skip
    wait_until(lambda: t.gw.port_open("10.0.9.1", 7100), 10, "minimal hop listening",
               procs=[gateway])  # fmt: skip
    agent = t.lab.process(t.agent, "minimal-agent",
                          [*argv, "agent", f"mha{tag}", "10.0.9.1:7100", CLOUD_SUBNETS[0]])  # fmt: skip
    wait_until(lambda: ping(t.cloud, RAVEN_HOST, 1, timeout_s=0.3), 20, "ping through the minimal hop",
               procs=[gateway, agent])  # fmt: skip
    return [gateway, agent]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per iperf3 run")
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10, help="ping rounds, alternating")
    parser.add_argument("--pipe", action="store_true", help="also the unencrypted pipe link")
    parser.add_argument("--minimal", action="store_true",
                        help="also bench/l3_minimal_hop.py (the least a Python hop can do)")  # fmt: skip
    args = parser.parse_args()
    problems = missing_prerequisites(("iperf3", "wireguard-go", "wg"))
    if problems:
        print("bench_l3: " + "; ".join(problems), file=sys.stderr)
        return 2
    raven, wireguard = Result("raven"), Result("wireguard-go")
    results = [raven, wireguard]
    with Lab(Path(tempfile.mkdtemp(prefix="bench-l3-"))) as lab:
        topo = L3Lab.build(lab, "raven")
        add_wireguard_site(topo)
        t = L3Lab(lab, topo.cloud, topo.gw, topo.agent, topo.edge, "raven")
        t.start()
        raven.procs = [p for p in (t.gateway, t.agent_proc) if p]
        wireguard.procs = start_wireguard(t)
        print("measuring raven...", file=sys.stderr)
        measure_throughput(raven, t, raven.procs, RAVEN_HOST, args.seconds)
        print("measuring wireguard-go...", file=sys.stderr)
        measure_throughput(wireguard, t, wireguard.procs, WG_HOST, args.seconds)
        print(f"ping, {args.rounds} rounds alternating...", file=sys.stderr)
        measure_pings(t, [(raven, RAVEN_HOST), (wireguard, WG_HOST)], args.pings, args.rounds)
        t.stop()
        others: list[tuple[str, Callable[[], list[Proc]]]] = []
        if args.pipe:
            tp = L3Lab(lab, topo.cloud, topo.gw, topo.agent, topo.edge, "pipe")

            def start_pipe() -> list[Proc]:
                tp.start()
                return [p for p in (tp.gateway, tp.agent_proc) if p]

            others.append(("pipe link (no crypto, no offload)", start_pipe))
        if args.minimal:
            others.append(("minimal Python hop", lambda: start_minimal(t)))
        for name, start in others:
            time.sleep(0.5)
            print(f"measuring {name}...", file=sys.stderr)
            res = Result(name)
            res.procs = start()
            measure_throughput(res, t, res.procs, RAVEN_HOST, args.seconds)
            measure_pings(t, [(res, RAVEN_HOST), (Result("wireguard-go"), WG_HOST)],
                          args.pings, args.rounds)  # fmt: skip
            results.append(res)
            for p in res.procs:
                p.stop()
        for p in wireguard.procs:
            p.stop()
    print(table(results, args.seconds, args.pings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
