"""The edge agent's composition root: keys, node table, relay, dialer, admin, and the
optional Kubernetes node source, L3 forwarder and GPU exporter."""

from __future__ import annotations

import logging
import os
from typing import Any

from edge_agent.dialer import Dialer
from edge_agent.gateway_link import DialSettings, GatewayLink
from edge_agent.relay import Relay
from raven.admin import AdminRequest, AdminResponse, AdminServer
from raven.admin.asyncio_backend import AsyncioBackend
from raven.config.agent import AgentConfig
from raven.keys import decode_key, read_private_key_file
from raven.runtime.service import run_until_signalled
from raven.telemetry.loop_lag import LoopLagProbe
from raven.telemetry.metrics import TunnelMetrics
from raven.telemetry.process_metrics import process_registry
from raven.telemetry.promclient import CollectorRegistry, Gauge
from raven.transport.tunnel import Tunnel

log = logging.getLogger(__name__)


def dial_settings(config: AgentConfig) -> DialSettings:
    """How the agent's links dial: keys, limits, backoff, and the layers between the agent
    and the gateway (None for plain TCP: no proxy, no WebSocket)."""
    _, port, ws_path = config.gateway_endpoint
    route = config.gateway_transport(os.environ)
    plain = ws_path is None and not route.uses_proxy(port)
    reconnect = config.reconnect
    return DialSettings(
        static_private=read_private_key_file(config.private_key_file),
        gateway_public=decode_key(config.gateway_public_key),
        psk=read_private_key_file(config.psk_file) if config.psk_file else bytes(32),
        limits=config.limits.to_limits(),
        min_backoff_s=reconnect.min_backoff_s,
        max_backoff_s=reconnect.max_backoff_s,
        probe_s=reconnect.probe_s,
        probe_for_s=reconnect.probe_for_s,
        suites=config.transport_suites(),
        replica_retry_max_s=reconnect.replica_retry_max_s,
        replica_search_attempts=reconnect.replica_search_attempts,
        transport=None if plain else route,
    )


