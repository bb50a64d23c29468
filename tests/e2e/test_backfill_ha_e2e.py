"""An HA pair of real Prometheus servers, each its own receiver, both complete after an outage.

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    cloud ns: gateway (tunnel :10262, proxy 0.0.0.0:10264, backfill receivers: per_scraper,
              remote_write_url http://{scraper}:9090/api/v1/write)
      |-- 10.201.0.0/24 -- prometheus-0 ns (10.201.0.2:9090)   both scrape edge-a-1:9100 and
      |-- 10.201.1.0/24 -- prometheus-1 ns (10.201.1.2:9090)   edge-b-1:9100 every 2 s, each
      |                                                        on its own phase, through the proxy
      |-- 10.200.1.0/24 -- site A agent ns -- site A node (node_exporter)
      |-- 10.200.2.0/24 -- site B agent ns -- site B node (node_exporter)

As kube-prometheus-stack runs ``replicas: 2``: two Prometheus servers with one config, each
with two jobs on site A's port (``edge`` through ``proxy_url``, ``edge-path`` in path mode with
a label of its own). The gateway names each request's scraper (address and addressing mode) to
the agent, which learns site A's target four times, once per replica and job, each with its
own interval and phase. Site A's uplink is blackholed
for 60 s; after reconnect each replica's own receiver (found from the scraping client's
address) gets that replica's missed scrapes: **both** hold every site-A series of **both** jobs
complete (one sample per interval over the outage, +-1; each job's own labels), with no
duplicate or out-of-order errors, and site B was scraped throughout in both.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest

from tests.helpers import write_key
from tests.helpers.e2e.backfill_lab import (
    INTERVAL_S,
    JOB,
    NODE_EXPORTER,
    PROXY_PORT,
    Site,
    agent_status,
    build_site,
    check_outage,
    outage,
    samples_per_series,
    start_gateway,
)
from tests.helpers.e2e.netns import Lab, Netns, veth, wait_until
from tests.helpers.e2e.prometheus import Prometheus, duration, static_job

pytestmark = pytest.mark.e2e


PATH_JOB = "edge-path"


def replica(lab: Lab, cloud: Netns, index: int, sites: list[Site]) -> Prometheus:
    """One replica: job ``edge`` scrapes both sites through ``proxy_url``; job ``edge-path``
    scrapes site A's same port again in path mode (``/proxy/<node>:<port>/metrics``), with
    its own labels (``via: path``): a second job on one port."""
    ns = lab.netns(f"prom-{index}")
    veth(cloud, f"to-prom{index}", f"10.201.{index}.1/24", ns, "eth0", f"10.201.{index}.2/24")
    gateway = f"10.201.{index}.1:{PROXY_PORT}"
    job = static_job(JOB, [s.instance for s in sites], proxy_url=f"http://{gateway}")
    a = sites[0]
    path_job = static_job(PATH_JOB, [gateway], labels={"via": "path"},
                          metrics_path=f"/proxy/{a.instance}/metrics",
                          relabel_configs=[{"target_label": "instance",
                                            "replacement": a.instance}])  # fmt: skip
    return Prometheus(
        lab, ns, [job, path_job], name=f"prometheus-{index}", listen=f"10.201.{index}.2:9090",
        scrape_interval_s=INTERVAL_S, scrape_timeout_s=1.5,
        extra_config={"storage": {"tsdb": {"out_of_order_time_window": "1h"}},
                      "global": {"scrape_interval": duration(INTERVAL_S),
                                 "scrape_timeout": duration(1.5),
                                 "external_labels": {"prometheus_replica": f"prometheus-{index}"}}},
        extra_args=["--web.enable-remote-write-receiver"],
    )  # fmt: skip


def path_job_complete(prom: Prometheus, a: Site, start: float, end: float) -> None:
    """The second job's series, with its own job and labels, complete over the outage."""
    window = int(end - start)
    expected = window / INTERVAL_S

    def complete() -> dict[str, int] | None:
        counts = samples_per_series(prom, a.instance, window, start + window, job=PATH_JOB)
        ok = len(counts) > 10 and all(abs(n - expected) <= 1 for n in counts.values())
        return counts if ok else None

    counts = wait_until(complete, 60, f"{prom.name}'s {PATH_JOB} series backfilled")
    assert all(json.loads(k).get("via") == "path" for k in counts)


