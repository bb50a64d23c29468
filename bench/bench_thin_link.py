"""Scrapes over a thin, slow edge link (issue 33): 2 Mbit/s each way, 150 ms round trip.

Topology (network namespaces, root only)::

    cloud ns: `raven gateway` (10.210.0.1); the scraper (this process, a socket in the ns)
      |-- veth, tbf 2 Mbit/s on both ends (`tc qdisc ... tbf rate 2mbit burst 32kbit`)
    site ns:  delay relay 127.0.0.1:10262 -> 10.210.0.1:10262, 75 ms each way (this kernel has
              no netem: a store-and-forward relay adds the delay); `raven agent` dialling the
              relay; two targets: a 20 KB metrics page (edge-small) and a 4 MB page (edge-big)

Scenarios, each a number of small scrapes (GET through the gateway's proxy listener, a new
connection each, as a Prometheus with a short keep-alive would): the small scrape's latency
alone, and while a loop fetches the 4 MB page over and over (bulk sharing the link, in the
same direction as a backfill). Also counted: tunnels lost (dead-peer detection must not
misfire on a slow, busy link). That a backfill yields to live scrapes is the scheduler's
(bulk streams, tests/unit/test_bulk_streams.py).

Usage: sudo .venv/bin/python bench/bench_thin_link.py [--scrapes 40] [--rate 2mbit] [--delay-ms 75]
Prints Markdown (BENCHMARKS.md, "Thin links").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.netns import Lab, Netns, missing_prerequisites, veth, wait_until  # noqa: E402
from tests.helpers import python_env, raven_cmd, write_key  # noqa: E402

GATEWAY = "10.210.0.1"
TUNNEL_PORT, PROXY_PORT, ADMIN_PORT, AGENT_ADMIN = 10262, 10264, 10265, 10266
SMALL_PORT, BIG_PORT = 9100, 9101
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
import http.server, sys
PAGES = {int(sys.argv[1]): b"x" * int(sys.argv[2]), int(sys.argv[3]): b"y" * int(sys.argv[4])}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = PAGES[self.server.server_address[1]]
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain"); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
import threading
for port in PAGES:
    s = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
"""


def scrape(cloud: Netns, node: str, port: int, timeout_s: float = 30.0) -> tuple[float, int]:
    """One GET through the gateway's proxy (absolute form): (seconds, bytes of body)."""
    start = time.monotonic()
    result = cloud.http(GATEWAY, PROXY_PORT, f"http://{node}:{port}/metrics", timeout_s=timeout_s)
    if result.status != 200:
        raise RuntimeError(f"scrape of {node}:{port}: HTTP {result.status}")
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


def agent_status(site: Netns) -> dict[str, object]:
    return dict(json.loads(site.http("127.0.0.1", AGENT_ADMIN, "/api/v1/status").body))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--rate", default="2mbit")
    parser.add_argument("--delay-ms", type=float, default=75.0)
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


