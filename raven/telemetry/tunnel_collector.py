"""The live state of tunnels, read when a registry is collected (client_python's custom
collector): no sampling, no push on keepalives, nothing to refresh before a scrape.

Each tunnel's protocol counters (`TunnelStats`, updated in place by the connection) are read
at collection time. A peer's counters stay monotonic across reconnects: when a tunnel goes, its
final counts are folded into the peer's totals, to which the live tunnels' counts are added.

Series (``<peer>`` is ``agent`` on the gateway, ``gateway`` on the agent):

- ``raven_tunnels_connected{<peer>}``: 1 while a tunnel to the peer is up, else 0;
- ``raven_tunnel_bytes_total``, ``raven_tunnel_records_total``,
  ``raven_tunnel_frames_total`` ``{direction, <peer>}``: wire bytes, records, frames;
- ``raven_streams_open{<peer>}``; ``raven_tunnel_rtt_seconds{<peer>}`` (the last measured);
- ``raven_tunnels_by_suite{<peer>, suite}``: tunnels up per transport suite (issue 12);
- ``raven_tunnel_datagrams_dropped_total{reason}``: L3 datagrams dropped, every tunnel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sized
from typing import Protocol

from raven.protocol.stats import TunnelStats
from raven.protocol.suites import Suite
from raven.telemetry.promclient import Collector, CounterMetricFamily, GaugeMetricFamily, Metric

#: (metric name without _total, help, TunnelStats fields for tx and rx)
_WIRE_COUNTERS = (
    ("raven_tunnel_bytes", "Bytes on the wire per tunnel direction (tx, rx) and peer, "
     "encryption included."),
    ("raven_tunnel_records", "Encrypted records per direction and peer."),
    ("raven_tunnel_frames", "Frames per direction and peer."),
)  # fmt: skip


class _HasStats(Protocol):
    @property
    def stats(self) -> TunnelStats: ...

    @property
    def suite(self) -> Suite | None: ...


class LiveTunnel(Protocol):
    """What the collector reads of a tunnel (`raven.transport.tunnel.Tunnel` is one)."""

    @property
    def conn(self) -> _HasStats: ...

    @property
    def streams(self) -> Sized: ...

    @property
    def rtt_s(self) -> float | None: ...


def _wire_counts(stats: TunnelStats) -> Counter[str]:
    wire = stats.wire
    return Counter({
        "raven_tunnel_bytes/tx": wire.bytes_sent,
        "raven_tunnel_bytes/rx": wire.bytes_received,
        "raven_tunnel_records/tx": wire.records_sent,
        "raven_tunnel_records/rx": wire.records_received,
        "raven_tunnel_frames/tx": sum(stats.frames_sent.values()),
        "raven_tunnel_frames/rx": sum(stats.frames_received.values()),
    })  # fmt: skip


class TunnelCollector(Collector):
    """Per-peer tunnel state; the application says when a tunnel comes up and goes."""

    def __init__(self, peer_label: str) -> None:
        self.peer_label = peer_label
        #: every peer seen (its list empty while none of its tunnels is up)
        self._live: dict[str, list[LiveTunnel]] = {}
        #: the final counts of a peer's closed tunnels (made when its first tunnel closes)
        self._closed: dict[str, Counter[str]] = {}
        self._closed_drops: Counter[str] = Counter()
        self._last_rtt: dict[str, float] = {}

    def tunnel_up(self, peer: str, tunnel: LiveTunnel) -> None:
        """``tunnel`` to ``peer`` finished its handshake."""
        live = self._live.setdefault(peer, [])
        if tunnel not in live:
            live.append(tunnel)

    def tunnel_down(self, peer: str, tunnel: LiveTunnel) -> None:
        """``tunnel`` closed: its final counts join the peer's totals. Idempotent."""
        live = self._live.get(peer, [])
        if tunnel not in live:
            return
        live.remove(tunnel)
        stats = tunnel.conn.stats
        self._closed.setdefault(peer, Counter()).update(_wire_counts(stats))
        self._closed_drops.update(stats.datagrams_dropped)
        if tunnel.rtt_s is not None:
            self._last_rtt[peer] = tunnel.rtt_s

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        p = self.peer_label
        return [
            GaugeMetricFamily(
                "raven_tunnels_connected", "Tunnels up (handshake done) per peer.", labels=[p]
            ),
            *(CounterMetricFamily(name, text, labels=["direction", p])
              for name, text in _WIRE_COUNTERS),
            GaugeMetricFamily("raven_streams_open", "Streams open per peer.", labels=[p]),
            GaugeMetricFamily(
                "raven_tunnel_rtt_seconds", "Last measured tunnel round-trip time.", labels=[p]
            ),
            GaugeMetricFamily(
                "raven_tunnels_by_suite",
                "Tunnels up per peer by transport suite (chacha20-poly1305, aes-256-gcm).",
                labels=[p, "suite"],
            ),
            CounterMetricFamily(
                "raven_tunnel_datagrams_dropped",
                "L3 datagrams the tunnel dropped instead of blocking (queue full, too big).",
                labels=["reason"],
            ),
        ]  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        connected, *wire, streams_open, rtt, suites, drops = self._families()
        wire_by_name = {family.name: family for family in wire}
        all_drops = Counter(self._closed_drops)
        for peer, live in sorted(self._live.items()):
            # built from Counters and dicts only: Counter(iterable) asks isinstance(iterable,
            # Mapping), and for a type that is not one (a tuple, a generator) the first such
            # question walks every Mapping subclass's ABC cache: ~50 KiB of weakrefs, once
            counts = Counter(self._closed.get(peer) or {})
            for tunnel in live:
                counts.update(_wire_counts(tunnel.conn.stats))
                all_drops.update(tunnel.conn.stats.datagrams_dropped)
            connected.add_metric([peer], 1 if live else 0)
            for key in sorted(_wire_counts(TunnelStats())):
                name, direction = key.split("/")
                wire_by_name[name].add_metric([direction, peer], counts[key])
            streams_open.add_metric([peer], sum(len(t.streams) for t in live))
            measured = [t.rtt_s for t in live if t.rtt_s is not None]
            last = measured[-1] if measured else self._last_rtt.get(peer)
            if last is not None:
                rtt.add_metric([peer], last)
            by_suite: dict[Suite, int] = {}
            for t in live:
                if t.conn.suite is not None:
                    by_suite[t.conn.suite] = by_suite.get(t.conn.suite, 0) + 1
            for suite, count in sorted(by_suite.items()):
                suites.add_metric([peer, suite.label], count)
        for reason, count in sorted(all_drops.items()):
            drops.add_metric([reason], count)
        yield connected
        yield from wire
        yield from (streams_open, rtt, suites, drops)
