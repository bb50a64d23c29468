"""What the live demo prints: first the URLs to open and what to try, then a status view that
refreshes in place on a terminal (a new block per refresh otherwise).

On a terminal the view is one screen: it keeps the two URLs and the "Try:" lines, fits the
terminal's width (80 columns and more: no line wraps) and height (the node table is cut with a
"more" line before anything else goes), and never ends in a newline, so the screen never
scrolls the top away."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from cloud_gateway.status import gateway_status
from raven.telemetry.status_table import fmt_age, fmt_ms, render_status, table
from raven.version import version

if TYPE_CHECKING:
    from raven_cli.demo.runner import Demo

#: Cursor home and clear to the end of the screen: redraw in place.
REDRAW = "\x1b[H\x1b[J"
#: The smallest screen the live view is laid out for.
MIN_COLUMNS, MIN_ROWS = 80, 24


def urls(demo: Demo) -> list[str]:
    """The two things to open in a browser, short enough for an 80-column line."""
    status = f"http://{demo.topology.host}:{demo.admin_port}/"
    if demo.shortlink is not None:
        prom = f"Prometheus, GPU utilisation by node:  {demo.shortlink.url}"
    else:
        prom = f"Prometheus: not running ({demo.prometheus_note or '--no-prometheus'})"
    return [prom, f"Gateway status page:                  {status}"]


def try_lines(demo: Demo, *, comments: bool) -> list[str]:
    """Commands to paste: one scrape per addressing mode, a refusal, and `raven status`."""
    host, proxy, admin = demo.topology.host, demo.proxy_port, demo.admin_port
    first = demo.topology.nodes[0]
    target = f"{first.name}:{first.port}"
    lines = [
        (f"curl -s -H 'Host: {target}' http://{host}:{proxy}/metrics | head", "DNS mode"),
        (f"curl -s -x http://{host}:{proxy} http://{target}/metrics | head", "proxy_url"),
        (f"curl -s http://{host}:{proxy}/proxy/{target}/metrics | head", "path mode"),
        (f"curl -s http://{host}:{proxy}/proxy/no-such-node:{first.port}/metrics",
         "404, one-line reason"),
        (f"raven status --gateway http://{host}:{admin}", "(.venv/bin/raven off the venv)"),
    ]  # fmt: skip
    if not comments:
        return ["Try:", *(f"  {cmd}" for cmd, _ in lines)]
    width = max(len(cmd) for cmd, _ in lines)
    return ["Try:", *(f"  {cmd.ljust(width)}   # {note}" for cmd, note in lines)]


def intro(demo: Demo) -> str:
    """Printed once: everything the live view has, plus where the demo's files are."""
    host = demo.topology.host
    prom_config = demo.prometheus.dir / "prometheus.yml" if demo.prometheus else None
    lines = ["Open in a browser:", *(f"  {u}" for u in urls(demo))]
    if demo.prometheus is not None and demo.shortlink is not None:
        lines.append(f"  (it redirects to {demo.prometheus.graph_url()})")
    if demo.prometheus_note and demo.shortlink is not None:
        lines.append(f"  ({demo.prometheus_note}; the proxy_url job runs)")
    lines += [
        "",
        f"Raven demo: cloud gateway + {len(demo.agents)} edge sites + "
        f"{len(demo.topology.nodes)} GPU nodes",
        f"  tunnel {host}:{demo.tunnel_port}   proxy {host}:{demo.proxy_port}   "
        f"admin http://{host}:{demo.admin_port}",
        f"  Prometheus config: {prom_config or '-'}",
        f"  hosts file for CoreDNS/dnsmasq: {demo.hosts_file}",
        "",
        *try_lines(demo, comments=True),
    ]
    return "\n".join(lines) + "\n"