def pair_scraping_two_sites(
    lab: Lab, cloud: Netns, receivers: str, url: str
) -> tuple[list[Site], list[Prometheus]]:
    """Two sites, the gateway (backfill into ``url`` with ``receivers``, both jobs known) and
    the HA pair, every target up and learned by site A's agent once per replica and job."""
    gw_key = lab.workdir / "gateway.key"
    gw_public = write_key(gw_key)
    sites = [Site("a", 1, 1001), Site("b", 2, 2002)]
    agents = {s.key: build_site(lab, cloud, s, gw_public) for s in sites}
    backfill = {"enabled": True, "receivers": receivers, "remote_write_url": url,
                "out_of_order_window_s": 3600,
                "jobs": [{"port": 9100, "job": JOB, "mode": "forward"},
                         {"port": 9100, "job": PATH_JOB, "mode": "path",
                          "labels": {"via": "path"}}]}  # fmt: skip
    start_gateway(lab, cloud, gw_key, agents, proxy_listen=f"0.0.0.0:{PROXY_PORT}",
                  backfill=backfill)  # fmt: skip
    pair = [replica(lab, cloud, i, sites).start() for i in (0, 1)]
    for prom in pair:
        prom.wait_all_up({JOB: 2, PATH_JOB: 1}, timeout_s=60)
    # one target per replica and job: the pair is not one target scraped four times as often
    wait_until(lambda: agent_status(sites[0])["backfill"]["targets"] == 4, 30,
               "both replicas learned")  # fmt: skip
    time.sleep(4 * INTERVAL_S)  # a few arrivals for each one's interval estimate
    return sites, pair


def test_ha_pair_each_replica_backfilled_into_its_own_storage(lab: Lab) -> None:
    from tests.helpers.e2e.netns import require_e2e

    require_e2e("prometheus", "nft", NODE_EXPORTER)
    cloud = lab.netns("ha-cloud")
    sites, pair = pair_scraping_two_sites(lab, cloud, "per_scraper",
                                          "http://{scraper}:9090/api/v1/write")  # fmt: skip
    a = sites[0]

    start, end, recovery = outage(lab, cloud, a, 60.0, kill_agent=False)
    print(f"\nHA pair, recovery after a 60 s blackhole: {recovery:.2f}s")
    for prom in pair:  # each replica complete in its own storage, in both jobs
        check_outage(prom, sites, start, end)
        path_job_complete(prom, a, start, end)
    for index in (0, 1):
        text = (lab.workdir / f"prometheus-{index}.log").read_text(errors="replace").lower()
        for bad in ("duplicate sample", "out of bounds", "out of order sample", "too old"):
            assert bad not in text, f"prometheus-{index} logged {bad!r}"


VICTORIA = "/usr/bin/victoria-metrics"


def vm_counts(cloud: Netns, selector: str, at: float) -> dict[str, int]:
    """Samples per series of a range selector at ``at``, from VictoriaMetrics."""
    query = urllib.parse.urlencode({"query": selector, "time": f"{at:.3f}", "nocache": "1"})
    body = json.loads(cloud.http("127.0.0.1", 8428, f"/api/v1/query?{query}").body)
    return {json.dumps(r["metric"], sort_keys=True): len(r["values"])
            for r in body["data"]["result"]}  # fmt: skip


def test_ha_pair_into_one_shared_receiver_is_written_once(lab: Lab) -> None:
    """The same pair, both jobs, backfill into one shared VictoriaMetrics (no deduplication
    configured): each series of the outage is there once, one sample per interval, not two."""
    from tests.helpers.e2e.netns import require_e2e

    require_e2e("prometheus", "nft", NODE_EXPORTER, VICTORIA)
    cloud = lab.netns("sh-cloud")
    vm = lab.process(cloud, "victoria-metrics", [
        VICTORIA, f"-storageDataPath={lab.workdir / 'vm-data'}", "-httpListenAddr=127.0.0.1:8428",
        "-search.disableCache", "-search.latencyOffset=1s", "-loggerLevel=WARN"])  # fmt: skip
    cloud.wait_for_http("127.0.0.1", 8428, "/health", timeout_s=30, proc=vm)
    sites, _pair = pair_scraping_two_sites(lab, cloud, "shared",
                                           "http://127.0.0.1:8428/api/v1/write")  # fmt: skip
    a = sites[0]

    start, end, _ = outage(lab, cloud, a, 30.0, kill_agent=False)
    # the count expected is the queried window's (check_outage's rule): the outage's own
    # length, up to a second longer, asked for one sample more than the range can hold
    window = int(end - start)
    expected = window / INTERVAL_S
    for job in (JOB, PATH_JOB):
        promql = f'{{job="{job}",instance="{a.instance}"}}[{window}s]'

        def once(promql: str = promql) -> dict[str, int] | None:
            counts = vm_counts(cloud, promql, end)
            ok = len(counts) > 10 and all(abs(n - expected) <= 1 for n in counts.values())
            return counts if ok else None

        def detail(promql: str = promql) -> str:
            return str(vm_counts(cloud, promql, end))

        counts = wait_until(once, 60, f"{job}'s outage in VictoriaMetrics, once", detail=detail)
        if job == PATH_JOB:
            assert all(json.loads(k).get("via") == "path" for k in counts)
