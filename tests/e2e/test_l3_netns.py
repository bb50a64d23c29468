"""L3 through the tunnel in network namespaces: real TUN devices, kernels, ping, iperf3.

Topology (namespaces ``rvn-l3-<role>-<pid>``, deleted by the ``lab`` fixture)::

    cloud host --veth-- cloud gateway ==underlay== edge gateway (agent) --veth-- edge host
    10.1.0.2            10.1.0.1 | 10.0.9.1         10.0.9.2 | 192.168.50.1      192.168.50.7
    fd00:1::2           fd00:1::1  TUN               TUN        fd00:50::1        fd00:50::7

The cloud host routes the edge subnets via the gateway; the edge host routes back via the
agent. Most tests run the real ``raven gateway`` / ``raven agent`` with ``tun.enabled``.
Two run the plain-TCP pipe link of tests/integration/test_l3_pipe_link.py instead (the same
L3Router/TunForwarder/LinuxTun, no encryption) because they need what the real tunnel
rightly never does: forge packets as a compromised agent, or a router MTU below the TUN's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file
from raven.l3 import parse_packet
from raven.l3.build import udp_packet
from raven.transport.tun import LinuxTun
from tests.helpers import REPO_ROOT, python_env, raven_cmd, require
from tests.helpers.e2e.netns import Lab, Netns, Proc, require_e2e, run_in_netns, veth, wait_until
from tests.helpers.e2e.prometheus import Prometheus, parse_exposition, static_job

EDGE_SUBNETS = ["192.168.50.0/24", "fd00:50::/64"]
CLOUD_SUBNETS = ["10.1.0.0/24", "fd00:1::/64"]
#: Announced by the agent but not authorised for it at the gateway (the spoofing test).
UNAUTHORISED = "192.168.60.0/24"
TUN_MTU = 1380
GW_ADMIN, AGENT_ADMIN = ("127.0.0.1", 10265), ("127.0.0.1", 10266)
ENV = python_env()


def require_raven_apps() -> None:
    missing = [
        m for m in ("cloud_gateway/app.py", "edge_agent/app.py") if not (REPO_ROOT / m).exists()
    ]
    require(not missing, f"missing {missing}")


@dataclass
class L3Lab:
    """The four namespaces and the two L3 endpoints (``raven`` or ``pipe``)."""

    lab: Lab
    cloud: Netns
    gw: Netns
    agent: Netns
    edge: Netns
    impl: str = "raven"
    gateway: Proc | None = None
    agent_proc: Proc | None = None

    @classmethod
    def build(cls, lab: Lab, impl: str = "raven") -> L3Lab:
        cloud, gw, agent, edge = (lab.netns(f"l3-{r}") for r in ("cloud", "gw", "agent", "edge"))
        veth(cloud, "c0", "10.1.0.2/24", gw, "g0", "10.1.0.1/24")
        veth(gw, "g1", "10.0.9.1/24", agent, "a1", "10.0.9.2/24")
        veth(agent, "a0", "192.168.50.1/24", edge, "e0", "192.168.50.7/24")
        v6 = [(cloud, "c0", "fd00:1::2/64"), (gw, "g0", "fd00:1::1/64")]
        v6 += [(agent, "a0", "fd00:50::1/64"), (edge, "e0", "fd00:50::7/64")]
        for ns, dev, addr in v6:
            ns.ip("-6", "addr", "add", addr, "dev", dev, "nodad")
        for prefix, via in (("192.168.50.0/24", "10.1.0.1"), ("192.168.60.0/24", "10.1.0.1")):
            cloud.ip("route", "add", prefix, "via", via)
        cloud.ip("-6", "route", "add", "fd00:50::/64", "via", "fd00:1::1")
        edge.ip("route", "add", "default", "via", "192.168.50.1")
        edge.ip("-6", "route", "add", "default", "via", "fd00:50::1")
        agent.ip("route", "add", UNAUTHORISED, "dev", "a0")  # the site has it, unauthorised
        for ns in (gw, agent):
            ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
        return cls(lab, cloud, gw, agent, edge, impl)

    # -- starting the endpoints --------------------------------------------------------

    def start(self, *, router_mtu: int = TUN_MTU) -> None:
        if self.impl == "raven":
            self._start_raven()
        else:
            self._start_pipe(router_mtu)
        procs = [p for p in (self.gateway, self.agent_proc) if p]
        for dst in ("192.168.50.7", "fd00:50::7"):  # both routes are in, both ways
            wait_until(
                functools.partial(ping, self.cloud, dst, 1, timeout_s=0.3), 30, dst, procs=procs
            )

    def _start_raven(self) -> None:
        w = self.lab.workdir
        keys = {}
        for side in ("gateway", "agent"):
            private = generate_private_key()
            write_private_key_file(w / f"{side}.key", private)
            keys[side] = encode_key(public_key(private))
        gateway = {
            "private_key_file": str(w / "gateway.key"),
            "tunnel_listen": "10.0.9.1:10262",
            "admin_listen": "{}:{}".format(*GW_ADMIN),
            "proxy": {"http_listen": "127.0.0.1:10264", "tls_listeners": []},
            "agents": [
                {
                    "name": "site-a",
                    "public_key": keys["agent"],
                    "prefixes": EDGE_SUBNETS,
                    "nodes": ["edge-host"],
                }
            ],
            "tun": {"enabled": True, "name": "rvg0", "mtu": TUN_MTU},
        }
        agent = {
            "private_key_file": str(w / "agent.key"),
            "gateway": "10.0.9.1:10262",
            "gateway_public_key": keys["gateway"],
            "name": "site-a",
            "subnets": [*EDGE_SUBNETS, UNAUTHORISED],
            "nodes": {"edge-host": "192.168.50.7"},
            "admin_listen": "{}:{}".format(*AGENT_ADMIN),
            "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 1.0},
            "tun": {"enabled": True, "name": "rva0", "mtu": TUN_MTU, "routes": CLOUD_SUBNETS},
        }
        for name, doc in (("gateway", gateway), ("agent", agent)):
            (w / f"{name}.yaml").write_text(yaml.safe_dump(doc))
        self.gateway = self.lab.process(
            self.gw, "gateway", [*raven_cmd(), "gateway", "-c", str(w / "gateway.yaml")], env=ENV
        )
        # The agent starts once the gateway is ready: an agent registering while the gateway
        # is still bringing L3 up got no routes (see docs/l3.md, "Start-up order").
        self.gw.wait_for_http(*GW_ADMIN, "/readyz", proc=self.gateway, timeout_s=30)
        self.agent_proc = self.lab.process(
            self.agent, "agent", [*raven_cmd(), "agent", "-c", str(w / "agent.yaml")], env=ENV
        )

    def _start_pipe(self, router_mtu: int) -> None:
        link = [sys.executable, "-m", "tests.integration.test_l3_pipe_link"]
        w = self.lab.workdir
        self.gateway = self.lab.process(self.gw, "pipe-gateway", [
            *link, "gateway", "--tun", "rvg0", "--mtu", str(router_mtu), "--tun-mtu", str(TUN_MTU),
            "--listen", "10.0.9.1:7000", "--authorised", ",".join(EDGE_SUBNETS),
            "--metrics-file", str(w / "gateway.prom")], env=ENV, cwd=REPO_ROOT)  # fmt: skip
        self.agent_proc = self.lab.process(self.agent, "pipe-agent", [
            *link, "agent", "--tun", "rva0", "--mtu", str(TUN_MTU), "--connect", "10.0.9.1:7000",
            "--subnets", ",".join(EDGE_SUBNETS), "--routes", ",".join(CLOUD_SUBNETS),
            "--spoof", "10.1.0.66,10.1.0.2", "--metrics-file", str(w / "agent.prom")],
            env=ENV, cwd=REPO_ROOT)  # fmt: skip

    def stop(self) -> None:
        """Stop both endpoints (their TUN devices, and the routes into them, go)."""
        for proc in (self.agent_proc, self.gateway):
            if proc is not None:
                proc.stop()

    # -- observing -----------------------------------------------------------------------

    def metric(self, side: str, name: str, **labels: str) -> float:
        if self.impl == "raven":
            ns, addr = (self.gw, GW_ADMIN) if side == "gateway" else (self.agent, AGENT_ADMIN)
            text = ns.http(*addr, "/metrics").text
        else:
            path = self.lab.workdir / f"{side}.prom"
            text = path.read_text() if path.exists() else ""
        return parse_exposition(text).get((name, frozenset(labels.items())), 0.0)


# -- ICMP echo and iperf3, shared with bench/bench_l3.py ---------------------------------


def _checksum(data: bytes) -> int:
    s: int = sum(struct.unpack(f"!{len(data) // 2}H", data + b"\0" * (len(data) % 2)))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ping(ns: Netns, dst: str, count: int = 5, *, size: int = 56, timeout_s: float = 1.0,
         interval_s: float = 0.02, source: str | None = None) -> list[float]:  # fmt: skip
    """RTTs (ms) of ``count`` ICMP echoes from ``ns`` (lost ones left out); DF is set."""
    v6 = ":" in dst
    family, proto, req, rep = (
        (socket.AF_INET6, socket.IPPROTO_ICMPV6, 128, 129)
        if v6
        else (socket.AF_INET, socket.IPPROTO_ICMP, 8, 0)
    )
    ident = (os.getpid() ^ id(ns)) & 0xFFFF
    rtts: list[float] = []
    with run_in_netns(ns.name, lambda: socket.socket(family, socket.SOCK_RAW, proto)) as s:
        if source:
            s.bind((source, 0))
        for seq in range(count):
            body = b"r" * size
            csum = 0 if v6 else _checksum(struct.pack("!BBHHH", req, 0, 0, ident, seq) + body)
            sent = time.monotonic()  # before sendto: the reply can beat its return
            s.sendto(struct.pack("!BBHHH", req, 0, csum, ident, seq) + body, (dst, 0))
            while (left := timeout_s - (time.monotonic() - sent)) > 0:
                s.settimeout(left)
                try:
                    data = s.recv(65535)
                except TimeoutError:
                    break
                icmp = data if v6 else data[(data[0] & 0x0F) * 4 :]
                if struct.unpack("!BBHHH", icmp[:8])[::3] == (rep, ident) and icmp[
                    6:8
                ] == struct.pack("!H", seq):
                    rtts.append((time.monotonic() - sent) * 1000)
                    break
            time.sleep(interval_s)
    return rtts


def iperf(lab: Lab, client: Netns, server: Netns, server_addr: str, *, streams: int = 1,
          seconds: float = 2, reverse: bool = False) -> dict[str, Any]:  # fmt: skip
    """One iperf3 TCP run; its JSON result (``end.sum_received.bits_per_second``...)."""
    name = f"iperf3-{time.monotonic_ns()}"
    srv = lab.process(server, name, ["iperf3", "-s", "-1", "-B", server_addr])
    wait_listening(server, 5201, srv)
    out = client.run(
        [
            "iperf3",
            "-c",
            server_addr,
            "-t",
            str(seconds),
            "-P",
            str(streams),
            "-J",
            *(["-R"] if reverse else []),
        ],
        timeout_s=seconds + 30,
    )
    srv.stop()
    result: dict[str, Any] = json.loads(out)
    return result


def wait_listening(ns: Netns, port: int, proc: Proc) -> None:
    """Wait for a TCP listener without connecting to it (one-shot servers would take it)."""
    wait_until(
        lambda: f":{port} " in ns.run(["ss", "-ltnH"]),
        10,
        f"listener on {port}",
        interval_s=0.05,
        procs=[proc],
    )


def bps(result: dict[str, Any]) -> float:
    return float(result["end"]["sum_received"]["bits_per_second"])


# -- tests ---------------------------------------------------------------------------------


@pytest.fixture
def raven_l3(lab: Lab) -> L3Lab:
    require_e2e("iperf3")
    require_raven_apps()
    topo = L3Lab.build(lab, "raven")
    try:
        topo.start()
    except BaseException:
        print(lab.diagnostics())  # the lab fixture prints them for failed calls only
        raise
    return topo


@pytest.fixture
def pipe_l3(lab: Lab) -> L3Lab:
    require_e2e()
    return L3Lab.build(lab, "pipe")


@pytest.mark.e2e
def test_ping_both_ways_v4_and_v6(raven_l3: L3Lab) -> None:
    t = raven_l3
    for ns, dst in (
        (t.cloud, "192.168.50.7"),
        (t.edge, "10.1.0.2"),
        (t.cloud, "fd00:50::7"),
        (t.edge, "fd00:1::2"),
    ):
        assert len(ping(ns, dst, 5)) == 5, dst
    assert t.metric("gateway", "raven_l3_packets_total", agent="site-a", direction="to_agent") >= 10
    assert (
        t.metric("gateway", "raven_l3_packets_total", agent="site-a", direction="from_agent") >= 10
    )
    assert t.metric("agent", "raven_l3_packets_total", agent="site-a", direction="from_agent") >= 10


@pytest.mark.e2e
def test_iperf3_tcp_both_ways_without_mss_tweaks(raven_l3: L3Lab) -> None:
    t = raven_l3
    runs = {
        "down v4": iperf(t.lab, t.cloud, t.edge, "192.168.50.7"),
        "up v4": iperf(t.lab, t.cloud, t.edge, "192.168.50.7", reverse=True),
        "up v6 x2": iperf(t.lab, t.edge, t.cloud, "fd00:1::2", streams=2),
    }
    rates = {k: bps(v) for k, v in runs.items()}
    assert min(rates.values()) > 5e6, rates
    # The kernels' TSO/GSO super-packets crossed as single datagrams (offload on both ends).
    sent = t.metric("gateway", "raven_l3_bytes_total", agent="site-a", direction="to_agent")
    count = t.metric("gateway", "raven_l3_packets_total", agent="site-a", direction="to_agent")
    assert sent / count > TUN_MTU
    # Segments fitted the tunnel from the first SYN: no "too big" drops at either end.
    assert t.metric("gateway", "raven_l3_drops_total", reason="too_big") == 0
    assert t.metric("agent", "raven_l3_drops_total", reason="too_big") == 0


EXPORTER = (
    "import time,prometheus_client as p;g=p.Gauge('edge_l3_probe','probe');g.set(42);"
    "p.start_http_server(9100,addr='192.168.50.7');time.sleep(600)"
)


@pytest.mark.e2e
def test_prometheus_scrapes_edge_host_by_ip(raven_l3: L3Lab) -> None:
    t = raven_l3
    t.lab.process(t.edge, "exporter", [sys.executable, "-c", EXPORTER], env=ENV)
    prom = Prometheus(
        t.lab,
        t.cloud,
        [static_job("edge-ip", ["192.168.50.7:9100"])],
        scrape_interval_s=1,
        scrape_timeout_s=0.8,
    ).start()
    got = prom.wait_query("edge_l3_probe", bool, "edge host scraped by IP through L3")
    assert got[0]["value"][1] == "42"


@pytest.mark.e2e
def test_l7_scrapes_keep_flowing_while_l3_is_saturated(raven_l3: L3Lab) -> None:
    t = raven_l3
    t.lab.process(t.edge, "exporter", [sys.executable, "-c", EXPORTER], env=ENV)
    t.edge.wait_for_port("192.168.50.7", 9100)
    host = {"Host": "edge-host:9100"}  # DNS mode through the gateway's proxy: L7 streams
    assert t.gw.http("127.0.0.1", 10264, "/metrics", headers=host).status == 200
    srv = t.lab.process(t.edge, "iperf3-flood-server", ["iperf3", "-s", "-1", "-B", "192.168.50.7"])
    wait_listening(t.edge, 5201, srv)
    flood = ["iperf3", "-c", "192.168.50.7", "-t", "30", "-P", "8"]
    client = t.lab.process(t.cloud, "iperf3-flood", flood)
    time.sleep(1.0)
    latencies = []
    for _ in range(8):
        start = time.monotonic()
        result = t.gw.http("127.0.0.1", 10264, "/metrics", headers=host, timeout_s=5)
        latencies.append(time.monotonic() - start)
        assert result.status == 200 and b"edge_l3_probe 42.0" in result.body
        time.sleep(0.3)
    assert client.alive, "the flood should still be running during the scrapes"
    assert max(latencies) < 2.0, latencies
    print("scrape latencies under L3 flood (s):", [round(x, 3) for x in latencies])
    client.stop()


@pytest.mark.e2e
def test_unauthorised_inner_source_dropped_at_gateway(raven_l3: L3Lab) -> None:
    # The agent announces 192.168.60.0/24, which its key is not authorised for: the gateway
    # refuses the route, and packets sourced there are dropped and counted (cryptokey check).
    t = raven_l3
    t.edge.ip("addr", "add", "192.168.60.7/24", "dev", "e0")
    before = t.metric("gateway", "raven_l3_drops_total", reason="spoofed_source")
    assert ping(t.edge, "10.1.0.2", 3, timeout_s=0.3, source="192.168.60.7") == []
    wait_until(
        lambda: t.metric("gateway", "raven_l3_drops_total", reason="spoofed_source") >= before + 3,
        10, "spoofed drops counted",
    )  # fmt: skip
    assert len(ping(t.edge, "10.1.0.2", 2)) == 2  # the authorised source still works


@pytest.mark.e2e
def test_agent_restart_traffic_resumes(raven_l3: L3Lab) -> None:
    t = raven_l3
    assert t.agent_proc is not None
    t.agent_proc.kill()  # a crash: no goodbye
    assert ping(t.cloud, "192.168.50.7", 2, timeout_s=0.3) == []
    t.agent_proc.start()
    wait_until(
        lambda: ping(t.cloud, "192.168.50.7", 1, timeout_s=0.3),
        30,
        "ping after restart",
        procs=[t.agent_proc],
    )
    assert len(ping(t.edge, "fd00:1::2", 3)) == 3
    assert t.gateway is not None and t.gateway.alive


@pytest.mark.e2e
def test_forged_packets_from_a_compromised_agent_are_dropped(pipe_l3: L3Lab) -> None:
    t = pipe_l3
    t.start()
    assert t.agent_proc is not None
    time.sleep(0.5)  # metrics files are rewritten every 0.2 s
    passed = t.metric("gateway", "raven_l3_packets_total", agent="site-a", direction="from_agent")
    t.agent_proc.signal(signal.SIGUSR1)  # it puts 10 packets from 10.1.0.66 on its link
    wait_until(
        lambda: t.metric("gateway", "raven_l3_drops_total", reason="spoofed_source") >= 10,
        10,
        "drops",
    )
    time.sleep(0.5)
    after = t.metric("gateway", "raven_l3_packets_total", agent="site-a", direction="from_agent")
    assert after == passed  # none of them reached the gateway's TUN


@pytest.mark.e2e
def test_router_icmp_too_big_and_mss_clamp_in_real_kernels(pipe_l3: L3Lab) -> None:
    # Router MTU 1300 below the TUN's 1380: packets of 1301..1380 bytes reach the router,
    # which must answer "fragmentation needed" itself, with checksums a kernel accepts.
    t = pipe_l3
    t.start(router_mtu=1300)
    # First TCP, with a fresh route cache (the cloud host advertises MSS 1460): the edge
    # host sees the MSS its peer advertised as the clamped one.
    listen = "import socket,time;s=socket.socket();s.bind(('192.168.50.7',9100));s.listen()"
    srv = t.lab.process(
        t.edge, "listener", [sys.executable, "-c", f"{listen};c,_=s.accept();time.sleep(5)"]
    )
    wait_listening(t.edge, 9100, srv)
    conn = t.cloud.connect("192.168.50.7", 9100)

    def established() -> str | None:
        out = t.edge.run(["ss", "-tinH", "state", "established"])
        return out if "mss:" in out else None

    info = wait_until(established, 5, "the connection in ss")
    mss = int(info.split("mss:")[1].split()[0])
    assert mss in (1248, 1260), info  # 1300 - 40, less 12 for timestamps; unclamped: 1448
    conn.close()
    ping(t.cloud, "192.168.50.7", 1, size=1340, timeout_s=0.3)  # 1368 bytes with DF
    wait_until(
        lambda: "mtu 1300" in t.cloud.ip("route", "get", "192.168.50.7"), 5, "PMTU from our ICMP"
    )
    assert t.metric("gateway", "raven_l3_drops_total", reason="too_big") >= 1


@pytest.mark.e2e
async def test_linux_tun_reads_and_writes_without_blocking(lab: Lab) -> None:
    require_e2e()
    ns = lab.netns("l3-tun")
    tun = run_in_netns(ns.name, lambda: LinuxTun("rvt0"))
    try:
        ns.ip("link", "set", "rvt0", "mtu", "1400", "up")
        ns.ip("addr", "add", "10.77.0.1/24", "dev", "rvt0")
        got: asyncio.Queue[bytes] = asyncio.Queue()
        tun.start(got.put_nowait)
        tx = run_in_netns(ns.name, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        with tx:
            tx.sendto(b"into the tun", ("10.77.0.2", 9999))
            while True:  # skip anything else the kernel sends (none expected for IPv4)
                packet = await asyncio.wait_for(got.get(), 5)
                if packet.endswith(b"into the tun"):
                    break
        info = parse_packet(packet)
        assert str(info.dst_address) == "10.77.0.2" and str(info.src_address) == "10.77.0.1"
        rx = run_in_netns(ns.name, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        with rx:
            rx.bind(("10.77.0.1", 9998))
            rx.settimeout(5)
            src, dst = info.dst_address, info.src_address
            assert tun.write(udp_packet(src, dst, 4242, 9998, b"out of the tun"))
            assert rx.recvfrom(100) == (b"out of the tun", ("10.77.0.2", 4242))
        assert not tun.write(b"\x00 not an IP packet") and tun.write_drops == 1
    finally:
        tun.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, *sys.argv[1:]]))
