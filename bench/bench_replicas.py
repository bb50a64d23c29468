"""How fast agents given ONE load-balanced address come to hold every gateway replica (issue 33).

N gateway replicas (TunnelListeners, one key, each announcing its id and the count) stand behind
a TCP balancer on loopback that sends each new connection to a random replica, as kube-proxy's
DNAT or a cloud load balancer does; A agents (Dialers) are given only the balancer's address.
Reported per N: the time until every agent holds all N replicas, the tunnels dialled per agent
(against the coupon collector's expectation N * H(N) for blind random dialling), and the
handshakes the replicas did for duplicates (the cost of the search). One process, loopback.

Usage: python bench/bench_replicas.py [--replicas 2 3 5 8] [--agents 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from cloud_gateway.registry import Registry  # noqa: E402
from cloud_gateway.tunnel_listener import TunnelListener  # noqa: E402
from edge_agent.dialer import Dialer  # noqa: E402
from edge_agent.gateway_link import DialSettings, GatewayLink  # noqa: E402
from raven.config.gateway import AuthorisedAgent  # noqa: E402
from raven.protocol.limits import Limits  # noqa: E402
from raven.telemetry.metrics import TunnelMetrics  # noqa: E402
from tests.helpers import KeyPair  # noqa: E402
from tests.helpers.balancer import RandomBalancer  # noqa: E402

LIMITS = Limits(keepalive_interval_s=5.0, dead_peer_timeout_s=15.0)


async def one_round(tmp: Path, replicas: int, agents: int, seed: int) -> tuple[float, float, int]:
    gw = KeyPair(tmp, f"gw-{seed}")
    keys = [KeyPair(tmp, f"agent-{seed}-{i}") for i in range(agents)]
    auth = [AuthorisedAgent(name=f"site-{i}", public_key=k.public_b64, nodes=[f"edge-{i}-*"])
            for i, k in enumerate(keys)]  # fmt: skip
    listeners = []
    for r in range(replicas):
        registry = Registry(auth, TunnelMetrics(CollectorRegistry()))
        lst = TunnelListener(
            listen="127.0.0.1:0", static_private=gw.private, psk=bytes(32), limits=LIMITS,
            registry=registry, metrics=registry.metrics, handshake_rate_per_s=1000,
            handshake_burst=1000, replica_id=f"replica-{r}", replicas=replicas,
        )  # fmt: skip
        await lst.start()
        listeners.append(lst)
    balancer = RandomBalancer([lst.bound for lst in listeners if lst.bound], random.Random(seed))
    port = await balancer.start()
    dialers = []
    start = time.monotonic()
    for i, key in enumerate(keys):
        settings = DialSettings(key.private, gw.public, bytes(32), LIMITS, 0.5, 30.0)

        def make_link(
            address: str, p: int, i: int = i, settings: DialSettings = settings
        ) -> GatewayLink:
            return GatewayLink(address, p, settings, on_stream=_serve_nothing,
                               registration=lambda: ([f"edge-{i}-1"], []),
                               metrics=TunnelMetrics(CollectorRegistry(), "gateway"))  # fmt: skip

        dialer = Dialer(f"127.0.0.1:{port}", settings, link_factory=make_link,
                        resolve_interval_s=3600)  # fmt: skip
        dialer.start()
        dialers.append(dialer)
    while any(len(d.claims) < replicas for d in dialers):
        if time.monotonic() - start > 120:
            raise RuntimeError("agents did not reach every replica within 120 s")
        await asyncio.sleep(0.05)
    took = time.monotonic() - start
    dials = balancer.connections / agents
    duplicates = sum(int(d.replica_metrics.dials.labels("duplicate")._value.get()) for d in dialers)
    for dialer in dialers:
        await dialer.stop()
    for lst in listeners:
        await lst.drain(0.1)
    balancer.close()
    return took, dials, duplicates


async def _serve_nothing(*_args: object) -> None:
    return None


def harmonic(n: int) -> float:
    return sum(1 / k for k in range(1, n + 1))


async def main_async(args: argparse.Namespace) -> None:
    print(f"\n{args.agents} agents, one balancer address (random per connection), loopback;"
          f" {args.rounds} rounds each (median)\n")  # fmt: skip
    print(
        "| replicas | all agents hold all replicas, s | tunnels dialled per agent | N x H(N) "
        "(blind random) | duplicate handshakes per agent |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="raven-replicas-") as tmp_name:
        tmp = Path(tmp_name)
        for n in args.replicas:
            results = [await one_round(tmp, n, args.agents, seed) for seed in range(args.rounds)]
            took = statistics.median(r[0] for r in results)
            dials = statistics.median(r[1] for r in results)
            dup = statistics.median(r[2] for r in results) / args.agents
            print(f"| {n} | {took:.2f} | {dials:.1f} | {n * harmonic(n):.1f} | {dup:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 3, 5, 8])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
