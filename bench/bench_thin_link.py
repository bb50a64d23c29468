"""Scrapes over a thin, slow edge link (issue 33): 2 Mbit/s each way, 150 ms round trip.

Topology (network namespaces, root only)::

    cloud ns: `raven gateway` (10.210.0.1); the scraper (this process, a socket in the ns)
      |-- veth, tbf 2 Mbit/s on both ends (`tc qdisc ... tbf rate 2mbit burst 32kbit`)
    site ns:  delay relay 127.0.0.1:10262 -> 10.210.0.1:10262, 75 ms each way (this kernel has
              no netem: a store-and-forward relay adds the delay); `raven agent` dialling the
              relay; three targets: a 20 KB metrics page (edge-small), a 4 MB page (edge-big)
              and 3,000 series (edge-series, scraped every second: what a backfill carries)
    cloud ns: a remote-write receiver (counts what the gateway's backfill writes)

Scenarios, each a number of small scrapes (GET through the gateway's proxy listener, a new
connection each, as a Prometheus with a short keep-alive would): the small scrape's latency
alone, and while a loop fetches the 4 MB page over and over (bulk sharing the link, in the
same direction as a backfill), and while a real backfill crosses the link: the relay is
stopped for ``--outage-s`` while edge-series is scraped every second, the agent buffers those
scrapes, and on reconnect sends them (a bulk stream) while the small scrapes go on. Also
counted: tunnels lost (dead-peer detection must not misfire on a slow, busy link).

Usage: sudo .venv/bin/python bench/bench_thin_link.py [--scrapes 40] [--rate 2mbit] [--delay-ms 75]
       [--outage-s 60] [--series 3000]
Prints Markdown (BENCHMARKS.md, "Thin links").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import python_env, raven_cmd, write_key  # noqa: E402
from tests.helpers.e2e.netns import Lab, Netns, Proc, missing_prerequisites, veth, wait_until  # noqa: E402

GATEWAY = "10.210.0.1"
TUNNEL_PORT, PROXY_PORT, ADMIN_PORT, AGENT_ADMIN = 10262, 10264, 10265, 10266
SMALL_PORT, BIG_PORT, SERIES_PORT, RECEIVER_PORT = 9100, 9101, 9102, 9090
SMALL_BYTES, BIG_BYTES = 20 * 1024, 4 * 1024 * 1024

RELAY = """
import asyncio, socket, sys, time
DELAY = float(sys.argv[1]); TARGET = (sys.argv[2], int(sys.argv[3]))
BUF = 8 * 1024  # small socket buffers: the relay is a delay line, not a bufferbloat
async def pipe(r, w):
    q = asyncio.Queue(maxsize=4)  # a delay line holds about rate x delay bytes, not more
    async def out():
        while True:
            due, data = await q.get()
            if data is None:
                w.close(); return
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            w.write(data); await w.drain()
    task = asyncio.ensure_future(out())
    while data := await r.read(8192):
        await q.put((time.monotonic() + DELAY, data))
    await q.put((0, None)); await task
async def handle(r1, w1):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, TARGET)
    r2, w2 = await asyncio.open_connection(sock=sock)
    w1.transport.set_write_buffer_limits(BUF); w2.transport.set_write_buffer_limits(BUF)
    await asyncio.gather(pipe(r1, w2), pipe(r2, w1), return_exceptions=True)
async def main():
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
    lsock.bind(("127.0.0.1", 10262)); lsock.listen(16)
    server = await asyncio.start_server(handle, sock=lsock)
    await server.serve_forever()
asyncio.run(main())
"""

TARGETS = """
import http.server, sys, time
PAGES = {int(sys.argv[1]): b"x" * int(sys.argv[2]), int(sys.argv[3]): b"y" * int(sys.argv[4])}
SERIES_PORT, SERIES = int(sys.argv[5]), int(sys.argv[6])
def series_page():  # valid exposition text, values changing every scrape (as a real exporter's)
    t = time.time()
    lines = ["# TYPE thin_gauge gauge"]
    lines += [f'thin_gauge{{core="{i}",kind="k{i % 7}"}} {(t * (i + 1)) % 1000:.3f}'
              for i in range(SERIES)]
    return ("\\n".join(lines) + "\\n").encode()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        port = self.server.server_address[1]
        body = series_page() if port == SERIES_PORT else PAGES[port]
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain"); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
import threading
for port in [*PAGES, SERIES_PORT]:
    s = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
