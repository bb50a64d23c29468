"""Three gateway replicas behind one load-balanced address, as a cloud exposes a Deployment
(issue 33): agents given only that address hold every replica; a rolling restart loses no scrape.

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    cloud ns: replicas 10.96.1.1-3 (three `raven gateway` processes, one config and key,
              each: tunnel :10262, proxy :10264, admin :10265)
              tunnel VIP 10.96.0.10:10262 and scrape VIP 10.96.0.20:10264: nftables DNAT with
              `numgen random`, as kube-proxy programs a Service (new connections spread at
              random, established ones stay put)
              Prometheus scraping edge-a-1:9100 and edge-a-2:9100 every second through the
              scrape VIP (proxy_url)
      |-- 10.200.1.0/24 -- site A ns: `raven agent` given only 10.96.0.10:10262,
                           node_exporter 127.0.0.1:9100 (both nodes)

A small endpoints controller (a thread of the test) plays Kubernetes: the scrape VIP lists the
replicas whose /readyz answers 200 (a Service), the tunnel VIP those whose /healthz answers and
which are not terminating (a Service with publishNotReadyAddresses, so agents reach a new
replica before it takes scrapes).

(a) Every node answers through every replica's own proxy: the agent ended up with a tunnel
to each of the three, and none of its duplicate dials (closed before registering) disturbed
a held tunnel.

(b) A rolling restart of the replicas, one at a time (SIGTERM, wait for it to exit, start its
successor, wait for the agent to hold three again), while Prometheus scrapes through the scrape
VIP: every scrape in the window succeeds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.e2e.netns import Lab, Netns, Proc, require_e2e, veth, wait_until
from tests.helpers.e2e.prometheus import Prometheus, static_job

pytestmark = pytest.mark.e2e

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMETHEUS = "/usr/bin/prometheus"
NFT = "/usr/sbin/nft"

REPLICAS = ("10.96.1.1", "10.96.1.2", "10.96.1.3")
TUNNEL_VIP, SCRAPE_VIP = "10.96.0.10", "10.96.0.20"
TUNNEL_PORT, PROXY_PORT, ADMIN_PORT = 10262, 10264, 10265
AGENT_ADMIN = ("127.0.0.1", 10266)
NODES = ("edge-a-1", "edge-a-2")
#: SIGTERM to drain: Kubernetes (here the controller) stops sending scrapes first.
SHUTDOWN_DELAY_S = 2.0
#: a new replica takes scrapes only this long after it starts: agents reach it first
READY_AFTER_S = 5.0


@dataclass
class Net:
    lab: Lab
    cloud: Netns
    site: Netns
    gw_key: Path
    gw_public: str
    agent_key: Path
    agent_public: str
    #: replica address -> its running process
    gateways: dict[str, Proc] = field(default_factory=dict)
    terminating: set[str] = field(default_factory=set)
    generation: dict[str, int] = field(default_factory=dict)
    agent: Proc | None = None


class EndpointsController:
    """Keeps the two VIPs' DNAT maps to the replicas Kubernetes would list (see above)."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.stop = threading.Event()
        self.applied: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self.thread = threading.Thread(target=self._run, name="endpoints", daemon=True)

    def _answers(self, ip: str, path: str) -> bool:
        try:
            return self.net.cloud.http(ip, ADMIN_PORT, path, timeout_s=1.0).status == 200
        except OSError:
            return False

    def sync(self) -> None:
        net = self.net
        live = [ip for ip, p in net.gateways.items() if p.alive and ip not in net.terminating]
        tunnel = tuple(ip for ip in live if self._answers(ip, "/healthz"))
        ready = tuple(ip for ip in live if self._answers(ip, "/readyz"))
        if (tunnel, ready) != self.applied:
            net.cloud.nft(ruleset(tunnel, ready))
            self.applied = (tunnel, ready)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                self.sync()
            except Exception as exc:  # shown in the test's output; the next round retries
                print(f"endpoints controller: {exc}")

    def __enter__(self) -> EndpointsController:
        self.sync()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def _dnat(vip: str, port: int, backends: tuple[str, ...]) -> str:
    if not backends:  # no endpoints: kube-proxy rejects
        return f"ip daddr {vip} tcp dport {port} reject with tcp reset"
    targets = ", ".join(f"{i} : {ip}" for i, ip in enumerate(backends))
    return (
        f"ip daddr {vip} tcp dport {port} dnat to numgen random mod {len(backends)} "
        f"map {{ {targets} }}"
    )


