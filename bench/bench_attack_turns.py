"""How long one hostile agent's attacks hold the gateway's event loop (issue 13).

The gateway serves every site from one event loop: the longest turn of that loop is what any
other site's scrape may wait behind. This bench runs a real ``TunnelListener`` and
``Registry`` (default limits, uvloop and GC settings as ``raven gateway``) in this process; the hostile
agent (``tests/helpers/hostile_agent.py``: an authorised key, its own site) runs in a child
process, one attack per round:

- ``register-flood``: full-size REGISTERs (16,384 names) back to back until the control
  budget closes the tunnel;
- ``open-flood``: OPENs the gateway must refuse, 2,000 per write;
- ``garbage-records``: random bytes after the handshake;
- ``register-churn``: one full REGISTER a second, within the control budget: each is
  checked, applied to the node index and answered (what a legitimate large site does once,
  and an authorised attacker can repeat forever).

A probe task on the gateway's loop yields every turn (``asyncio.sleep(0)``) and records how
long each turn took. Reference in the same run: the same probe with no attacker (``idle``).
Per attack: the longest turn, the 99.9th percentile, the turns over 2 and 5 ms, and how the
rounds ended. Prints Markdown.

Usage: python bench/bench_attack_turns.py [--rounds 3] [--round-s 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cloud_gateway.registry import Registry  # noqa: E402
from cloud_gateway.tunnel_listener import TunnelListener  # noqa: E402
from raven.config.gateway import AuthorisedAgent  # noqa: E402
from raven.protocol.limits import Limits  # noqa: E402
from raven.runtime.service import freeze_startup_objects  # noqa: E402
from raven.telemetry.metrics import TunnelMetrics  # noqa: E402
from tests.helpers import KeyPair  # noqa: E402
from tests.helpers.hostile_agent import (  # noqa: E402
    ATTACKS,
    CHURN,
    HostileAgent,
    one_attack,
    register_frames,
)

KINDS = ("idle", *ATTACKS, CHURN)


def attack(agent: HostileAgent, kind: str, out: mp.Queue[str]) -> None:
    """The child process: one round of ``kind`` against the gateway."""
    try:
        out.put(asyncio.run(one_attack(agent, kind, agent.gateways[0])))
    except (OSError, TimeoutError, ValueError) as exc:
        out.put(type(exc).__name__)


async def one_round(agent: HostileAgent, kind: str, idle_s: float) -> tuple[list[float], str]:
    """Turn lengths of the gateway's loop (seconds) during one round, and its outcome."""
    turns: list[float] = []
    done = False

    async def probe() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            turns.append(now - last)
            last = now

    task = asyncio.create_task(probe())
    if kind == "idle":
        await asyncio.sleep(idle_s)
        outcome = "-"
    else:
        out: mp.Queue[str] = mp.get_context("fork").Queue()
        child = mp.get_context("fork").Process(target=attack, args=(agent, kind, out))
        child.start()
        while child.is_alive():
            await asyncio.sleep(0.01)
        outcome = out.get(timeout=5)
    done = True
    await task
    return turns, outcome


def row(kind: str, turns: list[float], outcomes: list[str]) -> str:
    ms = sorted(t * 1000 for t in turns)
    p999 = statistics.quantiles(ms, n=1000)[998] if len(ms) > 1 else float("nan")
    over2 = sum(1 for t in ms if t > 2)
    over5 = sum(1 for t in ms if t > 5)
    ended = ", ".join(f"{o} x{outcomes.count(o)}" for o in sorted(set(outcomes)))
    return (f"| {kind} | {len(ms):,} | {ms[-1]:.1f} ms | {p999:.2f} ms | {over2} | {over5} |"
            f" {ended} |")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-turns-"))
    gw, hostile = KeyPair(tmp, "gw"), KeyPair(tmp, "hostile")
    limits = Limits()
    authorised = AuthorisedAgent(name="hostile", public_key=hostile.public_b64,
                                 nodes=["hostile-*"])  # fmt: skip
    metrics = TunnelMetrics(CollectorRegistry())
    listener = TunnelListener(listen="127.0.0.1:0", static_private=gw.private, psk=bytes(32),
                              limits=limits, registry=Registry([authorised], metrics),
                              metrics=metrics, handshake_rate_per_s=100,
                              handshake_burst=100)  # fmt: skip
    await listener.start()
    assert listener.bound is not None
    freeze_startup_objects()  # as `raven gateway` does once started (GC settings)
    agent = HostileAgent(private=hostile.private, gateway_public=gw.public,
                         gateways=[listener.bound], register=register_frames("hostile-", limits),
                         round_s=args.round_s, linger_s=0.0)  # fmt: skip
    print(f"### The gateway's longest event-loop turns under one hostile agent"
          f" ({args.rounds} rounds of {args.round_s:g} s each)\n")  # fmt: skip
    print("| attack | turns | longest | p99.9 | turns > 2 ms | turns > 5 ms | rounds ended |")
    print("|---|---|---|---|---|---|---|")
    for kind in KINDS:
        turns: list[float] = []
        outcomes: list[str] = []
        for _ in range(args.rounds):
            got, outcome = await one_round(agent, kind, args.round_s)
            turns += got
            outcomes.append(outcome)
            await asyncio.sleep(0.5)  # the gateway finishes closing the round's tunnel
        print(row(kind, turns, outcomes))
    closes = {s.labels["reason"]: int(s.value) for fam in metrics.tunnel_closes.collect()
              for s in fam.samples if s.name.endswith("_total") and s.value}  # fmt: skip
    print(f"\nGateway tunnel closes by reason: {closes}")
    await listener.drain(0.1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each attack")
    ap.add_argument("--round-s", type=float, default=3.0, help="longest flood of one round")
    uvloop.run(main(ap.parse_args()))
