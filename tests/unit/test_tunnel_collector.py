"""The tunnel collector reads live tunnel state at scrape time (client_python's way: a private
registry, the data source passed in, get_sample_value)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from raven.protocol.stats import TunnelStats
from raven.protocol.suites import Suite
from raven.telemetry.metrics import TunnelMetrics


class Tunnel:
    """A tunnel's readable state (what `LiveTunnel` asks for), changed by the test."""

    def __init__(self) -> None:
        self.stats = TunnelStats()
        self.conn = self
        self.suite: Suite | None = Suite.CHACHAPOLY
        self.streams: dict[int, object] = {}
        self.rtt_s: float | None = None


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_counts_are_read_at_scrape_time_and_stay_monotonic_across_reconnects() -> None:
    registry = CollectorRegistry()
    live = TunnelMetrics(registry, peer_label="agent").live
    first = Tunnel()
    live.tunnel_up("site-a", first)
    assert value(registry, "raven_tunnels_connected", agent="site-a") == 1
    assert value(registry, "raven_tunnel_bytes_total", direction="tx", agent="site-a") == 0
    first.stats.wire.bytes_sent, first.stats.frames_received = 1000, {"data": 3, "ping": 1}
    first.streams = {1: object(), 3: object()}
    first.rtt_s = 0.002
    assert value(registry, "raven_tunnel_bytes_total", direction="tx", agent="site-a") == 1000
    assert value(registry, "raven_tunnel_frames_total", direction="rx", agent="site-a") == 4
    assert value(registry, "raven_streams_open", agent="site-a") == 2
    assert value(registry, "raven_tunnel_rtt_seconds", agent="site-a") == 0.002
    live.tunnel_down("site-a", first)
    live.tunnel_down("site-a", first)  # idempotent
    assert value(registry, "raven_tunnels_connected", agent="site-a") == 0
    assert value(registry, "raven_streams_open", agent="site-a") == 0
    assert value(registry, "raven_tunnel_rtt_seconds", agent="site-a") == 0.002  # last measured
    second = Tunnel()
    live.tunnel_up("site-a", second)
    second.stats.wire.bytes_sent = 10
    assert value(registry, "raven_tunnel_bytes_total", direction="tx", agent="site-a") == 1010
    first.stats.wire.bytes_sent = 99_999  # a closed tunnel's later changes are not read
    assert value(registry, "raven_tunnel_bytes_total", direction="tx", agent="site-a") == 1010


def test_datagram_drops_sum_every_tunnel_by_reason() -> None:
    registry = CollectorRegistry()
    live = TunnelMetrics(registry, peer_label="gateway").live
    a, b = Tunnel(), Tunnel()
    live.tunnel_up("10.0.0.1:10262", a)
    live.tunnel_up("10.0.0.2:10262", b)
    a.stats.datagrams_dropped = {"queue_full": 2}
    b.stats.datagrams_dropped = {"queue_full": 1, "oversize": 4}
    live.tunnel_down("10.0.0.2:10262", b)
    name = "raven_tunnel_datagrams_dropped_total"
    assert value(registry, name, reason="queue_full") == 3
    assert value(registry, name, reason="oversize") == 4
    assert value(registry, "raven_tunnels_connected", gateway="10.0.0.1:10262") == 1
    assert value(registry, "raven_tunnels_connected", gateway="10.0.0.2:10262") == 0


def test_a_peer_never_seen_has_no_series() -> None:
    registry = CollectorRegistry()
    TunnelMetrics(registry, peer_label="agent")
    assert value(registry, "raven_tunnels_connected", agent="site-a") is None


def test_tunnels_by_suite_follow_the_live_tunnels_keys() -> None:
    """Read at scrape time, so a re-handshake that changed the suite shows at once."""
    registry = CollectorRegistry()
    live = TunnelMetrics(registry, peer_label="gateway").live
    a, b, handshaking = Tunnel(), Tunnel(), Tunnel()
    handshaking.suite = None  # no keys yet: not counted
    for tunnel in (a, b, handshaking):
        live.tunnel_up("10.0.0.1:10262", tunnel)
    name, peer = "raven_tunnels_by_suite", "10.0.0.1:10262"
    assert value(registry, name, gateway=peer, suite="chacha20-poly1305") == 2
    assert value(registry, name, gateway=peer, suite="aes-256-gcm") is None
    b.suite = Suite.AESGCM  # upgraded by a re-handshake
    assert value(registry, name, gateway=peer, suite="chacha20-poly1305") == 1
    assert value(registry, name, gateway=peer, suite="aes-256-gcm") == 1
    live.tunnel_down(peer, b)
    assert value(registry, name, gateway=peer, suite="aes-256-gcm") is None
