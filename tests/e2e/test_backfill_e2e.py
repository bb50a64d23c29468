"""No sample lost across a WAN outage (issue 17), with the real Prometheus.

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    cloud ns: gateway (tunnel :10262, proxy :10264, backfill -> remote write), Prometheus
              (scrapes edge-a-1:9100 and edge-b-1:9100 every 2 s through proxy_url,
              --web.enable-remote-write-receiver, out_of_order_time_window 1h)
      |-- 10.200.1.0/24 -- site A agent ns -- 192.168.1.0/24 -- site A node (node_exporter)
      |-- 10.200.2.0/24 -- site B agent ns -- 192.168.1.0/24 -- site B node (node_exporter)

Site A's uplink is blackholed with an nftables drop (no FIN, no RST: only the keepalive can
tell) for 60 s, then restored. After reconnect, for every site-A series, Prometheus has one
sample per scrape interval over the outage (+-1), with the node's own values, no duplicate or
out-of-bounds errors in its log, and site B was scraped throughout. Then a 30 s outage during
which site A's agent is killed with SIGKILL and restarted: the same holds (the buffer and the
learned targets survive). The time from the link's return to the first scrape through the
tunnel is printed (recovery).
"""

from __future__ import annotations

import time

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
    start_gateway,
)
from tests.helpers.e2e.netns import Lab, wait_until
from tests.helpers.e2e.prometheus import Prometheus, static_job

pytestmark = pytest.mark.e2e


def prometheus_log_clean(lab: Lab) -> None:
    text = (lab.workdir / "prometheus.log").read_text(errors="replace").lower()
    for bad in ("duplicate sample", "out of bounds", "out of order sample", "too old"):
        assert bad not in text, f"Prometheus logged {bad!r}"


def test_outage_backfilled(lab: Lab) -> None:
    from tests.helpers.e2e.netns import require_e2e

    require_e2e("prometheus", "nft", NODE_EXPORTER)
    cloud = lab.netns("bf-cloud")
    gw_key = lab.workdir / "gateway.key"
    gw_public = write_key(gw_key)
    sites = [Site("a", 1, 1001), Site("b", 2, 2002)]
    agents = {s.key: build_site(lab, cloud, s, gw_public) for s in sites}
    start_gateway(lab, cloud, gw_key, agents)
    prom = Prometheus(
        lab, cloud, [static_job(JOB, [s.instance for s in sites], proxy_url=f"http://127.0.0.1:{PROXY_PORT}")],
        scrape_interval_s=INTERVAL_S, scrape_timeout_s=1.5,
        extra_config={"storage": {"tsdb": {"out_of_order_time_window": "1h"}}},
        extra_args=["--web.enable-remote-write-receiver"],
    ).start()  # fmt: skip
    prom.wait_all_up({JOB: 2}, timeout_s=60)
    a = sites[0]
    wait_until(lambda: agent_status(a)["backfill"]["targets"] >= 1, 30, "site A's target learned")
    time.sleep(4 * INTERVAL_S)  # a few arrivals for the interval estimate

    start, end, recovery = outage(lab, cloud, a, 60.0, kill_agent=False)
    print(f"\nrecovery after a 60 s blackhole: first scrape through the tunnel {recovery:.2f}s")
    check_outage(prom, sites, start, end)

    start, end, recovery = outage(lab, cloud, a, 30.0, kill_agent=True)
    print(f"recovery after a 30 s blackhole with the agent killed and restarted: {recovery:.2f}s")
    check_outage(prom, sites, start, end)
    prometheus_log_clean(lab)