"""


RECEIVER = """
import http.server, json, sys, threading, time
got = {"requests": 0, "bytes": 0, "last": 0.0}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):  # a remote-write receiver: takes every batch (204), counts it
        body = self.rfile.read(int(self.headers["Content-Length"]))
        got["requests"] += 1; got["bytes"] += len(body); got["last"] = time.time()
        self.send_response(204); self.send_header("Content-Length", "0"); self.end_headers()
    def do_GET(self):
        body = json.dumps(got).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def scrape(cloud: Netns, node: str, port: int, timeout_s: float = 30.0) -> tuple[float, int]:
    """One GET through the gateway's proxy (absolute form): (seconds, bytes of body)."""
    start = time.monotonic()
    result = cloud.http(GATEWAY, PROXY_PORT, f"http://{node}:{port}/metrics", timeout_s=timeout_s)
    if result.status != 200:
        detail = result.headers.get("x-raven-error", "")
        raise RuntimeError(f"scrape of {node}:{port}: HTTP {result.status} {detail}")
    return time.monotonic() - start, len(result.body)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def small_scrapes(cloud: Netns, count: int, interval_s: float) -> list[float]:
    times = []
    for _ in range(count):
        took, size = scrape(cloud, "edge-small", SMALL_PORT)
        assert size == SMALL_BYTES, size
        times.append(took)
        time.sleep(max(0.0, interval_s - took))
    return times


def bulk_loop(cloud: Netns, stop: threading.Event, done: list[float]) -> None:
    while not stop.is_set():
        took, size = scrape(cloud, "edge-big", BIG_PORT, timeout_s=120)
        assert size == BIG_BYTES
        done.append(took)


def agent_status(site: Netns) -> dict[str, Any]:
    return dict(json.loads(site.http("127.0.0.1", AGENT_ADMIN, "/api/v1/status").body))


