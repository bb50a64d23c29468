"""The L3 lab of the end-to-end tests and the L3 benchmarks: a cloud host, the gateway, the
agent and an edge host in network namespaces, joined by the real tunnel (``raven gateway`` /
``raven agent`` with ``tun.enabled``) or the plain-TCP pipe link, with ping and iperf3 drivers.

    cloud host --veth-- cloud gateway ==underlay== edge gateway (agent) --veth-- edge host
    10.1.0.2            10.1.0.1 | 10.0.9.1         10.0.9.2 | 192.168.50.1      192.168.50.7
    fd00:1::2           fd00:1::1  TUN               TUN        fd00:50::1        fd00:50::7
"""

from __future__ import annotations

import functools
import json
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

import yaml

from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file
from tests.helpers import REPO_ROOT, python_env, raven_cmd, require
from tests.helpers.e2e.netns import Lab, Netns, Proc, run_in_netns, veth, wait_until
from tests.helpers.e2e.prometheus import parse_exposition

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


#: The ``raven`` command the lab runs (None: this environment's, tests.helpers.raven_cmd); a
#: benchmark comparing two checkouts sets each one's own.
COMMAND: list[str] | None = None


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
        raven = COMMAND or raven_cmd()
        self.gateway = self.lab.process(
            self.gw, "gateway", [*raven, "gateway", "-c", str(w / "gateway.yaml")], env=ENV
        )
        # The agent starts once the gateway is ready: an agent registering while the gateway
        # is still bringing L3 up got no routes (see docs/l3.md, "Start-up order").
        self.gw.wait_for_http(*GW_ADMIN, "/readyz", proc=self.gateway, timeout_s=30)
        self.agent_proc = self.lab.process(
            self.agent, "agent", [*raven, "agent", "-c", str(w / "agent.yaml")], env=ENV
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
