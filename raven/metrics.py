"""Metrics of the tunnel itself, shared by the gateway (peer label ``agent``) and the agent
(peer label ``gateway``: the replica address). Every metric lives on the registry passed in."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from raven.protocol.scheduler import TunnelStats


class TunnelMetrics:
    """Prometheus metrics of tunnels, handshakes, streams and registrations."""

    def __init__(self, registry: CollectorRegistry, peer_label: str = "agent") -> None:
        p = peer_label
        self.peer_label = p
        self.tunnels_connected = Gauge(
            "raven_tunnels_connected",
            "Tunnels up (handshake done) per peer.",
            [p],
            registry=registry,
        )
        self.handshakes = Counter(
            "raven_handshakes_total",
            "Tunnel handshakes by result (ok, unknown_key, decrypt_failed, replay, "
            "rate_limited, malformed, timeout, ...).",
            ["result"],
            registry=registry,
        )
        self.bytes = Counter(
            "raven_tunnel_bytes_total",
            "Bytes on the wire per tunnel direction (tx, rx) and peer, encryption included.",
            ["direction", p],
            registry=registry,
        )
        self.records = Counter(
            "raven_tunnel_records_total",
            "Encrypted records per direction and peer.",
            ["direction", p],
            registry=registry,
        )
        self.frames = Counter(
            "raven_tunnel_frames_total",
            "Frames per direction and peer.",
            ["direction", p],
            registry=registry,
        )
        self.streams_open = Gauge(
            "raven_streams_open", "Streams open per peer.", [p], registry=registry
        )
        self.streams_opened = Counter(
            "raven_streams_opened_total", "Streams opened per peer.", [p], registry=registry
        )
        self.stream_resets = Counter(
            "raven_stream_resets_total",
            "Stream resets by reason code.",
            ["code"],
            registry=registry,
        )
        self.rtt = Gauge(
            "raven_tunnel_rtt_seconds",
            "Last measured tunnel round-trip time.",
            [p],
            registry=registry,
        )
        self.rtt_hist = Histogram(
            "raven_tunnel_keepalive_rtt_seconds",
            "Tunnel round-trip times measured by keepalive pings (raven_tunnel_rtt_seconds is "
            "the last one per peer).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.registrations_refused = Counter(
            "raven_registrations_refused_total",
            "Node names or prefixes a peer registered that its key is not authorised for.",
            [p],
            registry=registry,
        )
        self.tunnel_closes = Counter(
            "raven_tunnel_closes_total", "Tunnels closed by reason.", ["reason"], registry=registry
        )
        self.datagrams_dropped = Counter(
            "raven_tunnel_datagrams_dropped_total",
            "L3 datagrams the tunnel dropped instead of blocking (queue full, too big).",
            ["reason"],
            registry=registry,
        )

    def forget_peer(self, peer: str) -> None:
        """Remove per-peer series of a peer that is gone (bounded cardinality)."""
        for metric in (self.tunnels_connected, self.streams_open, self.rtt):
            with contextlib.suppress(KeyError):
                metric.remove(peer)


class StatsSampler:
    """Moves one tunnel's live protocol counters (``TunnelStats``) into the metrics as
    deltas, so counters stay monotonic across samples."""

    def __init__(self, metrics: TunnelMetrics, peer: str) -> None:
        self.metrics = metrics
        self.peer = peer
        self._last: dict[str, int] = {}

    def _delta(self, key: str, value: int) -> int:
        previous = self._last.get(key, 0)
        self._last[key] = value
        return max(0, value - previous)

    def sample(self, stats: TunnelStats) -> None:
        m, p = self.metrics, self.peer
        m.bytes.labels("tx", p).inc(self._delta("bytes_tx", stats.bytes_sent))
        m.bytes.labels("rx", p).inc(self._delta("bytes_rx", stats.bytes_received))
        m.records.labels("tx", p).inc(self._delta("records_tx", stats.records_sent))
        m.records.labels("rx", p).inc(self._delta("records_rx", stats.records_received))
        m.frames.labels("tx", p).inc(self._delta("frames_tx", sum(stats.frames_sent.values())))
        m.frames.labels("rx", p).inc(self._delta("frames_rx", sum(stats.frames_received.values())))
        for reason, count in stats.datagrams_dropped.items():
            delta = self._delta(f"drop_{reason}", count)
            if delta:
                m.datagrams_dropped.labels(reason).inc(delta)
