"""A real Prometheus scrapes two edge sites with overlapping IPs, by node name, through the
cloud gateway and the edge agents' tunnels.

Topology (all namespaces are ``rvn-<purpose>-<pid>``)::

    cloud ns: gateway (tunnel :10262, proxy :10264, admin 127.0.0.1:10265), Prometheus,
              dnsmasq (127.0.0.1:53, reads the hosts file that `raven coredns-hosts` writes
              from the gateway's live registry), "Service" 10.96.0.10 whose ports 9400 and
              9100 are DNAT-ed to the proxy port (what kube-proxy does for a ClusterIP)
      |-- 10.200.1.0/24 --  site A agent ns -- 192.168.1.0/24 -- site A nodes ns (.10, .11)
      |-- 10.200.2.0/24 --  site B agent ns -- 192.168.1.0/24 -- site B nodes ns (.10, .11)

The cloud namespace has no route to 192.168.1.0/24: only the tunnels reach the sites. Each
site serves node_exporter on its .10 node and a simulated GPU exporter on .10 and .11, with
site-distinct values. Prometheus has four jobs: DNS mode, proxy_url mode, path mode and
http_sd. Then one agent is killed (its targets go down, a direct request gets 503 "no agent",
the other site stays up) and restarted (everything back up).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import dns.exception
import dns.message
import dns.query
import dns.rdatatype
import pytest
import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.e2e.netns import (
    HttpResult,
    Lab,
    Netns,
    NetnsError,
    Proc,
    require_e2e,
    veth,
    wait_until,
)
from tests.helpers.e2e.prometheus import (
    Prometheus,
    http_sd_job,
    parse_exposition,
    static_job,
    write_textfile,
)
from tests.helpers.e2e.raven_lab import (
    ADMIN,
    PROMETHEUS,
    PROXY_PORT,
    TUNNEL_PORT,
    check_components,
    hosts_cmd,
)

pytestmark = pytest.mark.e2e

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
DNSMASQ = "/usr/sbin/dnsmasq"

SERVICE_IP = "10.96.0.10"  # the gateway "Service" the hosts file points names at
PROM_LISTEN = "127.0.0.1:9090"
GPU_METRIC = "DCGM_FI_DEV_FB_USED"  # a gauge every simulated GPU serves
UP_TIMEOUT_S = 60.0

JOBS = ("dns", "proxy", "path", "http_sd")


@dataclass
class Node:
    name: str
    ip: str
    seed: int
    node_exporter: bool = False


@dataclass
class Site:
    key: str  # "a" / "b"
    index: int  # 1 / 2: uplink subnet 10.200.<index>.0/24
    marker: int  # node_exporter textfile value
    nodes: list[Node]
    agent_ns: Netns | None = None
    nodes_ns: Netns | None = None
    agent: Proc | None = None
    served: dict[str, str] = field(default_factory=dict)  # "node:port" -> exposition text

    @property
    def name(self) -> str:
        return f"site-{self.key}"

    @property
    def cloud_ip(self) -> str:
        return f"10.200.{self.index}.1"

    @property
    def agent_ip(self) -> str:
        return f"10.200.{self.index}.2"

    def targets(self) -> list[str]:
        out = [f"{n.name}:9400" for n in self.nodes]
        out += [f"{n.name}:9100" for n in self.nodes if n.node_exporter]
        return sorted(out)

    def gpu_targets(self) -> list[str]:
        return sorted(f"{n.name}:9400" for n in self.nodes)


def make_sites() -> list[Site]:
    """Two sites on the same LAN subnet: node .10 and .11 at both, distinct values."""
    return [
        Site(
            "a",
            1,
            1001,
            [
                Node("edge-a-gpu-1", "192.168.1.10", 11, True),
                Node("edge-a-gpu-2", "192.168.1.11", 12),
            ],
        ),
        Site(
            "b",
            2,
            2002,
            [
                Node("edge-b-gpu-1", "192.168.1.10", 21, True),
                Node("edge-b-gpu-2", "192.168.1.11", 22),
            ],
        ),
    ]


# --- commands --------------------------------------------------------------------------------


# --- building the lab ------------------------------------------------------------------------


def build_cloud(lab: Lab) -> Netns:
    cloud = lab.netns("cloud")
    cloud.ip("addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    # A ClusterIP Service in miniature: <service>:9400 and :9100 go to the proxy listener.
    cloud.nft(
        "table ip raven_e2e_svc {\n"
        "  chain output {\n"
        "    type nat hook output priority -100; policy accept;\n"
        f"    ip daddr {SERVICE_IP} tcp dport {{ 9100, 9400 }} dnat to {SERVICE_IP}:{PROXY_PORT}\n"
        "  }\n"
        "}\n"
    )
    cloud.set_resolv_conf(["127.0.0.1"])
    return cloud


def build_site(lab: Lab, cloud: Netns, site: Site) -> None:
    site.agent_ns = lab.netns(f"s{site.key}-agent")
    site.nodes_ns = lab.netns(f"s{site.key}-nodes")
    veth(
        cloud, f"to-{site.key}", f"{site.cloud_ip}/24", site.agent_ns, "up0", f"{site.agent_ip}/24"
    )
    veth(site.agent_ns, "lan0", "192.168.1.1/24", site.nodes_ns, "eth0", f"{site.nodes[0].ip}/24")
    for node in site.nodes[1:]:
        site.nodes_ns.ip("addr", "add", f"{node.ip}/24", "dev", "eth0")


def start_targets(lab: Lab, site: Site) -> list[tuple[Proc, str, int]]:
    assert site.nodes_ns is not None
    started: list[tuple[Proc, str, int]] = []
    for node in site.nodes:
        gpu = lab.process(
            site.nodes_ns,
            f"gpu-{node.name}",
            [
                *raven_cmd(),
                "gpu-exporter",
                "--simulate",
                "2",
                "-a",
                f"{node.ip}:9400",
                "--seed",
                str(node.seed),
                "--hostname",
                node.name,
                "-c",
                "600000",  # collect once: values stay put for the whole test
            ],
            env=python_env(),
        )
        started.append((gpu, node.ip, 9400))
        if node.node_exporter:
            textfiles = lab.workdir / f"textfile-{site.key}"
            write_textfile(
                textfiles,
                "site",
                "# HELP raven_e2e_site_marker Site-distinct value served by this node.\n"
                "# TYPE raven_e2e_site_marker gauge\n"
                f'raven_e2e_site_marker{{site="{site.key}"}} {site.marker}\n',
            )
            ne = lab.process(
                site.nodes_ns,
                f"node-exporter-{node.name}",
                [
                    NODE_EXPORTER,
                    f"--web.listen-address={node.ip}:9100",
                    "--collector.disable-defaults",
                    "--collector.textfile",
                    f"--collector.textfile.directory={textfiles}",
                    "--collector.netdev",
                    "--collector.loadavg",
                    "--collector.meminfo",
                ],
            )
            started.append((ne, node.ip, 9100))
    return started


def gateway_config(
    workdir: Path, gw_key: Path, agent_keys: dict[str, str], sites: list[Site]
) -> Path:
    config = {
        "private_key_file": str(gw_key),
        "tunnel_listen": f"0.0.0.0:{TUNNEL_PORT}",
        "admin_listen": f"{ADMIN[0]}:{ADMIN[1]}",
        "agents": [
            {"name": s.name, "public_key": agent_keys[s.key], "nodes": [f"edge-{s.key}-*"]}
            for s in sites
        ],
        "proxy": {"http_listen": f"0.0.0.0:{PROXY_PORT}", "tls_listeners": []},
        "log": {"level": "info"},
    }
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def agent_config(lab: Lab, site: Site, gateway_public: str) -> tuple[Path, str]:
    key = lab.workdir / f"agent-{site.key}.key"
    public = write_key(key)
    config = {
        "private_key_file": str(key),
        "gateway": f"{site.cloud_ip}:{TUNNEL_PORT}",
        "gateway_public_key": gateway_public,
        "name": site.name,
        "nodes": {n.name: n.ip for n in site.nodes},
        "admin_listen": "127.0.0.1:10266",
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 1.0},
        "log": {"level": "info"},
    }
    path = lab.workdir / f"agent-{site.key}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, public


def prometheus_jobs(sites: list[Site]) -> list[dict[str, Any]]:
    targets = sorted(t for s in sites for t in s.targets())
    proxy_url = f"http://127.0.0.1:{PROXY_PORT}"
    path_relabel = [
        {"source_labels": ["__address__"], "target_label": "instance"},
        {
            "source_labels": ["__address__"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
            "replacement": "/proxy/${1}/metrics",
        },
        {"target_label": "__address__", "replacement": f"127.0.0.1:{PROXY_PORT}"},
    ]
    return [
        static_job("dns", targets),
        static_job("proxy", targets, proxy_url=proxy_url),
        static_job("path", targets, relabel_configs=path_relabel),
        http_sd_job(
            "http_sd",
            f"http://{ADMIN[0]}:{ADMIN[1]}/api/v1/targets?port=9400",
            refresh_s=1,
            proxy_url=proxy_url,
        ),
    ]


def expected_counts(sites: list[Site]) -> dict[str, int]:
    static = sum(len(s.targets()) for s in sites)
    return {
        "dns": static,
        "proxy": static,
        "path": static,
        "http_sd": sum(len(s.gpu_targets()) for s in sites),
    }


def resolve_in(ns: Netns, name: str) -> list[str]:
    """A records for ``name`` from the DNS server at 127.0.0.1 inside ``ns``."""
    sock = ns.new_socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)  # dnspython needs it: a blocking one can wait forever in recvfrom
    try:
        answer = dns.query.udp(
            dns.message.make_query(name, dns.rdatatype.A), "127.0.0.1", timeout=1.0, sock=sock
        )
    finally:
        sock.close()
    return sorted(rr.address for rrset in answer.answer for rr in rrset)


def gateway_json(cloud: Netns, path: str) -> Any:
    return json.loads(cloud.http(*ADMIN, path).body)


# --- checks ----------------------------------------------------------------------------------


def by_instance(targets: list[dict[str, Any]], job: str) -> dict[str, dict[str, Any]]:
    return {t["labels"]["instance"]: t for t in targets if t["labels"].get("job") == job}


def check_values(prom: Prometheus, sites: list[Site]) -> None:
    """Every job stored, for each target, exactly what that target served."""
    for site in sites:
        for node in site.nodes:
            served = parse_exposition(site.served[f"{node.name}:9400"])
            want = {
                dict(labels)["UUID"]: value
                for (name, labels), value in served.items()
                if name == GPU_METRIC
            }
            assert len(want) == 2, f"{node.name}: expected 2 GPUs served, got {want}"
            for job in JOBS:
                got = prom.query_values(
                    f'{GPU_METRIC}{{job="{job}", instance="{node.name}:9400"}}', ["UUID"]
                )
                assert {k[0]: v for k, v in got.items()} == want, (
                    f"job {job} {node.name}:9400: Prometheus has {got}, the target served {want}"
                )
                hostnames = prom.query_values(
                    f'{GPU_METRIC}{{job="{job}", instance="{node.name}:9400"}}', ["Hostname"]
                )
                assert {k[0] for k in hostnames} == {node.name}
        for job in ("dns", "proxy", "path"):
            got = prom.query_values(
                f'raven_e2e_site_marker{{job="{job}", instance=~"edge-{site.key}-.*"}}',
                ["instance", "site"],
            )
            node = next(n for n in site.nodes if n.node_exporter)
            assert got == {(f"{node.name}:9100", site.key): float(site.marker)}, (
                f"job {job}: node_exporter marker of {site.name}: {got}"
            )
    # The same IP (192.168.1.10) at both sites really served different data.
    uuids = {
        s.key: {
            dict(labels)["UUID"]
            for (name, labels), _ in parse_exposition(s.served[f"{s.nodes[0].name}:9400"]).items()
            if name == GPU_METRIC
        }
        for s in sites
    }
    assert uuids["a"].isdisjoint(uuids["b"]), "sites must serve distinct GPUs"
    # http_sd labels come from the gateway registry.
    sd = prom.query_values(f'{GPU_METRIC}{{job="http_sd"}}', ["instance", "node", "agent"])
    assert {k for k in sd} >= {
        (f"{n.name}:9400", n.name, s.name) for s in sites for n in s.nodes
    }, sd


def job_targets(site: Site, job: str) -> list[str]:
    """The instances ``job`` has for ``site`` (http_sd discovers only the GPU port)."""
    return site.gpu_targets() if job == "http_sd" else site.targets()


def wait_site_down(prom: Prometheus, dead: Site, alive: Site, since: float) -> None:
    """``dead``'s targets go down (http_sd drops them: not reachable) while every target of
    ``alive`` stays up and is scraped successfully after ``since``."""

    def dead_down(targets: list[dict[str, Any]]) -> bool:
        for job in ("dns", "proxy", "path"):
            mine = by_instance(targets, job)
            if any(mine.get(i, {}).get("health") != "down" for i in job_targets(dead, job)):
                return False
        for job in ("proxy", "path"):  # DNS mode may fail earlier: the name is withdrawn
            mine = by_instance(targets, job)
            if any("503" not in mine[i].get("lastError", "") for i in job_targets(dead, job)):
                return False
        sd = by_instance(targets, "http_sd")
        return not any(i in sd for i in dead.gpu_targets())

    def alive_up(targets: list[dict[str, Any]]) -> bool:
        for job in JOBS:
            mine = by_instance(targets, job)
            for inst in job_targets(alive, job):
                t = mine.get(inst)
                assert t is not None and t["health"] == "up", f"{alive.name} {job} {inst}: {t}"
                if not _scraped_after(t, since):
                    return False
        return True

    prom.wait_targets(lambda ts: dead_down(ts) and alive_up(ts), f"{dead.name} down", 30)


def _scraped_after(target: dict[str, Any], since: float) -> bool:
    stamp = target.get("lastScrape", "")
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return when > since


# --- the test --------------------------------------------------------------------------------


def start_all_targets(lab: Lab, sites: list[Site]) -> None:
    """Start every site's targets and record what each served (fetched on the site's LAN,
    from the agent namespace), to compare with what Prometheus stores."""
    for site in sites:
        assert site.agent_ns is not None
        for proc, ip, port in start_targets(lab, site):
            site.agent_ns.wait_for_port(ip, port, timeout_s=30, proc=proc)
    for site in sites:
        assert site.agent_ns is not None
        for node in site.nodes:
            r = site.agent_ns.http(node.ip, 9400, "/metrics")
            assert r.status == 200, r
            site.served[f"{node.name}:9400"] = r.text


def start_gateway_and_agents(lab: Lab, cloud: Netns, sites: list[Site]) -> Proc:
    """The gateway in the cloud namespace, one agent per site; returns once the gateway's
    registry lists every edge node as reachable."""
    agent_keys: dict[str, str] = {}
    agent_paths: dict[str, Path] = {}
    gw_key = lab.workdir / "gateway.key"
    gateway_public = write_key(gw_key)
    for site in sites:
        agent_paths[site.key], agent_keys[site.key] = agent_config(lab, site, gateway_public)
    gw_path = gateway_config(lab.workdir, gw_key, agent_keys, sites)
    gateway = lab.process(
        cloud, "gateway", [*raven_cmd(), "gateway", "--config", str(gw_path)], env=python_env()
    )
    lab.diagnostic_hooks.append(
        lambda: (
            "----- gateway /api/v1/agents\n"
            + json.dumps(gateway_json(cloud, "/api/v1/agents"), indent=1)
        )
    )
    cloud.wait_for_http(*ADMIN, "/healthz", timeout_s=30, proc=gateway)
    for site in sites:
        assert site.agent_ns is not None
        site.agent = lab.process(
            site.agent_ns,
            f"agent-{site.key}",
            [*raven_cmd(), "agent", "--config", str(agent_paths[site.key])],
            env=python_env(),
        )

    def all_reachable() -> bool:
        nodes = gateway_json(cloud, "/api/v1/nodes")["nodes"]
        reachable = {n["node"] for n in nodes if n["reachable"]}
        return reachable >= {n.name for s in sites for n in s.nodes}

    wait_until(
        all_reachable,
        30,
        "every edge node reachable in the gateway registry",
        procs=[gateway, *(s.agent for s in sites if s.agent)],
        detail=lambda: json.dumps(gateway_json(cloud, "/api/v1/nodes")),
    )
    return gateway


def start_dns(lab: Lab, cloud: Netns, sites: list[Site]) -> None:
    """dnsmasq reading the hosts file that `raven coredns-hosts` keeps from the gateway's
    live registry; returns once every node name resolves to the gateway Service address."""
    hostsdir = lab.workdir / "hosts.d"
    hostsdir.mkdir()
    dnsmasq = lab.process(
        cloud,
        "dnsmasq",
        [
            DNSMASQ,
            "--keep-in-foreground",
            "--log-facility=-",
            "--log-queries",
            f"--pid-file={lab.workdir / 'dnsmasq.pid'}",
            "--no-resolv",
            "--no-hosts",
            "--local=/#/",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--port=53",
            f"--hostsdir={hostsdir}",
            "--user=root",
        ],
    )
    hostsgen = lab.process(
        cloud,
        "coredns-hosts",
        [
            *hosts_cmd(),
            "run",
            "--source",
            "registry",
            "--registry-url",
            f"http://{ADMIN[0]}:{ADMIN[1]}",
            "--gateway-address",
            SERVICE_IP,
            "--output",
            str(hostsdir / "edge-nodes"),
            "--poll-interval-s",
            "0.5",
            "--admin-listen",
            "off",
        ],
        env=python_env(),
    )
    names = [n.name for s in sites for n in s.nodes]
    wait_until(
        lambda: all(_resolves(cloud, name) == [SERVICE_IP] for name in names),
        30,
        "every node name to resolve to the gateway Service address",
        procs=[dnsmasq, hostsgen],
        detail=lambda: f"hosts dir: {[p.name for p in hostsdir.iterdir()]}",
    )


def wait_up_and_check(prom: Prometheus, sites: list[Site]) -> None:
    prom.wait_all_up(expected_counts(sites), timeout_s=UP_TIMEOUT_S)
    # Every job must have GPU samples from every node before values are compared.
    prom.wait_query(
        f"count(count by (job, instance) ({GPU_METRIC}))",
        lambda r: bool(r) and float(r[0]["value"][1]) >= 4 * len(JOBS),
        "GPU samples from every job and node",
    )
    check_values(prom, sites)


def proxy_get(cloud: Netns, node: str, port: int) -> HttpResult:
    """A forward-proxy request for ``http://<node>:<port>/metrics`` straight to the gateway."""
    return cloud.http(
        "127.0.0.1",
        PROXY_PORT,
        f"http://{node}:{port}/metrics",
        headers={"Host": f"{node}:{port}"},
    )


