"""A plain-TCP stand-in for the tunnel's datagram path, and its loopback tests.

NOT the Raven tunnel: no handshake, no encryption. It carries u16-length-prefixed IP
packets between an :class:`L3Router` (gateway side) and a :class:`TunForwarder` (agent
side) so the L3 data path (TUN devices, routing, cryptokey checks, ICMP, MSS clamping)
can be proven in network namespaces before, and independently of, the real tunnel.
``send`` honours the L3 contract: it never blocks and returns False once the socket's
write buffer passes a bound, as the tunnel's bounded datagram queue does.

Run as processes by tests/e2e/test_l3_netns.py and bench/bench_l3.py::

    python -m tests.integration.test_l3_pipe_link gateway --tun rvg0 --listen 10.0.9.1:7000 ...
    python -m tests.integration.test_l3_pipe_link agent --tun rva0 --connect 10.0.9.1:7000 ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import struct
import sys
from collections.abc import Callable
from typing import cast

from prometheus_client import CollectorRegistry, generate_latest

from cloud_gateway.l3 import L3Router
from edge_agent.tun import PathHandle, TunForwarder
from raven.l3 import IPNetwork
from raven.l3.build import icmp_echo, udp_packet
from raven.transport.netconfig import NetConfig
from raven.transport.tun import LinuxTun, MemoryTun

#: Bytes queued in the socket beyond which send() drops (the "datagram queue" bound).
WRITE_BUFFER_LIMIT = 2 * 1024 * 1024
_LEN = struct.Struct("!H")


class PacketLink(asyncio.Protocol):
    """One TCP connection carrying length-prefixed packets both ways."""

    def __init__(self, on_packet: Callable[[bytes], None], on_lost: Callable[[], None]) -> None:
        self.on_packet = on_packet
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._inbox = bytearray()
        self._outbox: list[bytes] = []
        self._flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost()

    def send(self, packet: bytes) -> bool:
        t = self.transport
        if t is None or t.is_closing() or t.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
            return False
        self._outbox.append(_LEN.pack(len(packet)))
        self._outbox.append(packet)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.transport is not None and self._outbox:
            self.transport.write(b"".join(self._outbox))
        self._outbox.clear()

    def data_received(self, data: bytes) -> None:
        buf = self._inbox
        buf += data
        at = 0
        while len(buf) - at >= 2:
            (n,) = _LEN.unpack_from(buf, at)
            if len(buf) - at - 2 < n:
                break
            self.on_packet(bytes(buf[at + 2 : at + 2 + n]))
            at += 2 + n
        del buf[:at]


def _prefixes(text: str) -> list[IPNetwork]:
    return [ipaddress.ip_network(p) for p in text.split(",") if p]


async def serve_gateway(
    router: L3Router, host: str, port: int, authorised: list[IPNetwork]
) -> asyncio.Server:
    """Accept agents; the first packet-frame of a connection is its registration text."""
    loop = asyncio.get_running_loop()

    def factory() -> PacketLink:
        state: dict[str, object] = {}

        def on_packet(packet: bytes) -> None:
            agent_port = state.get("port")
            if agent_port is None:
                name, _, prefixes = packet.decode().partition(" ")
                agent_port = router.attach_agent(name, authorised, link.send)
                agent_port.set_routes(_prefixes(prefixes))
                state["port"] = agent_port
            else:
                agent_port.packet_from_agent(packet)  # type: ignore[attr-defined]

        def on_lost() -> None:
            agent_port = state.get("port")
            if agent_port is not None:
                agent_port.detach()  # type: ignore[attr-defined]

        link = PacketLink(on_packet, on_lost)
        return link

    return await loop.create_server(factory, host, port, reuse_address=True)


async def run_agent_link(
    fwd: TunForwarder,
    host: str,
    port: int,
    name: str,
    subnets: list[IPNetwork],
    stop: asyncio.Event,
) -> None:
    """Keep one path to the gateway up, reconnecting after a loss."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        lost = asyncio.Event()
        paths: list[PathHandle] = []

        def deliver(packet: bytes, paths: list[PathHandle] = paths) -> None:
            paths[0].packet_from_gateway(packet)

        try:
            _, link = await loop.create_connection(
                lambda: PacketLink(deliver, lost.set),  # noqa: B023 (awaited in this iteration)
                host,
                port,
            )
        except OSError:
            await asyncio.sleep(0.2)
            continue
        link.send(f"{name} {','.join(map(str, subnets))}".encode())
        paths.append(fwd.add_path(link.send))
        await asyncio.wait(
            [asyncio.create_task(lost.wait()), asyncio.create_task(stop.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        paths[0].remove()
        if link.transport is not None:
            link.transport.close()


async def _write_metrics(registry: CollectorRegistry, path: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(generate_latest(registry))
        os.replace(tmp, path)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def main_async(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tun = LinuxTun(args.tun)
    netconfig = NetConfig()
    await netconfig.configure(
        tun.name, args.tun_mtu or args.mtu, args.address, _prefixes(args.routes)
    )
    registry = CollectorRegistry()
    host, _, port = (args.listen or args.connect).rpartition(":")
    tasks = []
    if args.role == "gateway":
        router = L3Router(tun, registry, netconfig, args.mtu)
        await router.start()
        server = await serve_gateway(router, host, int(port), _prefixes(args.authorised))
    else:
        fwd = TunForwarder(tun, registry, _prefixes(args.subnets), args.mtu, agent=args.name)
        await fwd.start()
        tasks.append(
            asyncio.create_task(
                run_agent_link(fwd, host, int(port), args.name, _prefixes(args.subnets), stop)
            )
        )
        if args.spoof:
            src, dst = map(ipaddress.ip_address, args.spoof.split(","))

            def spoof() -> None:  # SIGUSR1: a compromised agent injects forged packets
                for path in fwd.paths[:1]:
                    for i in range(5):
                        path.send(udp_packet(src, dst, 6666, 6666, b"spoofed"))
                        path.send(icmp_echo(src, dst, 99, i))

            loop.add_signal_handler(signal.SIGUSR1, spoof)
    if args.metrics_file:
        tasks.append(asyncio.create_task(_write_metrics(registry, args.metrics_file, stop)))
    print("ready", flush=True)
    await stop.wait()
    await asyncio.gather(*tasks)
    if args.role == "gateway":
        server.close()
        await router.stop()
    tun.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=["gateway", "agent"])
    p.add_argument("--tun", required=True)
    p.add_argument("--mtu", type=int, default=1380, help="tunnel MTU used by the L3 code")
    p.add_argument("--tun-mtu", type=int, default=0, help="device MTU (default: --mtu)")
    p.add_argument("--address", action="append", default=[])
    p.add_argument("--routes", default="", help="comma-separated prefixes routed into the TUN")
    p.add_argument("--listen", default="")
    p.add_argument("--connect", default="")
    p.add_argument("--authorised", default="")
    p.add_argument("--subnets", default="")
    p.add_argument("--name", default="site-a")
    p.add_argument("--spoof", default="", help="SRC,DST: on SIGUSR1 send forged packets")
    p.add_argument("--metrics-file", default="")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(args))


# -- loopback integration tests: two MemoryTuns, a real TCP connection ------------------

CLOUD = ipaddress.IPv4Address("10.1.0.2")
EDGE = ipaddress.IPv4Address("192.168.50.7")
SITE = [ipaddress.ip_network("192.168.50.0/24")]


async def _until(cond: Callable[[], bool]) -> None:
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in 2 s")


async def test_link_over_loopback_carries_packets_and_checks_sources() -> None:
    gw_tun, ag_tun = MemoryTun("gw"), MemoryTun("ag")
    gw_reg = CollectorRegistry()
    router = L3Router(gw_tun, gw_reg, None, 1380)
    fwd = TunForwarder(ag_tun, CollectorRegistry(), SITE, 1380)
    await router.start()
    await fwd.start()
    server = await serve_gateway(router, "127.0.0.1", 0, SITE)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    agent = asyncio.create_task(run_agent_link(fwd, "127.0.0.1", port, "site-a", SITE, stop))
    await _until(lambda: bool(router.routes()))
    down = [udp_packet(CLOUD, EDGE, 1, 2, bytes([i]) * 1000) for i in range(50)]
    for p in down:
        gw_tun.inject(p)
    await _until(lambda: len(ag_tun.written) == 50)
    assert list(ag_tun.written) == down
    ag_tun.inject(udp_packet(EDGE, CLOUD, 2, 1, b"up"))
    fwd.paths[0].send(udp_packet(ipaddress.IPv4Address("10.1.0.66"), CLOUD, 2, 1, b"forged"))
    await _until(
        lambda: gw_reg.get_sample_value("raven_l3_drops_total", {"reason": "spoofed_source"}) == 1
    )
    assert gw_tun.take_written() == [udp_packet(EDGE, CLOUD, 2, 1, b"up")]
    stop.set()
    await agent
    await _until(lambda: not router.routes())  # the connection closed: the port detached
    server.close()
    await server.wait_closed()


async def test_send_refuses_when_the_socket_backs_up() -> None:
    lost: list[bool] = []
    link = PacketLink(lambda _: None, lambda: lost.append(True))
    assert not link.send(b"x")  # not connected yet

    class Backed:
        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return WRITE_BUFFER_LIMIT + 1

    link.transport = Backed()  # type: ignore[assignment]
    assert not link.send(b"x")
    frames: list[bytes] = []
    link.on_packet = frames.append
    wire = _LEN.pack(3) + b"abc" + _LEN.pack(2) + b"de" + _LEN.pack(5) + b"f"
    for i in range(len(wire)):  # one byte at a time
        link.data_received(wire[i : i + 1])
    assert frames == [b"abc", b"de"]
    link.data_received(b"ghij")
    assert frames == [b"abc", b"de", b"fghij"]


if __name__ == "__main__":
    main(sys.argv[1:])
