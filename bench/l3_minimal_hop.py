"""A reference for bench_l3.py: the least a Python L3 tunnel hop can do, and nothing more.

One process per side, on uvloop like the gateway: a TUN device read with ``add_reader``, each
packet sealed with AES-256-GCM (the suite Raven's ``auto`` picks on this CPU) under a counter
nonce and written to one TCP connection behind a 2-byte length; the other way, records opened
and written to the TUN. About ten Python calls a hop.

It is a yardstick, not a tunnel: a fixed all-zero key, no handshake, no source or destination
checks, no MTU, fragment, ICMP or MSS handling, no flow control, no counters, no keepalive. It
measures what CPython and the event loop cost a packet on this machine, so that
``bench_l3.py --minimal`` can say how much of Raven's distance to wireguard-go is Python's
and how much is Raven's own work. Needs root (a TUN device, routes)::

    python bench/l3_minimal_hop.py gateway TUN LISTEN_HOST:PORT ROUTE
    python bench/l3_minimal_hop.py agent TUN GATEWAY_HOST:PORT ROUTE
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import struct
import subprocess
import sys

import uvloop
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: linux/if_tun.h
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
LENGTH = struct.Struct("!H")
NONCE = struct.Struct("!4xQ")
MTU = 1380


def open_tun(name: str, route: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    subprocess.run(["ip", "link", "set", name, "mtu", str(MTU), "up"], check=True)
    subprocess.run(["ip", "route", "replace", route, "dev", name], check=True)
    return fd


class Hop(asyncio.Protocol):
    """TUN -> seal -> TCP, and TCP -> open -> TUN."""

    def __init__(self, fd: int, done: asyncio.Future[None] | None) -> None:
        self.fd = fd
        self.done = done
        aead = AESGCM(bytes(32))
        self.seal, self.open = aead.encrypt, aead.decrypt
        self.sent = self.received = 0
        self.inbox = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().add_reader(self.fd, self.tun_readable)

    def tun_readable(self) -> None:
        assert self.transport is not None
        while True:
            try:
                packet = os.read(self.fd, 65535)
            except BlockingIOError:
                return
            record = self.seal(NONCE.pack(self.sent), packet, None)
            self.sent += 1
            self.transport.write(LENGTH.pack(len(record)) + record)

    def data_received(self, data: bytes) -> None:
        inbox = self.inbox + data
        while len(inbox) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(inbox)
            if len(inbox) < LENGTH.size + n:
                break
            packet = self.open(NONCE.pack(self.received), inbox[2 : 2 + n], None)
            self.received += 1
            inbox = inbox[2 + n :]
            os.write(self.fd, packet)
        self.inbox = inbox

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():  # the agent ends with its link
            self.done.set_result(None)


async def run(role: str, tun: str, address: str, route: str) -> None:
    host, port = address.rsplit(":", 1)
    fd = open_tun(tun, route)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    if role == "gateway":
        # each connection takes the TUN over (a probe of the port, then the agent)
        server = await loop.create_server(lambda: Hop(fd, None), host, int(port))
        async with server:
            await server.serve_forever()
    else:
        await loop.create_connection(lambda: Hop(fd, done), host, int(port))
        await done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("gateway", "agent"))
    parser.add_argument("tun")
    parser.add_argument("address", help="host:port to listen on (gateway) or connect to")
    parser.add_argument("route", help="prefix routed into the TUN")
    args = parser.parse_args()
    uvloop.run(run(args.role, args.tun, args.address, args.route))
    return 0


if __name__ == "__main__":
    sys.exit(main())