def kill_agent_and_check(cloud: Netns, prom: Prometheus, dead: Site, alive: Site) -> None:
    """Kill ``dead``'s agent: its targets go down with the 503 no-agent reason (direct
    request too) while ``alive`` stays up."""
    assert dead.agent is not None
    kill_time = time.time()
    dead.agent.kill()
    node = dead.nodes[0].name

    def refused() -> HttpResult | None:
        res = proxy_get(cloud, node, 9400)
        return res if res.status == 503 else None

    r = wait_until(refused, 15, f"a 503 from the proxy for {node} once its agent is gone")
    assert r.headers.get("x-raven-error") == "no_agent", r
    assert r.text.startswith("no_agent") and r.text.count("\n") == 1, r.text
    other = proxy_get(cloud, alive.nodes[0].name, 9400)
    assert other.status == 200, other
    assert f'Hostname="{alive.nodes[0].name}"' in other.text
    wait_site_down(prom, dead, alive, kill_time)


def test_prometheus_scrapes_overlapping_sites_by_name(lab: Lab) -> None:
    require_e2e("nft", PROMETHEUS, DNSMASQ, NODE_EXPORTER)
    check_components()
    started = time.monotonic()
    sites = make_sites()
    site_a, site_b = sites

    # Namespaces and links. The cloud reaches the sites' agents, never their LANs.
    cloud = build_cloud(lab)
    for site in sites:
        build_site(lab, cloud, site)
    with pytest.raises(OSError):
        cloud.connect("192.168.1.10", 9400, timeout_s=1.0)

    start_all_targets(lab, sites)
    gateway = start_gateway_and_agents(lab, cloud, sites)
    start_dns(lab, cloud, sites)
    prom = Prometheus(lab, cloud, prometheus_jobs(sites), listen=PROM_LISTEN).start()
    wait_up_and_check(prom, sites)
    print(f"all targets up and checked after {time.monotonic() - started:.1f}s")

    kill_agent_and_check(cloud, prom, site_a, site_b)
    assert site_a.agent is not None
    site_a.agent.start()
    wait_up_and_check(prom, sites)
    print(f"e2e done in {time.monotonic() - started:.1f}s")
    for p in lab.procs:
        if p is not site_a.agent:
            assert p.alive, f"{p.name} died:\n{p.tail()}"
    assert gateway.alive


def _resolves(ns: Netns, name: str) -> list[str]:
    try:
        return resolve_in(ns, name)
    except (OSError, dns.exception.DNSException, NetnsError):
        return []