def ruleset(tunnel: tuple[str, ...], ready: tuple[str, ...]) -> str:
    rules = [_dnat(TUNNEL_VIP, TUNNEL_PORT, tunnel), _dnat(SCRAPE_VIP, PROXY_PORT, ready)]
    body = "\n".join(f"    {r}" for r in rules)
    # the table is replaced whole: add it (in case it is missing), delete it, write it anew
    return (
        "table ip rvnlb {}\ndelete table ip rvnlb\ntable ip rvnlb {\n"
        "  chain pre { type nat hook prerouting priority dstnat;\n"
        f"{body}\n  }}\n"
        "  chain out { type nat hook output priority -100;\n"
        f"{body}\n  }}\n"
        "}\n"
    )


@pytest.fixture
def net(lab: Lab) -> Iterator[Net]:
    require_e2e(PROMETHEUS, NODE_EXPORTER, NFT)
    cloud = lab.netns("lb-cloud")
    site = lab.netns("lb-site")
    for ip in (*REPLICAS, TUNNEL_VIP, SCRAPE_VIP):
        cloud.ip("addr", "add", f"{ip}/32", "dev", "lo")
    veth(cloud, "to-a", "10.200.1.1/24", site, "up0", "10.200.1.2/24")
    site.add_route("10.96.0.0/16", via="10.200.1.1")
    gw_key, agent_key = lab.workdir / "gateway.key", lab.workdir / "agent.key"
    net = Net(lab, cloud, site, gw_key, write_key(gw_key), agent_key, write_key(agent_key))
    for ip in REPLICAS:
        start_gateway(net, ip)
    for ip, proc in net.gateways.items():
        cloud.wait_for_http(ip, ADMIN_PORT, "/healthz", timeout_s=30, proc=proc)
    lab.diagnostic_hooks.append(lambda: "----- agent status\n" + json.dumps(agent_status(net)))
    yield net


def start_gateway(net: Net, ip: str) -> Proc:
    gen = net.generation[ip] = net.generation.get(ip, 0) + 1
    config = {
        "private_key_file": str(net.gw_key),
        "tunnel_listen": f"{ip}:{TUNNEL_PORT}",
        "admin_listen": f"{ip}:{ADMIN_PORT}",
        "agents": [{"name": "site-a", "public_key": net.agent_public, "nodes": ["edge-a-*"]}],
        "proxy": {"http_listen": f"{ip}:{PROXY_PORT}", "tls_listeners": []},
        "replica": {"id": f"gw-{ip.rsplit('.', 1)[1]}-gen{gen}", "count": len(REPLICAS)},
        "shutdown_delay_s": SHUTDOWN_DELAY_S,
        "ready_after_s": READY_AFTER_S,
        "limits": {"drain_timeout_s": 5.0},
        "log": {"level": "info"},
    }
    path = net.lab.workdir / f"gateway-{ip}-{gen}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "gateway", "--config", str(path)]
    proc = net.lab.process(net.cloud, f"gateway-{ip}-gen{gen}", argv, env=python_env())
    net.gateways[ip] = proc
    return proc


def start_agent(net: Net) -> None:
    lab, site = net.lab, net.site
    exporter = lab.process(site, "node-exporter", [
        NODE_EXPORTER, "--web.listen-address=127.0.0.1:9100", "--collector.disable-defaults",
        "--collector.loadavg"])  # fmt: skip
    site.wait_for_port("127.0.0.1", 9100, proc=exporter)
    config = {
        "private_key_file": str(net.agent_key),
        "gateway": f"{TUNNEL_VIP}:{TUNNEL_PORT}",
        "gateway_public_key": net.gw_public,
        "name": "site-a",
        "nodes": dict.fromkeys(NODES, "127.0.0.1"),
        "allowed_ports": [9100],
        "admin_listen": f"{AGENT_ADMIN[0]}:{AGENT_ADMIN[1]}",
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 2.0, "replica_retry_max_s": 1.0},
        "log": {"level": "info"},
    }
    path = lab.workdir / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    net.agent = lab.process(site, "agent", [*raven_cmd(), "agent", "--config", str(path)],
                            env=python_env())  # fmt: skip
    site.wait_for_port(*AGENT_ADMIN, timeout_s=30, proc=net.agent)


