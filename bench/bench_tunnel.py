"""Bulk throughput through the tunnel vs a plain TCP relay chain, on loopback.

Topology, each box its own process (so the two cores are used as in production):

    ours:      source -> agent ==tunnel (Noise, mux)==> gateway(forwarder) -> client
    reference: source -> relay (plain TCP)         -> relay               -> client

The client opens N connections and reads for a fixed time; we report MB/s, and CPU
seconds per GB of the two middle processes (from /proc). The ratio ours/reference is
the figure. ``--cipher both`` runs the tunnel under each transport suite in the same run
(the gateway accepts both, the agent is configured with one).
Usage: python bench/bench_tunnel.py [--seconds 5] [--streams 1 64]
                                    [--cipher chacha20-poly1305|aes-256-gcm|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402

BLOCK = os.urandom(256 * 1024)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# ---------------------------------------------------------------- roles (subprocesses)
async def role_source(port: int) -> None:
    async def serve(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                w.write(BLOCK)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def role_relay(port: int, upstream: int) -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(_pump(r, uw), _pump(ur, w))

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def role_gateway(port: int, tunnel_port: int, keydir: str, source_port: int) -> None:
    from prometheus_client import CollectorRegistry

    from cloud_gateway.registry import Registry
    from cloud_gateway.tunnel_listener import TunnelListener
    from raven.config.gateway import AuthorisedAgent
    from raven.keys import encode_key, public_key, read_private_key_file
    from raven.protocol.limits import Limits
    from raven.protocol.suites import Suite
    from raven.telemetry.metrics import TunnelMetrics
    from raven.transport.stream import StreamResetError

    gw = read_private_key_file(Path(keydir) / "gw.key")
    agent_pub = encode_key(public_key(read_private_key_file(Path(keydir) / "agent.key")))
    metrics = TunnelMetrics(CollectorRegistry())
    registry = Registry([AuthorisedAgent(name="bench", public_key=agent_pub, nodes=["*"])], metrics)
    listener = TunnelListener(
        listen=f"127.0.0.1:{tunnel_port}",
        static_private=gw,
        psk=bytes(32),
        limits=Limits(),
        registry=registry,
        metrics=metrics,
        handshake_rate_per_s=100,
        handshake_burst=100,
        suites=tuple(Suite),
    )
    await listener.start()

    async def serve(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        stream = await registry.open_stream("bench-src", source_port, timeout_s=10)
        try:
            while data := await stream.read(256 * 1024):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError, StreamResetError):
            pass
        finally:
            await stream.aclose()
            w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def role_agent(tunnel_port: int, keydir: str, source_port: int, cipher: str) -> None:
    from prometheus_client import CollectorRegistry

    from edge_agent.gateway_link import DialSettings, GatewayLink
    from edge_agent.relay import Relay
    from raven.keys import public_key, read_private_key_file
    from raven.protocol.limits import Limits
    from raven.protocol.suites import suite_by_name
    from raven.telemetry.metrics import TunnelMetrics

    gw_pub = public_key(read_private_key_file(Path(keydir) / "gw.key"))
    agent = read_private_key_file(Path(keydir) / "agent.key")
    relay = Relay({"bench-src": "127.0.0.1"}, [source_port], 5.0, CollectorRegistry())
    settings = DialSettings(
        agent, gw_pub, bytes(32), Limits(), 0.1, 1.0, suites=(suite_by_name(cipher),)
    )
    link = GatewayLink(
        "127.0.0.1",
        tunnel_port,
        settings,
        on_stream=relay.handle,
        registration=lambda: (["bench-src"], []),
        metrics=TunnelMetrics(CollectorRegistry()),
    )
    link.start()
    await asyncio.Event().wait()


# ---------------------------------------------------------------- driver
async def measure(port: int, streams: int, seconds: float) -> int:
    total = 0
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal total
        for _ in range(100):  # the tunnel may still be coming up
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                first = await r.read(1 << 20)
                if first:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("no data through the path")
        while time.monotonic() < stop_at:
            data = await r.read(1 << 20)
            if not data:
                break
            total += len(data)
        w.close()

    await asyncio.gather(*(one() for _ in range(streams)))
    return total


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", *args], cwd=ROOT)


def run_path(
    kind: str, streams: int, seconds: float, keydir: str, cipher: str = ""
) -> tuple[float, float]:
    src, entry, mid = free_port(), free_port(), free_port()
    procs = [spawn("source", str(src))]
    if kind == "tunnel":
        middle = [
            spawn("gateway", str(entry), str(mid), keydir, str(src)),
            spawn("agent", str(mid), keydir, str(src), cipher),
        ]
    else:
        middle = [spawn("relay", str(entry), str(mid)), spawn("relay", str(mid), str(src))]
    procs += middle
    try:
        time.sleep(1.5)
        asyncio.run(measure(entry, streams, 0.5))  # warm up
        cpu0 = sum(cpu_seconds(p.pid) for p in middle)
        t0 = time.monotonic()
        total = asyncio.run(measure(entry, streams, seconds))
        elapsed = time.monotonic() - t0
        cpu = sum(cpu_seconds(p.pid) for p in middle) - cpu0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    mb_s = total / elapsed / 1e6
    cpu_per_gb = cpu / (total / 1e9) if total else float("inf")
    return mb_s, cpu_per_gb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", nargs="+")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    ap.add_argument(
        "--cipher", default="chacha20-poly1305",
        choices=["chacha20-poly1305", "aes-256-gcm", "both"],
    )  # fmt: skip
    args = ap.parse_args()
    ciphers = ["chacha20-poly1305", "aes-256-gcm"] if args.cipher == "both" else [args.cipher]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    if args.role:
        role, *rest = args.role
        if role == "source":
            run(role_source(int(rest[0])))
        elif role == "relay":
            run(role_relay(int(rest[0]), int(rest[1])))
        elif role == "gateway":
            run(role_gateway(int(rest[0]), int(rest[1]), rest[2], int(rest[3])))
        elif role == "agent":
            run(role_agent(int(rest[0]), rest[1], int(rest[2]), rest[3]))
        return
    from raven.keys import generate_private_key, write_private_key_file

    with tempfile.TemporaryDirectory() as keydir:
        write_private_key_file(Path(keydir) / "gw.key", generate_private_key())
        write_private_key_file(Path(keydir) / "agent.key", generate_private_key())
        print(
            f"Command: `python bench/bench_tunnel.py --seconds {args.seconds:g} --cipher "
            f"{args.cipher}` ({os.cpu_count()} cores, loopback)\n"
        )
        print(
            "| streams | suite | tunnel MB/s | plain relay MB/s | ratio | tunnel CPU s/GB "
            "| relay CPU s/GB |"
        )
        print("|---|---|---|---|---|---|---|")
        for n in args.streams:
            r_mb, r_cpu = run_path("relay", n, args.seconds, keydir)
            for cipher in ciphers:
                t_mb, t_cpu = run_path("tunnel", n, args.seconds, keydir, cipher)
                print(
                    f"| {n} | {cipher} | {t_mb:.0f} | {r_mb:.0f} | {t_mb / r_mb:.2f} "
                    f"| {t_cpu:.2f} | {r_cpu:.2f} |"
                )


if __name__ == "__main__":
    main()