def run(lab: Lab, args: argparse.Namespace) -> int:
    cloud, site = lab.netns("thin-cloud"), lab.netns("thin-site")
    veth(cloud, "to-site", f"{GATEWAY}/24", site, "up0", "10.210.0.2/24")
    for ns, dev in ((cloud, "to-site"), (site, "up0")):
        ns.run(["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", args.rate,
                "burst", "32kbit", "latency", "100ms"])  # fmt: skip
    gw_key, agent_key = lab.workdir / "gw.key", lab.workdir / "agent.key"
    gw_pub, agent_pub = write_key(gw_key), write_key(agent_key)
    gw_conf = lab.workdir / "gateway.yaml"
    gw_conf.write_text(json.dumps({
        "private_key_file": str(gw_key), "tunnel_listen": f"{GATEWAY}:{TUNNEL_PORT}",
        "admin_listen": f"{GATEWAY}:{ADMIN_PORT}",
        "proxy": {"http_listen": f"{GATEWAY}:{PROXY_PORT}", "tls_listeners": [],
                  "default_timeout_s": 60, "max_timeout_s": 120},
        "agents": [{"name": "thin", "public_key": agent_pub, "nodes": ["edge-*"]}],
        "log": {"level": "warning"}}))  # fmt: skip
    gateway = lab.process(cloud, "gateway", [*raven_cmd(), "gateway", "-c", str(gw_conf)],
                          env=python_env())  # fmt: skip
    cloud.wait_for_http(GATEWAY, ADMIN_PORT, "/healthz", timeout_s=30, proc=gateway)
    relay = lab.process(site, "relay", [sys.executable, "-c", RELAY, str(args.delay_ms / 1000),
                                        GATEWAY, str(TUNNEL_PORT)])  # fmt: skip
    targets = lab.process(site, "targets", [sys.executable, "-c", TARGETS, str(SMALL_PORT),
                                            str(SMALL_BYTES), str(BIG_PORT), str(BIG_BYTES)])  # fmt: skip
    site.wait_for_port("127.0.0.1", 10262, proc=relay)
    site.wait_for_port("127.0.0.1", BIG_PORT, proc=targets)
    agent_conf = lab.workdir / "agent.yaml"
    agent_conf.write_text(json.dumps({
        "private_key_file": str(agent_key), "gateway": "127.0.0.1:10262",
        "gateway_public_key": gw_pub, "admin_listen": f"127.0.0.1:{AGENT_ADMIN}",
        "nodes": {"edge-small": "127.0.0.1", "edge-big": "127.0.0.1"},
        "allowed_ports": [SMALL_PORT, BIG_PORT], "log": {"level": "warning"}}))  # fmt: skip
    agent = lab.process(site, "agent", [*raven_cmd(), "agent", "-c", str(agent_conf)],
                        env=python_env())  # fmt: skip
    site.wait_for_port("127.0.0.1", AGENT_ADMIN, timeout_s=30, proc=agent)
    wait_until(lambda: any(g["accepted_nodes"] == 2 for g in agent_status(site)["gateways"]),  # type: ignore[attr-defined,index]
               60, "tunnel up", procs=[agent, gateway])  # fmt: skip
    scrape(cloud, "edge-small", SMALL_PORT)  # warm: the first scrape opens the kept stream
    rows = []
    alone = small_scrapes(cloud, args.scrapes, 1.0)
    rows.append(("alone", alone, []))
    stop, bulk = threading.Event(), []
    worker = threading.Thread(target=bulk_loop, args=(cloud, stop, bulk), daemon=True)
    worker.start()
    time.sleep(2.0)
    if os.environ.get("THIN_SS"):
        print(site.run(["ss", "-tinm"]), file=sys.stderr)
        print(cloud.run(["tc", "-s", "qdisc", "show", "dev", "to-site"]), file=sys.stderr)
        print(site.run(["tc", "-s", "qdisc", "show", "dev", "up0"]), file=sys.stderr)
    shared = small_scrapes(cloud, args.scrapes, 1.0)
    stop.set()
    worker.join(180)
    rows.append(("with 4 MB pages back to back", shared, bulk))
    connects = [g["connects"] for g in agent_status(site)["gateways"]]  # type: ignore[attr-defined,index]
    print(f"\nthin link: {args.rate} each way (tbf), {2 * args.delay_ms:g} ms round trip (relay);"
          f" {args.scrapes} scrapes of a {SMALL_BYTES // 1024} KB page per row\n")  # fmt: skip
    print("| scenario | small scrape p50 s | p99 s | max s | 4 MB pages done (median s each) |")
    print("|---|---|---|---|---|")
    for name, times, big in rows:
        bulk_note = f"{len(big)} ({statistics.median(big):.1f})" if big else "-"
        print(f"| {name} | {percentile(times, 50):.2f} | {percentile(times, 99):.2f} "
              f"| {max(times):.2f} | {bulk_note} |")  # fmt: skip
    print(f"\ntunnel connects during the run: {connects} (1 = never lost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
