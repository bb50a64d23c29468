"""L3 per-packet cost in one process: the Python work of one datagram through the tunnel core.

Two connected TunnelConnections (ChaCha20-Poly1305, as in production) and the agent's
TunForwarder on a MemoryTun: ``send`` is ``send_datagram`` + ``data_to_send`` on the gateway
side, ``receive`` is ``receive_data`` on the agent side up to the packet written to the TUN
(through the datagram sink where the tree has one, else through the DatagramReceived events,
as the tunnel dispatched them before). No sockets, no event loop: the sans-IO part of the path.

- ``hot``: packets back to back (caches warm), µs per packet;
- ``cold``: one packet every 5 ms (as bench_l3.py's pings), median µs per packet: what a
  lone packet costs when the process wakes up for it.

Run against any tree: ``python bench/bench_l3_path.py [--repo PATH]``.
"""

from __future__ import annotations

import argparse
import ipaddress
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--packets", type=int, default=20_000)
    parser.add_argument("--cold", type=int, default=300)
    parser.add_argument("--size", type=int, default=84, help="IP packet bytes (84: a ping)")
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    from prometheus_client import CollectorRegistry

    from edge_agent.tun import TunForwarder
    from raven.l3.build import icmp_echo
    from raven.protocol.events import DatagramReceived
    from raven.transport.tun import MemoryTun
    from tests.helpers.sansio import connected

    tun = MemoryTun("ag0", capacity=10)
    tun.on_write = lambda packet: None
    site = [ipaddress.ip_network("192.168.50.0/24")]
    forwarder = TunForwarder(tun, CollectorRegistry(), site, 1380)
    src, dst = ipaddress.IPv4Address("10.1.0.2"), ipaddress.IPv4Address("192.168.50.7")
    packet = icmp_echo(src, dst, 1, 1, bytes(max(0, args.size - 28)))

    def pair() -> tuple[Any, Any, Callable[[bytes], None]]:
        agent, gateway = connected()
        sink = forwarder.packet_from_gateway
        if hasattr(agent, "set_datagram_sink"):
            agent.set_datagram_sink(sink)

            def receive(wire: bytes) -> None:
                agent.receive_data(wire, 1.0)
        else:

            def receive(wire: bytes) -> None:
                agent.receive_data(wire, 1.0)
                while (event := agent.next_event()) is not None:
                    if isinstance(event, DatagramReceived):
                        sink(event.data)

        return agent, gateway, receive

    _, gateway, receive = pair()
    n = args.packets
    start = time.perf_counter()
    wires = []
    for _ in range(n):
        gateway.send_datagram(packet)
        wires.append(gateway.data_to_send(256 * 1024, 1.0))
    send_hot = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for wire in wires:
        receive(wire)
    receive_hot = (time.perf_counter() - start) / n * 1e6
    if forwarder.metrics.traffic("to_agent", "local").packets != n:
        raise SystemExit("packets did not arrive")
    _, gateway, receive = pair()
    sends, receives = [], []
    for _ in range(args.cold):
        time.sleep(0.005)
        t0 = time.perf_counter()
        gateway.send_datagram(packet)
        wire = gateway.data_to_send(256 * 1024, 1.0)
        t1 = time.perf_counter()
        receive(wire)
        t2 = time.perf_counter()
        sends.append(t1 - t0)
        receives.append(t2 - t1)
    print("| µs per packet | send | receive |")
    print("|---|---|---|")
    print(f"| hot ({n} back to back) | {send_hot:.1f} | {receive_hot:.1f} |")
    cold_send, cold_receive = statistics.median(sends) * 1e6, statistics.median(receives) * 1e6
    print(f"| cold (median of {args.cold}, one per 5 ms) | {cold_send:.1f} | {cold_receive:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