class AgentApp:
    """Everything one edge agent runs."""

    def __init__(self, config: AgentConfig, *, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.metrics_registry = registry or process_registry()
        self.metrics = TunnelMetrics(self.metrics_registry, peer_label="gateway")
        self.loop_lag = LoopLagProbe(self.metrics_registry)
        self.relay = Relay(
            config.nodes, config.allowed_ports, config.connect_timeout_s, self.metrics_registry
        )
        self.settings = dial_settings(config)
        host, port, _ = config.gateway_endpoint
        self.dialer = Dialer(
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            self.settings,
            link_factory=self._make_link,
            resolve_interval_s=config.resolve_interval_s,
            dns_server=config.dns_server,
            registry=self.metrics_registry,
        )
        self.admin = AdminServer(
            config.admin_listen,
            self.metrics_registry,
            self._ready,
            token_file=config.admin_token_file,
            backend=AsyncioBackend(),  # no aiohttp in the agent (its RSS, issue 12)
        )
        self.admin.add_route("/api/v1/status", self._api_status)
        self.nodes_served = Gauge(
            "raven_agent_nodes_served",
            "Nodes in this agent's table.",
            registry=self.metrics_registry,
        )
        self.nodes_served.set_function(lambda: len(self.relay.nodes))
        self.backfill: Any = None
        if config.backfill.enabled:
            from edge_agent.backfill.service import BackfillService

            self.backfill = BackfillService(
                config.backfill,
                nodes=lambda: self.relay.nodes,
                tunnels=self._tunnels,
                registry=self.metrics_registry,
            )
            self.relay.request_watcher = self.backfill.sniffer
        self.node_source: Any = None
        self.service_endpoints: Any = None
        self.l3: Any = None
        self.gpu: Any = None

    def _make_link(self, address: str, port: int) -> GatewayLink:
        return GatewayLink(
            address,
            port,
            self.settings,
            on_stream=self.relay.handle,
            registration=self._registration,
            metrics=self.metrics,
            on_tunnel=self._on_tunnel,
            on_datagram=self._on_datagram,
        )

    def _registration(self) -> tuple[list[str], list[str]]:
        return sorted(self.relay.nodes), list(self.config.subnets)

    def _tunnels(self) -> list[Tunnel]:
        return [link.tunnel for link in self.dialer.all_links() if link.tunnel is not None]

    def _on_tunnel(self, link: GatewayLink, tunnel: Tunnel | None) -> None:
        if self.backfill is not None:
            self.backfill.tunnel_changed()
        if self.l3 is not None:
            self.l3.tunnel_changed(link, tunnel)

    def _on_datagram(self, packet: bytes) -> None:
        if self.l3 is not None:
            self.l3.packet_from_gateway(packet)

    def set_nodes(self, nodes: dict[str, str]) -> None:
        """Replace the node table (Kubernetes source) and re-register everywhere."""
        self.relay.set_nodes(nodes)
        self.dialer.reregister()

    async def start(self) -> None:
        self.loop_lag.start()
        if self.config.gpu_exporter.enabled:
            from gpu_exporter.embed import start_embedded_exporter

            self.gpu = await start_embedded_exporter(self.config.gpu_exporter)
        if self.config.kubernetes.enabled:
            from edge_agent.nodes_k8s import start_node_source

            self.node_source = await start_node_source(self.config.kubernetes, self._nodes_changed)
        if self.config.kubernetes.services:
            from edge_agent.service_endpoints import start_service_endpoints
            from raven.kube.client import load_config

            self.service_endpoints = await start_service_endpoints(
                self.config.kubernetes.services, load_config(self.config.kubernetes.kubeconfig)
            )
            self.relay.endpoints = self.service_endpoints
        if self.config.tun.enabled:
            from edge_agent.tun.setup import start_agent_l3

            self.l3 = await start_agent_l3(
                self.config.tun, self.config.subnets, self.metrics_registry, agent=self.config.name
            )
        if self.backfill is not None:
            await self.backfill.start()
        await self.admin.start()
        self.dialer.start()
        log.info("agent started gateway=%s nodes=%d", self.config.gateway, len(self.relay.nodes))

    async def _nodes_changed(self, nodes: dict[str, str]) -> None:
        log.info("node table changed nodes=%d", len(nodes))
        self.set_nodes(nodes)

    async def stop(self) -> None:
        self.loop_lag.stop()
        await self.dialer.stop()
        if self.backfill is not None:
            await self.backfill.stop()
        if self.node_source is not None:
            await self.node_source.stop()
        if self.service_endpoints is not None:
            await self.service_endpoints.stop()
        if self.l3 is not None:
            await self.l3.stop()
        if self.gpu is not None:
            await self.gpu.stop()
        await self.admin.stop()

    def _ready(self) -> tuple[bool, str]:
        up = [link for link in self.dialer.all_links() if link.tunnel is not None]
        if not up:
            return False, "no tunnel to any gateway replica is up"
        return True, ""

    def _api_status(self, _request: AdminRequest) -> AdminResponse:
        links = []
        for link in self.dialer.all_links():
            links.append(
                {
                    "gateway": link.label,
                    "replica": link.replica_id if link.holds else None,
                    "up": link.tunnel is not None,
                    "via": link.via or None,
                    "rtt_seconds": link.tunnel.rtt_s if link.tunnel else None,
                    "connects": link.connects,
                    "last_error": link.last_error,
                    "accepted_nodes": len(link.accepted_nodes),
                    "refused": [{"entry": e, "reason": r} for e, r in link.refused],
                }
            )
        body: dict[str, Any] = {
            "nodes": sorted(self.relay.nodes),
            "gateways": links,
            "replicas": {"announced": self.dialer.wanted(), "held": len(self.dialer.claims)},
        }
        if self.backfill is not None:
            body["backfill"] = self.backfill.status_json()
        return AdminResponse.json(body)


async def run_agent(config: AgentConfig) -> int:
    """Run until SIGINT/SIGTERM, then drain."""
    return await run_until_signalled(AgentApp(config), "agent")