def series_loop(cloud: Netns, stop: threading.Event) -> None:
    """Prometheus's job on edge-series: a scrape a second (failing during the outage)."""
    while not stop.wait(1.0):
        with contextlib.suppress(OSError):
            cloud.http(GATEWAY, PROXY_PORT, f"http://edge-series:{SERIES_PORT}/metrics",
                       timeout_s=0.9)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--rate", default="2mbit")
    parser.add_argument("--delay-ms", type=float, default=75.0)
    parser.add_argument("--outage-s", type=float, default=60.0)
    parser.add_argument("--series", type=int, default=3000)
    args = parser.parse_args()
    missing = missing_prerequisites(["tc"])
    if missing or os.geteuid() != 0:
        print(f"needs root and {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="raven-thin-") as tmp_name:
        lab = Lab(Path(tmp_name))
        try:
            return run(lab, args)
        finally:
            lab.close()


class Bench:
    """The two namespaces, their processes and the link between them."""

    def __init__(self, lab: Lab, args: argparse.Namespace) -> None:
        self.lab, self.args = lab, args
        self.cloud, self.site = lab.netns("thin-cloud"), lab.netns("thin-site")
        veth(self.cloud, "to-site", f"{GATEWAY}/24", self.site, "up0", "10.210.0.2/24")
        for ns, dev in ((self.cloud, "to-site"), (self.site, "up0")):
            ns.run(["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", args.rate,
                    "burst", "32kbit", "latency", "100ms"])  # fmt: skip
        gw_key, agent_key = lab.workdir / "gw.key", lab.workdir / "agent.key"
        self.gw_pub, self.agent_pub = write_key(gw_key), write_key(agent_key)
        self.gateway = self._gateway(gw_key)
        self.relay = lab.process(self.site, "relay", [
            sys.executable, "-c", RELAY, str(args.delay_ms / 1000), GATEWAY, str(TUNNEL_PORT)])  # fmt: skip
        targets = lab.process(self.site, "targets", [
            sys.executable, "-c", TARGETS, str(SMALL_PORT), str(SMALL_BYTES), str(BIG_PORT),
            str(BIG_BYTES), str(SERIES_PORT), str(args.series)])  # fmt: skip
        self.site.wait_for_port("127.0.0.1", 10262, proc=self.relay)
        self.site.wait_for_port("127.0.0.1", SERIES_PORT, proc=targets)
        self.agent = self._agent(agent_key)

    def _gateway(self, key: Path) -> Proc:
        receiver = self.lab.process(self.cloud, "receiver", [
            sys.executable, "-c", RECEIVER, GATEWAY, str(RECEIVER_PORT)])  # fmt: skip
        self.cloud.wait_for_port(GATEWAY, RECEIVER_PORT, proc=receiver)
        conf = self.lab.workdir / "gateway.yaml"
        conf.write_text(json.dumps({
            "private_key_file": str(key), "tunnel_listen": f"{GATEWAY}:{TUNNEL_PORT}",
            "admin_listen": f"{GATEWAY}:{ADMIN_PORT}",
            "proxy": {"http_listen": f"{GATEWAY}:{PROXY_PORT}", "tls_listeners": [],
                      "default_timeout_s": 60, "max_timeout_s": 120},
            "agents": [{"name": "thin", "public_key": self.agent_pub, "nodes": ["edge-*"]}],
            "backfill": {"enabled": True, "out_of_order_window_s": 3600,
                         "remote_write_url": f"http://{GATEWAY}:{RECEIVER_PORT}/api/v1/write",
                         "jobs": [{"port": SERIES_PORT, "job": "thin-series"}]},
            "log": {"level": "warning"}}))  # fmt: skip
        gateway = self.lab.process(self.cloud, "gateway", [*raven_cmd(), "gateway", "-c",
                                                           str(conf)], env=python_env())  # fmt: skip
        self.cloud.wait_for_http(GATEWAY, ADMIN_PORT, "/healthz", timeout_s=30, proc=gateway)
        return gateway

    def _agent(self, key: Path) -> Proc:
        conf = self.lab.workdir / "agent.yaml"
        conf.write_text(json.dumps({
            "private_key_file": str(key), "gateway": "127.0.0.1:10262",
            "gateway_public_key": self.gw_pub, "admin_listen": f"127.0.0.1:{AGENT_ADMIN}",
            "nodes": {"edge-small": "127.0.0.1", "edge-big": "127.0.0.1",
                      "edge-series": "127.0.0.1"},
            "allowed_ports": [SMALL_PORT, BIG_PORT, SERIES_PORT],
            "reconnect": {"min_backoff_s": 0.5, "max_backoff_s": 2.0},
            "backfill": {"enabled": True, "dir": str(self.lab.workdir / "buffer")},
            "log": {"level": "warning"}}))  # fmt: skip
        agent = self.lab.process(self.site, "agent", [*raven_cmd(), "agent", "-c", str(conf)],
                                 env=python_env())  # fmt: skip
        self.site.wait_for_port("127.0.0.1", AGENT_ADMIN, timeout_s=30, proc=agent)
        self.wait_tunnel()
        return agent

    def wait_tunnel(self) -> None:
        wait_until(lambda: any(g["up"] and g["accepted_nodes"] == 3 for g in self.status()["gateways"]),
                   60, "tunnel up", procs=[self.gateway])  # fmt: skip

    def status(self) -> dict[str, Any]:
        return agent_status(self.site)

    def receiver(self) -> dict[str, Any]:
        return dict(json.loads(self.cloud.http(GATEWAY, RECEIVER_PORT, "/").body))


def beside_bulk(bench: Bench, count: int) -> tuple[list[float], list[float]]:
    stop, bulk = threading.Event(), list[float]()
    worker = threading.Thread(target=bulk_loop, args=(bench.cloud, stop, bulk), daemon=True)
    worker.start()
    time.sleep(2.0)
    if os.environ.get("THIN_SS"):
        print(bench.site.run(["ss", "-tinm"]), file=sys.stderr)
        print(bench.cloud.run(["tc", "-s", "qdisc", "show", "dev", "to-site"]), file=sys.stderr)
    shared = small_scrapes(bench.cloud, count, 1.0)
    stop.set()
    worker.join(180)
    return shared, bulk


def beside_backfill(bench: Bench, args: argparse.Namespace) -> tuple[list[float], str]:
    """An outage of the relay while edge-series is scraped, then small scrapes while the
    agent's buffer crosses the link; (their times, what the backfill was)."""
    stop = threading.Event()
    job = threading.Thread(target=series_loop, args=(bench.cloud, stop), daemon=True)
    job.start()
    wait_until(lambda: bench.status()["backfill"]["targets"] >= 1, 60, "edge-series learned")
    time.sleep(5.0)  # a few arrivals for the interval estimate
    bench.relay.stop()
    wait_until(lambda: bench.status()["backfill"]["targets_local"] >= 1, 30, "local scrapes")
    time.sleep(args.outage_s)
    buffered = bench.status()["backfill"]["buffered_bytes"]
    before = bench.receiver()
    bench.relay.start()
    bench.site.wait_for_port("127.0.0.1", 10262, proc=bench.relay)
    bench.wait_tunnel()
    started, times = time.monotonic(), list[float]()
    while bench.status()["backfill"]["buffered_bytes"] > 0 or len(times) < 5:
        took, size = scrape(bench.cloud, "edge-small", SMALL_PORT)
        assert size == SMALL_BYTES, size
        times.append(took)
        time.sleep(max(0.0, 1.0 - took))
        if time.monotonic() - started > 600:
            raise RuntimeError("the backfill did not finish in 10 minutes")
    drained = time.monotonic() - started
    stop.set()
    job.join(5)
    after = bench.receiver()
    sent = after["bytes"] - before["bytes"]
    note = (f"{args.outage_s:g} s outage of {args.series:,} series: {buffered / 1024:.0f} KiB "
            f"buffered, {sent / 1024:.0f} KiB in {after['requests'] - before['requests']} "
            f"remote writes, buffer empty {drained:.1f} s after reconnect")  # fmt: skip
    return times, note


def run(lab: Lab, args: argparse.Namespace) -> int:
    bench = Bench(lab, args)
    scrape(bench.cloud, "edge-small", SMALL_PORT)  # warm: the first scrape opens the kept stream
    rows: list[tuple[str, list[float], list[float]]] = []
    rows.append(("alone", small_scrapes(bench.cloud, args.scrapes, 1.0), []))
    shared, bulk = beside_bulk(bench, args.scrapes)
    rows.append(("with 4 MB pages back to back", shared, bulk))
    connects = [g["connects"] for g in bench.status()["gateways"]]
    backfill, note = beside_backfill(bench, args)
    rows.append(("while the backfill after an outage crosses the link", backfill, []))
    print(f"\nthin link: {args.rate} each way (tbf), {2 * args.delay_ms:g} ms round trip (relay);"
          f" {args.scrapes} scrapes of a {SMALL_BYTES // 1024} KB page per row (the backfill"
          f" row: one a second until the buffer is empty)\n")  # fmt: skip
    print("| scenario | small scrapes | p50 s | p99 s | max s | 4 MB pages done (median s each) |")
    print("|---|---|---|---|---|---|")
    for name, times, big in rows:
        bulk_note = f"{len(big)} ({statistics.median(big):.1f})" if big else "-"
        print(f"| {name} | {len(times)} | {percentile(times, 50):.2f} "
              f"| {percentile(times, 99):.2f} | {max(times):.2f} | {bulk_note} |")  # fmt: skip
    print(f"\nbackfill: {note}")
    print(f"tunnel connects before the outage: {connects} (1 = never lost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
