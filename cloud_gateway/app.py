"""The cloud gateway's composition root: keys, registry, tunnel listener, L7 proxy,
optional L3 router, admin API."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.registry import AgentSession, Registry
from cloud_gateway.status import ScrapeLog, gateway_status, status_page_html
from cloud_gateway.tunnel_listener import TunnelListener
from raven.admin import AdminRequest, AdminResponse, AdminServer
from raven.config import defaults
from raven.config.gateway import GatewayConfig, load_gateway_config
from raven.config.loader import ConfigError
from raven.keys import KeyError_, decode_key, read_private_key_file
from raven.protocol.codes import CloseCode
from raven.runtime.service import run_until_signalled
from raven.telemetry.loop_lag import LoopLagProbe
from raven.telemetry.metrics import TunnelMetrics
from raven.telemetry.process_metrics import process_registry
from raven.telemetry.promclient import CollectorRegistry, generate_text_off_loop
from raven.transport.tunnel import Tunnel, TunnelStream
from raven.version import version

log = logging.getLogger(__name__)


def read_psk(path: str | None) -> bytes:
    """The optional pre-shared key (all zeros when unset)."""
    if not path:
        return bytes(32)
    return read_private_key_file(path)


class GatewayApp:
    """Everything one cloud gateway replica runs."""

    def __init__(self, config: GatewayConfig, *, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.metrics_registry = registry or process_registry()
        self.loop_lag = LoopLagProbe(self.metrics_registry)
        self.metrics = TunnelMetrics(self.metrics_registry, peer_label="agent")
        self.registry = Registry(config.agents, self.metrics, node_ttl_s=config.node_ttl_s)
        self.static_private = read_private_key_file(config.private_key_file)
        self.listener = TunnelListener(
            listen=config.tunnel_listen,
            static_private=self.static_private,
            psk=read_psk(config.psk_file),
            limits=config.limits.to_limits(),
            registry=self.registry,
            metrics=self.metrics,
            handshake_rate_per_s=config.handshake_rate_per_s,
            handshake_burst=config.handshake_burst,
            max_half_open=config.max_half_open_handshakes,
            load_threshold=config.handshake_load_threshold,
            suites=config.accepted_suites(),
            replica_id=config.replica.resolved_id(),
            replicas=config.replica.count,
            websocket=config.websocket,
        )
        self.admin = AdminServer(
            config.admin_listen,
            self.metrics_registry,
            self._ready,
            # a series per node: written off the loop, which keeps serving every site meanwhile
            exposition=lambda: generate_text_off_loop(self.metrics_registry),
            token_file=config.admin_token_file,
        )
        self.admin.add_route("/api/v1/agents", self._api_agents)
        self.admin.add_route("/api/v1/nodes", self._api_nodes)
        self.admin.add_route("/api/v1/targets", self._api_targets)
        self.admin.add_route("/api/v1/status", self._api_status)
        # the page holds no data (it fetches api/v1/status, sending a token when asked for one),
        # so it is served like the probes: a browser cannot add a bearer token to a page load
        self.admin.add_route("/", self._status_page, public=True)
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        #: the last http_sd answer, by (registry generation, port)
        self._targets: tuple[tuple[int, int], AdminResponse] | None = None
        self.backfill: Any = None
        if config.backfill.enabled:
            from cloud_gateway.backfill.receiver import BackfillReceiver

            self.backfill = BackfillReceiver(
                config.backfill, self.metrics_registry, discovery=self._discovery_labels
            )
            self.listener.agent_stream_service = self._backfill_stream
        self.draining = False
        self.proxy: Any = None
        self.l3: Any = None
        self.gateway_metrics = GatewayMetrics(self.metrics_registry)
        self.gateway_metrics.authorised_agents.set_function(lambda: len(self.config.agents))

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop_lag.start()
        # L3 first: an agent registering the moment the tunnel port opens must find the
        # router's session hook in place, or its prefixes would get no routes.
        if self.config.tun.enabled:
            await self._start_l3()
        await self.listener.start()
        from cloud_gateway.proxy.server import ProxyServer

        scrapers = self.backfill.scrapers if self.backfill is not None else None
        self.proxy = ProxyServer(
            self.registry, self.config.proxy, self.metrics_registry, scrapers=scrapers
        )
        self.registry.on_forget = self.proxy.context.metrics.forget_nodes
        await self.proxy.start()
        await self.admin.start()
        log.info("gateway ready agents_authorised=%d", len(self.config.agents))

    async def _start_l3(self) -> None:
        from cloud_gateway.l3.setup import start_gateway_l3

        self.l3 = await start_gateway_l3(self.config.tun, self.metrics_registry)
        self.listener.session_hooks.append(self._l3_session)

    def _l3_session(self, session: AgentSession, up: bool) -> None:
        assert self.l3 is not None
        tunnel: Tunnel = session.tunnel
        if up:
            port = self.l3.ports.get(tunnel)
            if port is None:
                authorised = [str(p) for p in session.agent.prefixes]
                port = self.l3.attach(session.agent.name, authorised, tunnel.send_datagram)
                self.l3.ports[tunnel] = port
                tunnel.on_datagram = port.packet_from_agent  # straight from the receive path
            port.set_routes(list(session.prefixes))
        else:
            port = self.l3.ports.pop(tunnel, None)
            if port is not None:
                tunnel.on_datagram = None
                port.detach()

    async def stop(self) -> None:
        """Graceful stop, in the order a rolling update needs: not ready at once (/readyz
        503: the Service stops sending new connections), new tunnels refused, keep-alive
        clients told to reconnect elsewhere; ``shutdown_delay_s`` later, drain: in-flight
        requests finish, agents get GOAWAY and move to the other replicas."""
        self.draining = True
        self.listener.stop_accepting()
        if self.proxy is not None:
            self.proxy.wind_down()
        delay = self.config.shutdown_delay_s
        if delay > 0:
            log.info("shutting down: not ready, draining in %gs", delay)
            await asyncio.sleep(delay)
        self.loop_lag.stop()
        timeout = self.config.limits.drain_timeout_s
        if self.proxy is not None:
            await self.proxy.stop(grace_s=timeout)
        await self.listener.drain(timeout)
        if self.l3 is not None:
            await self.l3.stop()
        if self.backfill is not None:
            await self.backfill.close()
        await self.admin.stop()

    def reload(self, config: GatewayConfig) -> None:
        """Apply a changed config file. The authorised agents take effect at once: a removed
        or changed agent's tunnels are closed (it reconnects under the new rules, or is
        refused); so does ``replica.count`` (told to every agent that asked). Other fields
        need a restart; they are named in the log."""
        if config.replica.count != self.config.replica.count:
            # the Deployment was scaled: agents behind one address are told the new count
            self.listener.announce_replicas(config.replica.count)
            replica = dataclasses.replace(self.config.replica, count=config.replica.count)
            self.config = dataclasses.replace(self.config, replica=replica)
            log.info("config reload: replica count now %d", config.replica.count)
        restart_needed = [
            f.name
            for f in dataclasses.fields(GatewayConfig)
            if f.name != "agents" and getattr(config, f.name) != getattr(self.config, f.name)
        ]
        if restart_needed:
            log.warning("config reload: restart needed for fields=%s", ",".join(restart_needed))
        if config.agents == self.config.agents:
            log.info("config reload: authorised agents unchanged")
            self.config = dataclasses.replace(self.config, agents=config.agents)
            return
        stale = self.registry.update_agents(config.agents)
        self.config = dataclasses.replace(self.config, agents=config.agents)
        for session in stale:
            log.info("config reload: closing tunnel agent=%s (authorisation changed)",
                     session.agent.name)  # fmt: skip
            session.tunnel.close(CloseCode.REPLACED, "authorisation changed by a config reload")
        log.info("config reload: agents=%d closed=%d", len(config.agents), len(stale))
        self.gateway_metrics.reloads.inc()

    # ------------------------------------------------------------ admin
    def _ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.listener.bound is None:
            return False, "tunnel listener not up"
        warmup = self.config.ready_after_s - (time.monotonic() - self._started_mono)
        if warmup > 0:
            return False, f"warming up: agents connecting ({warmup:.0f}s left)"
        return True, ""

    def _api_status(self, _request: AdminRequest) -> AdminResponse:
        scrapes = self.proxy.scrapes if self.proxy is not None else ScrapeLog()
        doc = gateway_status(self.registry, scrapes, started_at=self.started_at, version=version(),
                             refusals=self.listener.refusals)  # fmt: skip
        if self.backfill is not None:  # per site: what its agent backfilled (docs/backfill.md)
            now = self.backfill.clock()
            for row in doc["agents"]:
                status = self.backfill.status.get(row.get("site"))
                row["backfill"] = status.to_json(now) if status is not None else None
        return AdminResponse.json(doc)

    def _status_page(self, _request: AdminRequest) -> AdminResponse:
        return AdminResponse.html(status_page_html())

    def _api_agents(self, _request: AdminRequest) -> AdminResponse:
        body = self.registry.agents_json()
        if self.backfill is not None:
            now = self.backfill.clock()
            for agent in body["agents"]:  # type: ignore[attr-defined]
                status = self.backfill.status.get(agent["agent"])
                agent["backfill"] = status.to_json(now) if status is not None else None
        return AdminResponse.json(body)

    # ------------------------------------------------------------ backfill
    async def _backfill_stream(
        self, session: AgentSession, stream: TunnelStream, node: str, port: int
    ) -> None:
        assert self.backfill is not None
        await self.backfill.handle(session.agent.name, session.agent.may_serve, stream, node, port)

    def _discovery_labels(self, node: str, port: int) -> dict[str, str]:
        """The target labels /api/v1/targets gives ``node`` (http_sd jobs), less __meta_*."""
        for group in self.registry.targets_json(port):
            if group["targets"] == [f"{node}:{port}"]:
                labels = group["labels"]
                assert isinstance(labels, dict)
                return {k: v for k, v in labels.items() if not k.startswith("__")}
        return {}

    def _api_nodes(self, _request: AdminRequest) -> AdminResponse:
        return AdminResponse.json(self.registry.nodes_json())

    def _api_targets(self, request: AdminRequest) -> AdminResponse:
        raw = request.query.get("port", str(defaults.GPU_EXPORTER_PORT))
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            return AdminResponse.text("port must be 1-65535\n", 400)
        # Prometheus asks every refresh_interval (5-60 s): the body (10,000 nodes: over a MB
        # of JSON, tens of ms of the event loop) is written once per change of the registry
        key = (self.registry.generation, int(raw))
        if self._targets is None or self._targets[0] != key:
            self._targets = (key, AdminResponse.json(self.registry.targets_json(int(raw))))
        return self._targets[1]


async def run_gateway(config: GatewayConfig, config_path: str | Path | None = None) -> int:
    """Run until SIGINT/SIGTERM, then drain. With ``config_path``, SIGHUP or a change of the
    file (a Kubernetes ConfigMap update) reloads the authorised agents."""
    app = GatewayApp(config)
    reload: Callable[[], None] | None = None
    if config_path is not None:
        path = Path(config_path)

        def reload() -> None:
            try:
                app.reload(load_gateway_config(path))
            except (ConfigError, KeyError_) as exc:
                log.error("config reload refused, keeping the running config: %s", exc)

    return await run_until_signalled(app, "gateway", reload=reload, watch=config_path)


__all__ = ["GatewayApp", "decode_key", "run_gateway"]