def _agents(agents: list[dict[str, Any]]) -> list[str]:
    rows = [[a["site"], a["state"], a["address"] or "-", fmt_ms(a["rtt_seconds"]),
             fmt_age(a["uptime_seconds"]), str(a["open_streams"]), str(a["nodes"])]
            for a in agents]  # fmt: skip
    headers = ["SITE", "STATE", "ADDRESS", "RTT", "UPTIME", "STREAMS", "NODES"]
    return table(headers, rows, right={3, 4, 5, 6}).splitlines()


def _nodes(nodes: list[dict[str, Any]], room: int) -> list[str]:
    """The node table in at most ``room`` lines (heading included), cut with a "more" line."""
    shown = nodes if len(nodes) + 1 <= room else nodes[: max(room - 2, 0)]
    rows = [[n["node"], n["site"] if n["reachable"] else f"{n['site'] or '-'} (down)",
             f"{fmt_age(n['last_scrape_age_seconds'])} ago" if n["last_scrape"] else "never",
             ("ok" if n["result"] == "ok" else str(n["result"] or "-")),
             fmt_ms(n["latency_p50_seconds"]), fmt_ms(n["latency_p99_seconds"]),
             str(n["scrapes_ok"]), str(n["scrapes_failed"])] for n in shown]  # fmt: skip
    headers = ["NODE", "SITE", "LAST SCRAPE", "RESULT", "P50", "P99", "OK", "FAILED"]
    lines = table(headers, rows, right={4, 5, 6, 7}).splitlines()
    if len(shown) < len(nodes):
        lines.append(f"... {len(nodes) - len(shown)} more nodes: raven status lists every one")
    return lines


def _problems(data: dict[str, Any]) -> list[str]:
    errors = data["errors"]
    line = (
        "no errors"
        if not errors
        else "errors: "
        + ", ".join(f"{e['reason']} x{e['count']} ({e['last_node'] or '-'})" for e in errors[:3])
    )
    refusals = data.get("handshake_refusals") or []
    if refusals:
        count = sum(r["count"] for r in refusals)
        line += f"; {count} refused handshakes (raven status says why)"
    return [line]


def live_frame(data: dict[str, Any], demo: Demo, rate: float, columns: int, rows: int) -> str:
    """One screen of the live view: ``rows`` lines at most, none wider than ``columns``."""
    agents, nodes = data["agents"], data["nodes"]
    up = sum(1 for a in agents if a["state"] == "up")
    reachable = sum(1 for n in nodes if n["reachable"])
    head = [
        f"Raven demo {time.strftime('%H:%M:%S')}: {up}/{len(agents)} agents up, "
        f"{reachable}/{len(nodes)} nodes, {rate:.1f} scrapes/s, {demo.errors} errors",
        *urls(demo),
        "",
        *_agents(agents),
        "",
    ]
    tail = ["", *try_lines(demo, comments=False), "Ctrl-C stops the demo."]
    problems = _problems(data)
    room = rows - len(head) - len(problems) - len(tail)
    lines = [*head, *_nodes(nodes, room), *problems, *tail]
    return "\n".join(line[:columns] for line in lines[:rows])


def frame(demo: Demo, rate: float) -> str:
    """A full status block, for output that is not a terminal (a log keeps every block)."""
    data = _status(demo)
    head = (f"{time.strftime('%H:%M:%S')}  demo scrapes/s {rate:5.1f}  errors {demo.errors}"
            "   (Ctrl-C stops)\n\n")  # fmt: skip
    return head + render_status(data)


def _status(demo: Demo) -> dict[str, Any]:
    assert demo.gateway is not None
    scrapes = demo.gateway.proxy.scrapes
    return gateway_status(demo.gateway.registry, scrapes, started_at=demo.gateway.started_at,
                          version=version())  # fmt: skip


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
        if tty:
            columns, rows = shutil.get_terminal_size((MIN_COLUMNS, MIN_ROWS))
            sys.stdout.write(REDRAW + live_frame(_status(demo), demo, rate, columns, rows))
        else:
            sys.stdout.write("\n" + frame(demo, rate))
        sys.stdout.flush()
