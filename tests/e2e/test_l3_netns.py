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
import signal
import socket
import sys
import time

import pytest

from raven.l3 import parse_packet
from raven.l3.build import udp_packet
from raven.transport.tun import LinuxTun
from tests.helpers.e2e.l3_lab import (
    ENV,
    TUN_MTU,
    L3Lab,
    bps,
    iperf,
    ping,
    require_raven_apps,
    wait_listening,
)
from tests.helpers.e2e.netns import Lab, require_e2e, run_in_netns, wait_until
from tests.helpers.e2e.prometheus import Prometheus, static_job

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
