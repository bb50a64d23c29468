"""Gateway-level metrics (the tunnel's are in raven.telemetry.metrics, the proxy's in
proxy/metrics)."""

from __future__ import annotations

from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.authorised_agents = Gauge(
            "raven_gateway_authorised_agents",
            "Agent keys in the gateway configuration.",
            registry=registry,
        )
        self.reloads = Counter(
            "raven_gateway_config_reloads_total",
            "Config reloads that changed the authorised agents.",
            registry=registry,
        )