def agent_status(net: Net) -> dict[str, Any]:
    try:
        return dict(json.loads(net.site.http(*AGENT_ADMIN, "/api/v1/status").body))
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def held_replicas(net: Net) -> set[str]:
    return {g["replica"] for g in agent_status(net).get("gateways", []) if g.get("replica")}


def wait_all_held(net: Net) -> set[str]:
    want = {f"gw-{ip.rsplit('.', 1)[1]}-gen{net.generation[ip]}" for ip in REPLICAS}
    procs = [p for p in (net.agent, *net.gateways.values()) if p is not None]
    wait_until(lambda: held_replicas(net) == want, 60, f"the agent holds {sorted(want)}",
               procs=procs, detail=lambda: json.dumps(agent_status(net)))  # fmt: skip
    return want


def scrape_through(net: Net, replica: str, node: str) -> int:
    url = f"http://{node}:9100/metrics"
    return net.cloud.http(replica, PROXY_PORT, url, timeout_s=5.0).status


def test_agent_given_one_address_holds_every_replica_and_a_rolling_restart_loses_no_scrape(
    net: Net,
) -> None:
    with EndpointsController(net):
        start_agent(net)
        wait_all_held(net)
        # (a) every node answers through every replica
        for ip in REPLICAS:
            for node in NODES:
                assert scrape_through(net, ip, node) == 200, (ip, node)
        status = agent_status(net)
        assert status["replicas"] == {"announced": 3, "held": 3}, status
        for ip, proc in net.gateways.items():
            replaced = [ln for ln in proc.log_text().splitlines() if "tunnel replaced" in ln]
            assert not replaced, f"{ip}: a duplicate dial replaced a held tunnel: {replaced}"
        metrics = net.site.http(*AGENT_ADMIN, "/metrics").text
        assert "raven_agent_gateway_replicas_held 3.0" in metrics

        # (b) a rolling restart while Prometheus scrapes through the scrape VIP
        jobs = [static_job("edge", [f"{n}:9100" for n in NODES],
                           proxy_url=f"http://{SCRAPE_VIP}:{PROXY_PORT}")]  # fmt: skip
        prom = Prometheus(net.lab, net.cloud, jobs, scrape_interval_s=1.0, scrape_timeout_s=1.0)
        prom.start()
        prom.wait_all_up({"edge": len(NODES)})
        since = time.time()
        for ip in REPLICAS:
            old = net.gateways[ip]
            net.terminating.add(ip)
            old.signal(15)
            wait_until(lambda old=old: not old.alive, 30, f"replica {ip} exits", procs=[old])
            assert old.returncode == 0, old.tail()
            net.terminating.discard(ip)
            new = start_gateway(net, ip)
            net.cloud.wait_for_http(ip, ADMIN_PORT, "/readyz", timeout_s=30, proc=new)
            wait_all_held(net)
        time.sleep(3.0)  # scrapes after the last restart
        window = int(time.time() - since) + 2
        data = prom.get("/api/v1/query", {"query": f"up[{window}s]", "time": f"{time.time():.3f}"})
        samples = {
            s["metric"]["instance"]: [float(v) for ts, v in s["values"] if float(ts) >= since]
            for s in data["result"]
        }
        assert set(samples) == {f"{n}:9100" for n in NODES}, samples
        for instance, ups in samples.items():
            assert len(ups) >= window - 4, f"{instance}: only {len(ups)} scrapes in {window}s"
            assert all(u == 1.0 for u in ups), f"{instance}: failed scrapes: {ups}"
            print(f"{instance}: {len(ups)} scrapes across the rolling restart, all up")
