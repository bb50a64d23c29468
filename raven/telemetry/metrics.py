"""Metrics of the tunnel itself, shared by the gateway (peer label ``agent``) and the agent
(peer label ``gateway``: the replica address). Every metric lives on the registry passed in.

Events (handshakes, resets, closes, refusals, streams opened, keepalive RTTs) are counted when
they happen; the tunnels' live state (connected, bytes, records, frames, open streams, last
RTT, datagram drops) is read at scrape time by `raven.telemetry.tunnel_collector.TunnelCollector`
(``TunnelMetrics.live``)."""

from __future__ import annotations

from raven.telemetry.promclient import CollectorRegistry, Counter, Histogram
from raven.telemetry.tunnel_collector import LiveTunnel, TunnelCollector

__all__ = ["LiveTunnel", "TunnelCollector", "TunnelMetrics"]


class TunnelMetrics:
    """Prometheus metrics of tunnels, handshakes, streams and registrations."""

    def __init__(self, registry: CollectorRegistry, peer_label: str = "agent") -> None:
        p = peer_label
        self.peer_label = p
        self.live = TunnelCollector(p)
        registry.register(self.live)
        self.handshakes = Counter(
            "raven_handshakes_total",
            "Tunnel handshakes by result (ok, unknown_key, decrypt_failed, replay, "
            "rate_limited, malformed, bad_record, unconfirmed, handshake_timeout, ...).",
            ["result"],
            registry=registry,
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
        self.cookie_replies = Counter(
            "raven_handshake_cookie_replies_total",
            "Handshake cookie replies: sent by the gateway under handshake load instead of a "
            "Diffie-Hellman, accepted by the agent (which then initiates again with mac2).",
            registry=registry,
        )
        self.transport_failures = Counter(
            "raven_transport_failures_total",
            "Attempts to reach the peer that failed below the tunnel, by stage (proxy, tls,"
            " websocket) and reason (auth_required, forbidden, bad_gateway, dns_failure,"
            " unreachable, tls_failed, error).",
            ["stage", "reason"],
            registry=registry,
        )
        self.tunnel_closes = Counter(
            "raven_tunnel_closes_total", "Tunnels closed by reason.", ["reason"], registry=registry
        )
