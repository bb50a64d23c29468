"""What the live demo prints: first the two URLs to open, then a status view that refreshes in
place on a terminal (a new block per refresh otherwise), RTT with sub-millisecond resolution."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING

from cloud_gateway.status import gateway_status
from raven.status_table import render_status
from raven.version import version

if TYPE_CHECKING:
    from raven.demo.runner import Demo

#: Cursor home and clear to the end of the screen: redraw in place.
REDRAW = "\x1b[H\x1b[J"


def urls(demo: Demo) -> str:
    """The two things to open in a browser."""
    status = f"http://{demo.topology.host}:{demo.admin_port}/"
    prom = demo.prometheus.graph_url() if demo.prometheus is not None else None
    lines = ["Open in a browser:"]
    if prom is not None and not demo.prometheus_note.startswith("Prometheus"):
        lines.append(f"  Prometheus, GPU utilisation by node:  {prom}")
    else:
        lines.append(f"  Prometheus: not running ({demo.prometheus_note})")
    lines.append(f"  Gateway status page:                  {status}")
    if demo.prometheus_note and not demo.prometheus_note.startswith("Prometheus"):
        lines.append(f"  ({demo.prometheus_note}; the proxy_url job runs)")
    return "\n".join(lines) + "\n"


def intro(demo: Demo) -> str:
    host, proxy, admin = demo.topology.host, demo.proxy_port, demo.admin_port
    first = demo.topology.nodes[0]
    target = f"{first.name}:{first.port}"
    prom_config = demo.prometheus.dir / "prometheus.yml" if demo.prometheus else None
    return f"""{urls(demo)}
Raven demo: cloud gateway + {len(demo.agents)} edge sites + {len(demo.topology.nodes)} GPU nodes
  tunnel {host}:{demo.tunnel_port}   proxy {host}:{proxy}   admin http://{host}:{admin}
  Prometheus config: {prom_config or "-"}
  hosts file for CoreDNS/dnsmasq: {demo.hosts_file}

Try:
  curl -s -H 'Host: {target}' http://{host}:{proxy}/metrics | head     # DNS mode
  curl -s -x http://{host}:{proxy} http://{target}/metrics | head      # proxy_url
  curl -s http://{host}:{proxy}/proxy/{target}/metrics | head          # path mode
  curl -s http://{host}:{proxy}/proxy/no-such-node:{first.port}/metrics   # 404, one-line reason
  raven status --gateway http://{host}:{admin}
"""


def frame(demo: Demo, rate: float) -> str:
    assert demo.gateway is not None
    scrapes = demo.gateway.proxy.scrapes
    data = gateway_status(demo.gateway.registry, scrapes, started_at=demo.gateway.started_at,
                          version=version())  # fmt: skip
    head = (f"{time.strftime('%H:%M:%S')}  demo scrapes/s {rate:5.1f}  errors {demo.errors}"
            "   (Ctrl-C stops)\n\n")  # fmt: skip
    return head + render_status(data)


async def status_loop(demo: Demo, interval_s: float = 2.0) -> None:
    """Scrape every node like Prometheus would and show the gateway's status, in place on a
    terminal."""
    tty = sys.stdout.isatty()
    last_scrapes, last_t = 0, time.monotonic()
    while True:
        await asyncio.gather(*(demo.scrape(n, "dns") for n in demo.topology.nodes))
        await asyncio.sleep(interval_s)
        now = time.monotonic()
        rate = (demo.scrapes - last_scrapes) / (now - last_t)
        last_scrapes, last_t = demo.scrapes, now
        text = frame(demo, rate)
        if tty:
            sys.stdout.write(REDRAW + urls(demo) + "\n" + text)
        else:
            sys.stdout.write("\n" + text)
        sys.stdout.flush()
