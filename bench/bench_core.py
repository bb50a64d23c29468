"""The sans-IO core's cost per scrape: two TunnelConnections in one process, no sockets.

One "scrape" is what the protocol does for one proxied request: the gateway opens a stream with
the 200-byte request riding on the OPEN (``--no-open-data``: sent after the agent accepts), the
agent accepts, a 100 KB response comes back, both ENDs, every record sealed and opened (under the
transport suite ``--cipher``), events drained and credit returned on both sides. Reports CPU
microseconds per scrape (both sides together; CPU, not wall time, so the figure holds on a busy
machine) as a Markdown row: the build of ``raven.protocol`` that ran (``pure``, the .py modules,
or ``compiled``, mypyc: ``scripts/build-compiled``), the suite, the median and the best round.
``--cipher both`` measures both suites in the same run, rounds interleaved (one row each).

Usage: python bench/bench_core.py [--scrapes 2000] [--rounds 5] [--no-open-data]
                                  [--cipher chacha20-poly1305|aes-256-gcm|both]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raven.protocol import connection as _connection  # noqa: E402
from raven.protocol import events as ev  # noqa: E402
from raven.protocol.connection import Role, TunnelConnection  # noqa: E402
from raven.protocol.limits import Limits  # noqa: E402
from raven.protocol.noise import generate_keypair  # noqa: E402
from raven.protocol.secure_channel import SecureChannel  # noqa: E402
from raven.protocol.suites import Suite, suite_by_name  # noqa: E402

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: edge-bench:9400\r\n" + b"X: y\r\n" * 20 + b"\r\n"
RESPONSE = b"x" * (100 * 1024)


def build() -> str:
    return "compiled" if _connection.__file__.endswith(".so") else "pure"


def pump(a: TunnelConnection, b: TunnelConnection, now: float) -> None:
    while True:
        x, y = a.data_to_send(None, now), b.data_to_send(None, now)
        if not x and not y:
            return
        if x:
            b.receive_data(x, now)
        if y:
            a.receive_data(y, now)


def drain(conn: TunnelConnection) -> list[ev.Event]:
    out: list[ev.Event] = []
    while (event := conn.next_event()) is not None:
        if isinstance(event, ev.StreamDataReceived):
            conn.consume_stream_data(event.stream_id, len(event.data))
        out.append(event)
    return out


def connected(suite: Suite) -> tuple[TunnelConnection, TunnelConnection]:
    limits = Limits()
    agent_priv, agent_pub = generate_keypair()
    gw_priv, gw_pub = generate_keypair()
    agent = TunnelConnection(
        SecureChannel(
            role=Role.INITIATOR,
            static_private=agent_priv,
            limits=limits,
            now=0.0,
            remote_static=gw_pub,
            wall_time_ns=time.time_ns(),
            suites=(suite,),
        )
    )
    gateway = TunnelConnection(
        SecureChannel(
            role=Role.RESPONDER,
            static_private=gw_priv,
            limits=limits,
            now=0.0,
            authorize=lambda key: key == agent_pub,
            suites=tuple(Suite),
        )
    )
    pump(agent, gateway, 0.0)
    drain(agent), drain(gateway)
    assert agent.suite is gateway.suite is suite
    return agent, gateway


def scrape(
    agent: TunnelConnection, gateway: TunnelConnection, now: float, open_data: bool = True
) -> None:
    sid = gateway.open_stream("edge-bench", 9400, REQUEST if open_data else b"")
    pump(gateway, agent, now)
    drain(agent)
    agent.accept_stream(sid)
    pump(gateway, agent, now)
    drain(gateway)
    if not open_data:  # the request in its own DATA frame, after OPEN_RESULT
        gateway.send_stream_data(sid, REQUEST)
        pump(gateway, agent, now)
        drain(agent)
    view = memoryview(RESPONSE)
    while view:
        n = min(agent.send_capacity(sid), len(view))
        agent.send_stream_data(sid, view[:n])
        view = view[n:]
        pump(gateway, agent, now)
        drain(gateway)
        drain(agent)
    agent.end_stream(sid)
    gateway.end_stream(sid)
    pump(gateway, agent, now)
    drain(gateway), drain(agent)
    assert agent.open_streams == 0 and gateway.open_streams == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cipher", default=Suite.CHACHAPOLY.label,
                        choices=[*(s.label for s in Suite), "both"])  # fmt: skip
    parser.add_argument("--no-open-data", action="store_true",
                        help="send the request after OPEN_RESULT (before issue 12's OPEN data)")  # fmt: skip
    args = parser.parse_args()
    suites = list(Suite) if args.cipher == "both" else [suite_by_name(args.cipher)]
    pairs = {suite: connected(suite) for suite in suites}
    now = 1.0
    per_scrape: dict[Suite, list[float]] = {suite: [] for suite in suites}
    for _ in range(args.rounds):
        for suite, (agent, gateway) in pairs.items():  # interleaved: same machine state
            started = time.process_time()
            for _ in range(args.scrapes):
                scrape(agent, gateway, now, open_data=not args.no_open_data)
            per_scrape[suite].append((time.process_time() - started) / args.scrapes * 1e6)
    for suite, rounds in per_scrape.items():
        median, best = statistics.median(rounds), min(rounds)
        print(f"| {build()} | {suite.label} | {median:.0f} | {best:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
