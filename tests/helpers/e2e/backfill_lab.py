"""The backfill end-to-end tests' lab: edge sites (an agent namespace, a node namespace with
node_exporter behind it), the gateway with backfill on, blackholing a site's uplink, and
reading samples back from Prometheus (tests/e2e/test_backfill_e2e.py, test_backfill_ha_e2e.py).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.e2e.netns import Lab, Netns, Proc, veth, wait_until
from tests.helpers.e2e.prometheus import Prometheus, write_textfile

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROXY_PORT = 10264
TUNNEL_PORT = 10262
INTERVAL_S = 2.0
JOB = "edge"


@dataclass
class Site:
    key: str
    index: int
    marker: int
    agent_ns: Netns | None = None
    agent: Proc | None = None

    @property
    def node(self) -> str:
        return f"edge-{self.key}-1"

    @property
    def instance(self) -> str:
        return f"{self.node}:9100"


LIMITS = {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 4.0, "drain_timeout_s": 2.0}


def build_site(lab: Lab, cloud: Netns, site: Site, gateway_public: str) -> str:
    site.agent_ns = lab.netns(f"bf{site.key}-agent")
    nodes_ns = lab.netns(f"bf{site.key}-nodes")
    veth(cloud, f"to-{site.key}", f"10.200.{site.index}.1/24", site.agent_ns, "up0",
         f"10.200.{site.index}.2/24")  # fmt: skip
    veth(site.agent_ns, "lan0", "192.168.1.1/24", nodes_ns, "eth0", "192.168.1.10/24")
    textfiles = lab.workdir / f"textfile-{site.key}"
    write_textfile(textfiles, "site", "# TYPE raven_e2e_site_marker gauge\n"
                   f'raven_e2e_site_marker{{site="{site.key}"}} {site.marker}\n')  # fmt: skip
    lab.process(nodes_ns, f"node-exporter-{site.key}", [
        NODE_EXPORTER, "--web.listen-address=192.168.1.10:9100", "--collector.disable-defaults",
        "--collector.textfile", f"--collector.textfile.directory={textfiles}",
        "--collector.loadavg", "--collector.meminfo"])  # fmt: skip
    key = lab.workdir / f"agent-{site.key}.key"
    public = write_key(key)
    config = {
        "private_key_file": str(key),
        "gateway": f"10.200.{site.index}.1:{TUNNEL_PORT}",
        "gateway_public_key": gateway_public,
        "name": f"site-{site.key}",
        "nodes": {site.node: "192.168.1.10"},
        "admin_listen": "127.0.0.1:10266",
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 2.0},
        "limits": LIMITS,
        "backfill": {"enabled": True, "dir": str(lab.workdir / f"buffer-{site.key}")},
        "log": {"level": "info"},
    }
    path = lab.workdir / f"agent-{site.key}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "agent", "--config", str(path)]
    site.agent = lab.process(site.agent_ns, f"agent-{site.key}", argv, env=python_env())
    return public


def start_gateway(
    lab: Lab,
    cloud: Netns,
    gw_key: Path,
    agents: dict[str, str],
    *,
    proxy_listen: str = f"127.0.0.1:{PROXY_PORT}",
    backfill: dict[str, Any] | None = None,
) -> Proc:
    config = {
        "private_key_file": str(gw_key),
        "tunnel_listen": f"0.0.0.0:{TUNNEL_PORT}",
        "admin_listen": "127.0.0.1:10265",
        "agents": [{"name": f"site-{k}", "public_key": v, "nodes": [f"edge-{k}-*"]}
                   for k, v in agents.items()],
        "proxy": {"http_listen": proxy_listen, "tls_listeners": []},
        "limits": LIMITS,
        "backfill": backfill or {
            "enabled": True, "remote_write_url": "http://127.0.0.1:9090/api/v1/write",
            "out_of_order_window_s": 3600, "jobs": [{"port": 9100, "job": JOB}]},
        "log": {"level": "info"},
    }  # fmt: skip
    path = lab.workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = lab.process(cloud, "gateway", [*raven_cmd(), "gateway", "--config", str(path)],
                       env=python_env())  # fmt: skip
    cloud.wait_for_port("127.0.0.1", PROXY_PORT, proc=proc)
    return proc


def blackhole(ns: Netns, on: bool) -> None:
    if on:
        ns.nft(
            "table inet rvn_blackhole {\n"
            '  chain in { type filter hook input priority 0; iifname "up0" drop; }\n'
            '  chain out { type filter hook output priority 0; oifname "up0" drop; }\n'
            "}\n"
        )
    else:
        ns.run(["nft", "delete", "table", "inet", "rvn_blackhole"])


def query_at(prom: Prometheus, promql: str, at: float) -> list[dict[str, Any]]:
    data = prom.get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
    return list(data["result"])


def samples_per_series(
    prom: Prometheus, instance: str, window: int, at: float, job: str = JOB
) -> dict[str, int]:
    """Samples in (at - window, at] of every series of ``instance`` (a range selector)."""
    matrix = query_at(prom, f'{{job="{job}",instance="{instance}"}}[{window}s]', at)
    return {json.dumps(m["metric"], sort_keys=True): len(m["values"]) for m in matrix}


def agent_status(site: Site) -> dict[str, Any]:
    assert site.agent_ns is not None
    body: dict[str, Any] = json.loads(site.agent_ns.http("127.0.0.1", 10266, "/api/v1/status").body)
    return body


def scrape_through_tunnel(cloud: Netns, site: Site) -> bool:
    try:
        result = cloud.http("127.0.0.1", PROXY_PORT, f"http://{site.instance}/metrics",
                            timeout_s=1.5)  # fmt: skip
    except OSError:
        return False
    return result.status == 200


def outage(
    lab: Lab, cloud: Netns, site: Site, seconds: float, *, kill_agent: bool
) -> tuple[float, float, float]:
    """Blackhole ``site``'s uplink for ``seconds`` (killing and restarting its agent in the
    middle if asked); (start, end, recovery seconds until a scrape went through)."""
    assert site.agent_ns is not None and site.agent is not None
    start = time.time()
    blackhole(site.agent_ns, True)
    wait_until(lambda: agent_status(site)["backfill"]["targets_local"] >= 1, 15,
               "site A's agent scraping on its own")  # fmt: skip
    if kill_agent:
        time.sleep(seconds / 3)
        site.agent.signal(signal.SIGKILL)
        agent = site.agent
        wait_until(lambda: not agent.alive, 5, "agent killed")
        site.agent.start()
        site.agent_ns.wait_for_port("127.0.0.1", 10266, proc=site.agent)
    time.sleep(max(0.0, start + seconds - time.time()))
    blackhole(site.agent_ns, False)
    end = time.time()
    wait_until(lambda: scrape_through_tunnel(cloud, site), 60, "a scrape through the tunnel",
               interval_s=0.1)  # fmt: skip
    return start, end, time.time() - end


def check_outage(prom: Prometheus, sites: list[Site], start: float, end: float) -> None:
    a, b = sites
    window = int(end - start)
    at = start + window
    expected = window / INTERVAL_S
    counts: dict[str, int] = {}

    def site_a_complete() -> bool:
        counts.clear()
        counts.update(samples_per_series(prom, a.instance, window, at))
        names = {json.loads(k)["__name__"] for k in counts}
        # the page's series (not only Prometheus's own up and scrape_*), each complete
        page = {"raven_e2e_site_marker", "node_load1", "node_memory_MemTotal_bytes"}
        return page <= names and all(abs(n - expected) <= 1 for n in counts.values())

    try:
        wait_until(site_a_complete, 60, "site A's outage backfilled", interval_s=1.0)
    except TimeoutError:
        short = {k: n for k, n in counts.items() if abs(n - expected) > 1}
        raise AssertionError(
            f"expected {expected}+-1 samples per series in {window}s; off: {short}"
        ) from None
    assert len(counts) > 10, counts  # node_exporter's series and Prometheus's own
    # up stays 0 for the missed scrapes: the outage stays visible
    up_min = query_at(
        prom, f'min_over_time(up{{job="{JOB}",instance="{a.instance}"}}[{window}s])', at
    )
    assert float(up_min[0]["value"][1]) == 0
    # the values are the node's own
    marker = query_at(
        prom, f'raven_e2e_site_marker{{job="{JOB}",instance="{a.instance}"}}[{window}s]', at
    )
    assert len(marker) == 1 and marker[0]["metric"]["site"] == "a"
    assert {float(v) for _, v in marker[0]["values"]} == {float(a.marker)}
    # site B was scraped throughout, undisturbed
    b_counts = samples_per_series(prom, b.instance, window, at)
    assert b_counts and all(abs(n - expected) <= 1 for n in b_counts.values()), b_counts
    b_up = query_at(
        prom, f'min_over_time(up{{job="{JOB}",instance="{b.instance}"}}[{window}s])', at
    )
    assert float(b_up[0]["value"][1]) == 1
