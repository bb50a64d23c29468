"""The gateway status document (``/api/v1/status``) as plain terminal tables, shared by
`raven status` and the demo's live view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt_ms(seconds: float | None) -> str:
    """Milliseconds with sub-millisecond resolution: ``0.42 ms``, ``12.3 ms``, ``250 ms``."""
    if seconds is None:
        return "-"
    v = seconds * 1000
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded like kubectl's tables; columns in ``right`` are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]  # fmt: skip
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)]) + "\n"


def agents_table(agents: list[dict[str, Any]]) -> str:
    rows = [
        [a["site"], a["state"], a["agent_key"], a["address"] or "-", fmt_ms(a["rtt_seconds"]),
         fmt_age(a["uptime_seconds"]), fmt_bytes(a["bytes_sent"]),
         fmt_bytes(a["bytes_received"]), str(a["open_streams"]), str(a["nodes"])]
        for a in agents
    ]  # fmt: skip
    headers = ["SITE", "STATE", "KEY", "ADDRESS", "RTT", "UPTIME", "SENT", "RECEIVED",
               "STREAMS", "NODES"]  # fmt: skip
    return table(headers, rows, right={4, 5, 6, 7, 8, 9})


def _result(n: dict[str, Any]) -> str:
    if n["result"] is None:
        return "-"
    return f"ok {n['status']}" if n["result"] == "ok" else str(n["result"])


def _site(n: dict[str, Any]) -> str:
    if n["reachable"]:
        return str(n["site"])
    return f"{n['site']} (down)" if n["site"] else "(no agent)"


def nodes_table(nodes: list[dict[str, Any]]) -> str:
    rows = [
        [n["node"], _site(n),
         f"{fmt_age(n['last_scrape_age_seconds'])} ago" if n["last_scrape"] else "never",
         _result(n), fmt_ms(n["latency_p50_seconds"]), fmt_ms(n["latency_p99_seconds"]),
         str(n["scrapes_ok"]), str(n["scrapes_failed"]), (n["last_error"] or "")[:60]]
        for n in nodes
    ]  # fmt: skip
    headers = ["NODE", "SITE", "LAST SCRAPE", "RESULT", "P50", "P99", "OK", "FAILED",
               "LAST ERROR"]  # fmt: skip
    return table(headers, rows, right={4, 5, 6, 7})


def errors_table(errors: list[dict[str, Any]]) -> str:
    rows = [[e["reason"], str(e["count"]), e["last_at"], e["last_node"] or "-",
             (e["last_detail"] or "")[:70]] for e in errors]  # fmt: skip
    return table(["REASON", "COUNT", "LAST", "NODE", "DETAIL"], rows, right={1})


def refusals_table(refusals: list[dict[str, Any]]) -> str:
    """Refused handshakes beside the site each probably belongs to (its last good address)."""
    rows = [[r.get("site") or "unmatched", r["peer"], r["words"], r["reason"], str(r["count"]),
             r["last_at"]] for r in refusals]  # fmt: skip
    return table(["PROBABLE SITE", "PEER", "WHY", "CODE", "COUNT", "LAST"], rows, right={4})


def backfill_table(agents: list[dict[str, Any]]) -> str:
    """One line per site whose agent has backfilled through this gateway (docs/backfill.md)."""
    rows = []
    for a in agents:
        b = a.get("backfill")
        if not b:
            continue
        buffered = b["agent_buffered_samples"]
        rows.append([
            a["site"], "-" if buffered is None else str(int(buffered)),
            "-" if b["agent_buffered_bytes"] is None else fmt_bytes(int(b["agent_buffered_bytes"])),
            fmt_age(b["oldest_buffered_age_seconds"]), str(b["samples_written"]),
            str(sum(b["samples_dropped"].values())),
            f"{fmt_age(b['last_batch_age_seconds'])} ago" if b["last_batch"] else "never",
            (b["last_error"] or "")[:60],
        ])  # fmt: skip
    headers = ["SITE", "BUFFERED", "BUFFERED BYTES", "OLDEST", "WRITTEN", "DROPPED",
               "LAST BATCH", "LAST ERROR"]  # fmt: skip
    return table(headers, rows, right={1, 2, 3, 4, 5}) if rows else ""


def render_status(data: dict[str, Any]) -> str:
    """Agents, nodes and errors, each as a table with a one-line heading."""
    gw = data.get("gateway", {})
    agents, nodes, errors = data["agents"], data["nodes"], data["errors"]
    up = sum(1 for a in agents if a["state"] == "up")
    reachable = sum(1 for n in nodes if n["reachable"])
    out = [
        f"gateway {gw.get('version', '?')}, up {fmt_age(gw.get('uptime_seconds'))}: "
        f"{up}/{len(agents)} agents up, {reachable}/{len(nodes)} nodes reachable\n\n",
        agents_table(agents) if agents else "no agents authorised\n",
        "\n",
        nodes_table(nodes) if nodes else "no nodes registered\n",
        "\n",
        errors_table(errors) if errors else "no errors\n",
    ]
    refusals = data.get("handshake_refusals") or []
    if refusals:
        out += ["\nrefused handshakes (docs/troubleshooting.md, \"Handshake failures\")\n",
                refusals_table(refusals)]  # fmt: skip
    backfill = backfill_table(agents)
    if backfill:
        out += ["\nbackfill (samples an agent stored while its tunnel was down)\n", backfill]
    return "".join(out)


def render_agent_status(data: dict[str, Any]) -> str:
    """An agent's links (``raven status --agent``): one row per gateway connection, then the
    last error of every link that is down, in full (a refused proxy, a TLS failure)."""
    links = data.get("gateways", [])
    replicas = data.get("replicas", {})
    rows = [
        [g["gateway"], "up" if g["up"] else "down", g.get("replica") or "-",
         g.get("via") or "direct", fmt_ms(g.get("rtt_seconds")), str(g.get("connects", 0)),
         str(g.get("accepted_nodes", 0))]
        for g in links
    ]  # fmt: skip
    up = sum(1 for g in links if g["up"])
    out = [
        f"agent: {up}/{len(links)} gateway links up, {replicas.get('held', 0)} of "
        f"{replicas.get('announced', 0)} replicas held, {len(data.get('nodes', []))} nodes\n\n",
        table(
            ["GATEWAY", "STATE", "REPLICA", "VIA", "RTT", "CONNECTS", "NODES"],
            rows,
            right={4, 5, 6},
        )
        if rows
        else "no gateway links yet\n",
    ]
    errors = [(g["gateway"], g["last_error"]) for g in links if not g["up"] and g["last_error"]]
    if errors:
        out.append("\nlast errors\n")
        out += [f"{gateway}: {error}\n" for gateway, error in errors]
    return "".join(out)
