"""What the gateway's status page and `raven status` show: sites and agents, nodes with their
recent scrapes, and recent errors by reason.

`ScrapeLog` is fed by the proxy (one call per finished request) and holds bounded, recent
state; `gateway_status` assembles the ``/api/v1/status`` document from it and the registry.
"""

from __future__ import annotations

import functools
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from cloud_gateway.refusals import Refusals
from cloud_gateway.registry import Registry, iso_utc
from raven.keys import key_id

#: Scrape durations kept per node for the p50/p99 (the most recent ones).
DURATIONS_KEPT = 128
#: Nodes with scrape state; the least recently scraped is forgotten beyond this.
MAX_NODES = 20_000
#: Recent errors listed on the page.
RECENT_ERRORS = 50


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


@dataclass
class NodeScrapes:
    """The recent scrapes of one node through this gateway."""

    last_at: float = 0.0
    last_status: int = 0
    last_result: str = ""  # "ok" or the error reason (no_agent, target_refused, ...)
    last_error: str = ""
    last_error_at: float = 0.0
    ok: int = 0
    failed: int = 0
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=DURATIONS_KEPT))


@dataclass
class ErrorTally:
    count: int = 0
    last_at: float = 0.0
    last_node: str = ""
    last_detail: str = ""


class ScrapeLog:
    """Bounded recent scrape results per node and error counts per reason."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.nodes: OrderedDict[str, NodeScrapes] = OrderedDict()
        self.errors: dict[str, ErrorTally] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ERRORS)

    def _node(self, node: str) -> NodeScrapes:
        state = self.nodes.get(node)
        if state is None:
            state = self.nodes[node] = NodeScrapes()
            if len(self.nodes) > MAX_NODES:
                self.nodes.popitem(last=False)
        else:
            self.nodes.move_to_end(node)
        return state

    def ok(self, node: str, status: int, seconds: float) -> None:
        """A request to ``node`` was answered (``status`` is the target's)."""
        state = self._node(node)
        state.last_at, state.last_status, state.last_result = self.clock(), status, "ok"
        state.ok += 1
        state.durations.append(seconds)

    def failed(self, node: str, reason: str, status: int, detail: str = "") -> None:
        """A request failed with ``reason``; ``node`` empty when no node was named."""
        now = self.clock()
        tally = self.errors.setdefault(reason, ErrorTally())
        tally.count += 1
        tally.last_at, tally.last_node, tally.last_detail = now, node, detail
        self.recent.appendleft(
            {"at": iso_utc(now), "reason": reason, "status": status, "node": node, "detail": detail}
        )
        if not node or reason == "unknown_node":  # unbounded names: no per-node state
            return
        state = self._node(node)
        state.last_at, state.last_status, state.last_result = now, status, reason
        state.last_error, state.last_error_at = detail or reason, now
        state.failed += 1


@functools.cache
def status_page_html() -> str:
    """The status page (cloud_gateway/web/status.html, shipped in the package)."""
    return resources.files("cloud_gateway.web").joinpath("status.html").read_text("utf-8")


def _agent_rows(registry: Registry, now: float) -> list[dict[str, Any]]:
    rows = []
    for agent in sorted(registry.by_key.values(), key=lambda a: a.name):
        session = registry.sessions.get(agent.name)
        row: dict[str, Any] = {
            "site": agent.name,
            "agent_key": key_id(agent.public_key),
            "state": "down",
            "address": None,
            "connected_since": None,
            "uptime_seconds": None,
            "rtt_seconds": None,
            "bytes_sent": 0,
            "bytes_received": 0,
            "open_streams": 0,
            "nodes": 0,
            "refused": 0,
        }
        if session is not None:
            tunnel = session.tunnel
            wire = tunnel.conn.stats.wire
            row.update(
                state="draining" if tunnel.draining else "up",
                address=tunnel.peer,
                connected_since=iso_utc(session.connected_since),
                uptime_seconds=round(now - session.connected_since, 3),
                rtt_seconds=tunnel.rtt_s,
                bytes_sent=wire.bytes_sent,
                bytes_received=wire.bytes_received,
                open_streams=len(tunnel.streams),
                nodes=len(session.nodes),
                refused=len(session.refused),
            )
        rows.append(row)
    return rows


def _site_of(registry: Registry, node: str) -> str | None:
    """The site authorised to serve ``node`` (its agent is down when this is asked)."""
    for agent in sorted(registry.by_key.values(), key=lambda a: a.name):
        if agent.may_serve(node):
            return agent.name
    return None


def _node_rows(registry: Registry, scrapes: ScrapeLog, now: float) -> list[dict[str, Any]]:
    rows = []
    for node in sorted(set(registry.seen_nodes) | set(registry.node_index)):
        sessions = registry.agents_for(node)
        state = scrapes.nodes.get(node)
        durations = list(state.durations) if state is not None else []
        row: dict[str, Any] = {
            "node": node,
            "site": ",".join(sorted(s.agent.name for s in sessions)) or _site_of(registry, node),
            "reachable": bool(sessions),
            "last_scrape": None,
            "last_scrape_age_seconds": None,
            "result": None,
            "status": None,
            "latency_p50_seconds": quantile(durations, 0.5),
            "latency_p99_seconds": quantile(durations, 0.99),
            "scrapes_ok": 0,
            "scrapes_failed": 0,
            "last_error": None,
        }
        if state is not None:
            row.update(
                last_scrape=iso_utc(state.last_at),
                last_scrape_age_seconds=round(now - state.last_at, 3),
                result=state.last_result,
                status=state.last_status,
                scrapes_ok=state.ok,
                scrapes_failed=state.failed,
                last_error=state.last_error or None,
            )
        rows.append(row)
    return rows


def gateway_status(
    registry: Registry,
    scrapes: ScrapeLog,
    *,
    started_at: float,
    version: str,
    refusals: Refusals | None = None,
) -> dict[str, Any]:
    """The ``/api/v1/status`` document."""
    now = scrapes.clock()
    errors = [
        {"reason": reason, "count": t.count, "last_at": iso_utc(t.last_at),
         "last_node": t.last_node, "last_detail": t.last_detail}
        for reason, t in sorted(scrapes.errors.items(), key=lambda kv: -kv[1].last_at)
    ]  # fmt: skip
    return {
        "gateway": {
            "version": version,
            "now": iso_utc(now),
            "uptime_seconds": round(now - started_at, 3),
        },
        "agents": _agent_rows(registry, now),
        "nodes": _node_rows(registry, scrapes, now),
        "errors": errors,
        "recent_errors": list(scrapes.recent),
        "handshake_refusals": refusals.to_json() if refusals is not None else [],
    }
