"""Edge agent configuration (YAML). Every field is documented in docs/configuration.md."""

from __future__ import annotations

import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raven.config import defaults
from raven.config.backfill import AgentBackfillConfig
from raven.config.common import LimitsConfig, LogConfig, TunConfig, check_hostport, parse_prefix
from raven.config.loader import doc, load_config
from raven.keys import KeyError_, decode_key
from raven.protocol.names import node_name_error
from raven.protocol.suites import Suite, suite_by_name
from raven.runtime.cpuflags import cpu_has_aes
from raven.transport.proxy_env import parse_proxy_url

if TYPE_CHECKING:  # asyncio is imported only once the agent knows whether it needs ssl
    from raven.transport.gateway_connect import GatewayTransport

#: ``cipher`` values besides the suite names.
CIPHER_AUTO = "auto"
#: ``event_loop`` values (raven_cli.main.run_async).
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class KubernetesNodeSource:
    """Serve the Kubernetes Nodes matching a label selector (address = InternalIP)."""

    enabled: bool = doc("Take the node table from Kubernetes instead of `nodes`.", default=False)
    label_selector: str = doc(
        "Label selector of the site's nodes.", default="openyurt.io/is-edge-worker=true"
    )
    kubeconfig: str | None = doc("Kubeconfig path; in-cluster config when unset.", default=None)
    services: list[str] = doc(
        "Services (`namespace/name`) whose endpoints answer for `node:port` when nothing "
        "listens on the node's own address: a scrape of `node:9400` reaches the Service's "
        "ready endpoint on that node (EndpointSlices by `nodeName`), e.g. upstream "
        "dcgm-exporter's ClusterIP Service. Needs API credentials (`kubeconfig` or in-cluster), "
        "also when `enabled` is false.",
        default_factory=list,
    )

    def __post_init__(self) -> None:
        for svc in self.services:
            namespace, sep, name = svc.partition("/")
            if not sep or not namespace or not name or "/" in name:
                raise ValueError(f"services: {svc[:80]!r} is not namespace/name")


@dataclass(frozen=True)
class ReconnectConfig:
    min_backoff_s: float = doc(
        "First reconnect delay bound (exponential backoff, full jitter).", default=0.5
    )
    max_backoff_s: float = doc("Largest reconnect delay.", default=30.0)
    probe_s: float = doc(
        "After a tunnel was lost (or from the agent's start), while the gateway stays"
        " unreachable (connects time out, no route): retries at most this far apart (full"
        " jitter) and each TCP connect gives up after twice this, so scrapes resume within"
        " seconds of the path returning. A gateway that answers (refused, handshake failed)"
        " gets the exponential backoff instead.",
        default=1.0,
    )
    probe_for_s: float = doc(
        "How long after the loss (or the start) fast probing lasts before the exponential backoff.",
        default=900.0,
    )

    replica_retry_max_s: float = doc(
        "One gateway address for several replicas (a load balancer): while the agent holds"
        " fewer replicas than they announce, it dials again at most this far apart (full"
        " jitter), closing each tunnel that reaches a replica it already holds.",
        default=5.0,
    )
    replica_search_attempts: int = doc(
        "Dials in a row that reach replicas already held (at least 6 per replica announced),"
        " after which they are spaced by `max_backoff_s` instead (a warning says so: session"
        " affinity on the load balancer would do this).",
        default=30,
    )

    def __post_init__(self) -> None:
        if self.replica_retry_max_s <= 0 or self.replica_search_attempts < 1:
            raise ValueError(
                "reconnect: need replica_retry_max_s > 0 and replica_search_attempts >= 1"
            )
        if not 0 < self.min_backoff_s <= self.max_backoff_s:
            raise ValueError("reconnect: need 0 < min_backoff_s <= max_backoff_s")
        if self.probe_s <= 0 or self.probe_for_s < 0:
            raise ValueError("reconnect: need probe_s > 0 and probe_for_s >= 0")


@dataclass(frozen=True)
class GatewayTlsConfig:
    """TLS to the load balancer or Ingress in front of the gateway (``wss://`` only)."""

    ca_file: str | None = doc(
        "CA bundle (PEM) that signs the load balancer's certificate; unset: the system's CAs.",
        default=None,
    )
    server_name: str | None = doc(
        "Name sent in SNI and checked against the certificate; unset: the `gateway` URL's host.",
        default=None,
    )


@dataclass(frozen=True)
class ProxyConfig:
    """The HTTP forward proxy the tunnel goes out through (docs/networks.md, "Forward
    proxies"). Unset fields fall back to the environment (`https_proxy`/`HTTPS_PROXY`,
    `no_proxy`/`NO_PROXY`)."""

    url: str | None = doc(
        "`http://[user:password@]host:port` or `https://...` (TLS to the proxy itself);"
        " `direct` ignores any proxy in the environment. Unset: `https_proxy`/`HTTPS_PROXY`.",
        default=None,
    )
    no_proxy: list[str] | None = doc(
        "Destinations reached directly: host names (and every name under them), `.suffix`,"
        " IP addresses, CIDRs, `*`; any may end in `:port`. Unset: `no_proxy`/`NO_PROXY`.",
        default=None,
    )
    credentials_file: str | None = doc(
        "File (mode 0600) holding `user:password` for Basic proxy authentication; takes"
        " precedence over credentials in the URL. Never logged.",
        default=None,
    )
    ca_file: str | None = doc(
        "CA bundle (PEM) for an `https://` proxy's certificate; unset: the system's CAs.",
        default=None,
    )

    def __post_init__(self) -> None:
        if self.url is not None and self.url.strip().lower() != "direct":
            try:
                parse_proxy_url(self.url)
            except ValueError as exc:
                raise ValueError(f"proxy.url: {exc}") from None


@dataclass(frozen=True)
class GpuExporterConfig:
    """The built-in dcgm-exporter-compatible GPU exporter, run inside the agent."""

    enabled: bool = doc("Run the exporter in the agent process.", default=False)
    listen: str = doc("Its listen address.", default=f"0.0.0.0:{defaults.GPU_EXPORTER_PORT}")
    simulate: int = doc("Simulate this many GPUs instead of NVML (0 = real GPUs).", default=0)
    model: str = doc("Simulated GPU model.", default="NVIDIA H100 80GB HBM3")
    seed: int = doc("Seed of the simulation.", default=1)
    hostname: str | None = doc("Hostname label; the node name when unset.", default=None)
    sharing: str = doc(
        "How simulated GPUs are shared: exclusive, time-slicing, mig or ack-share.",
        default="exclusive",
    )
    interval_s: float = doc("Collection interval (seconds).", default=30.0)
    kubernetes: bool = doc(
        "Map GPUs and processes to pods (kubelet pod-resources socket, /proc cgroups, API server).",
        default=False,
    )
    pod_resources_socket: str = doc(
        "The kubelet's pod-resources socket.",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
    )
    label_mode: str = doc(
        "upstream (dcgm-exporter's labels) or ack (NodeName, NamespaceName, PodName...).",
        default="upstream",
    )
    per_process: bool = doc(
        "One DCGM_CUSTOM_PROCESS_* series per process instead of per container.", default=False
    )


@dataclass(frozen=True)
class AgentConfig:
    """The edge agent."""

    private_key_file: str = doc("File holding the agent's private key (mode 0600).")
    gateway: str = doc(
        "Gateway `host:port` (the raw tunnel over TCP; a DNS name with several addresses, a"
        " headless Service, gets one tunnel per address; one address in front of several"
        " replicas, a load balancer, gets one per replica) or `wss://host[:port]/path` (the"
        " tunnel inside WebSocket over TLS, through TLS-terminating load balancers and"
        " Ingresses)."
    )
    gateway_public_key: str = doc("The gateway's public key, base64.")
    name: str = doc(
        "A name for this agent (logs only; the gateway names agents by key).", default="edge-agent"
    )
    psk_file: str | None = doc("Optional file with the base64 pre-shared key.", default=None)
    cipher: str = doc(
        "Tunnel transport suite: `auto` (AES-256-GCM when this CPU has AES instructions, the"
        " `aes` flag of /proc/cpuinfo, and the gateway accepts it; else ChaCha20-Poly1305),"
        " `chacha20-poly1305` or `aes-256-gcm` (only that one: a gateway that does not"
        " accept it refuses the handshake, `unsupported_suite`).",
        default=CIPHER_AUTO,
    )
    nodes: dict[str, str] = doc(
        "Nodes served: name -> address (IP or resolvable name).", default_factory=dict
    )
    kubernetes: KubernetesNodeSource = doc(
        "Node table from Kubernetes.", default_factory=KubernetesNodeSource
    )
    allowed_ports: list[int] = doc(
        "Ports the agent will connect to on served nodes.",
        default_factory=lambda: list(defaults.AGENT_ALLOWED_PORTS),
    )
    subnets: list[str] = doc("IP prefixes this site routes over L3.", default_factory=list)
    connect_timeout_s: float = doc("Timeout connecting to a target.", default=5.0)
    resolve_interval_s: float = doc("How often the gateway name is re-resolved.", default=30.0)
    dns_server: str | None = doc(
        "Resolve the gateway name at this DNS server (ip[:port]) instead of /etc/resolv.conf.",
        default=None,
    )
    admin_listen: str = doc(
        "Admin API: /metrics, /healthz, /readyz (loopback by default; 0.0.0.0:10266 to be "
        "scraped from elsewhere).",
        default=f"127.0.0.1:{defaults.AGENT_ADMIN_PORT}",
    )
    admin_token_file: str | None = doc(
        "File (mode 0600) with the bearer token every admin route other than /metrics, "
        "/healthz and /readyz requires (docs/security.md).",
        default=None,
    )
    tls: GatewayTlsConfig = doc(
        "TLS to the load balancer (`wss://` only).", default_factory=GatewayTlsConfig
    )
    proxy: ProxyConfig = doc("HTTP forward proxy for the tunnel.", default_factory=ProxyConfig)
    reconnect: ReconnectConfig = doc("Reconnect backoff.", default_factory=ReconnectConfig)
    limits: LimitsConfig = doc("Tunnel limits.", default_factory=LimitsConfig)
    tun: TunConfig = doc("L3 forwarding (off unless enabled).", default_factory=TunConfig)
    gpu_exporter: GpuExporterConfig = doc(
        "Built-in GPU exporter.", default_factory=GpuExporterConfig
    )
    backfill: AgentBackfillConfig = doc(
        "Scrape locally during outages and backfill Prometheus (docs/backfill.md).",
        default_factory=AgentBackfillConfig,
    )
    log: LogConfig = doc("Logging.", default_factory=LogConfig)
    event_loop: str = doc(
        "The asyncio event loop: `asyncio` (the standard library's), `uvloop` (libuv: ~2.5 MiB"
        " more RSS, and ~4.5 MiB for the `ssl` module it imports; the same CPU per scrape"
        " within noise in bench/bench_l7.py, less per L3 packet in bench/bench_l3.py) or `auto`"
        " (uvloop for an agent that forwards L3 packets, `tun.enabled`, where it is installed;"
        " the standard library's otherwise). docs/operations.md compares them.",
        default="auto",
    )

    @property
    def loop(self) -> str:
        """The ``event_loop`` this agent runs on (raven_cli.main.run_async): ``auto`` resolved."""
        if self.event_loop == "auto" and not self.tun.enabled:
            return "asyncio"
        return self.event_loop

    @property
    def needs_ssl(self) -> bool:
        """Whether this agent may speak TLS or load a library that imports ``ssl`` outright:
        the Kubernetes API client (node source, Services, the GPU exporter's pod mapping)
        and uvloop. Without them the agent runs without ``ssl`` (`raven.runtime.without_ssl`)."""
        k8s = self.kubernetes
        uses_api = k8s.enabled or bool(k8s.services) or self.gpu_exporter.kubernetes
        tls = self.gateway.startswith("wss://") or self._https_proxy()
        return uses_api or tls or self.loop != "asyncio"

    def _https_proxy(self) -> bool:
        url = self.proxy.url
        if url is None:
            url = os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY") or ""
        return url.strip().lower().startswith("https://")

    @property
    def gateway_endpoint(self) -> tuple[str, int, str | None]:
        """(host, port, WebSocket path or None for the raw tunnel) of ``gateway``."""
        return parse_gateway(self.gateway)

    def gateway_transport(self, environ: Mapping[str, str]) -> GatewayTransport:
        """How the tunnel reaches the gateway: TLS and WebSocket, forward proxy."""
        from raven.transport.gateway_connect import GatewayTransport

        host, _, path = self.gateway_endpoint
        proxy = self.proxy
        return GatewayTransport(
            websocket_path=path,
            websocket_tls=not self.gateway.startswith("ws://"),
            host=host,
            tls_ca_file=self.tls.ca_file,
            tls_server_name=self.tls.server_name,
            proxy_url=proxy.url,
            no_proxy=",".join(proxy.no_proxy) if proxy.no_proxy is not None else None,
            proxy_credentials_file=proxy.credentials_file,
            proxy_ca_file=proxy.ca_file,
            environ=dict(environ),
        )

    def __post_init__(self) -> None:
        parse_gateway(self.gateway)
        if self.event_loop not in EVENT_LOOPS:
            choices = ", ".join(EVENT_LOOPS)
            raise ValueError(f"event_loop: {self.event_loop!r} is not one of {choices}")
        check_hostport("admin_listen", self.admin_listen)
        try:
            decode_key(self.gateway_public_key)
        except KeyError_ as exc:
            raise ValueError(
                f"gateway_public_key: {self.gateway_public_key[:60]!r}: {exc}; expected the "
                "gateway's public key, 44 base64 characters ending in '=' (raven pubkey < "
                "gateway.key)"
            ) from None
        for node, addr in self.nodes.items():
            if (error := node_name_error(node)) is not None:
                raise ValueError(f"nodes: {node[:80]!r} is not a valid node name: {error}")
            if not addr:
                raise ValueError(f"nodes.{node}: empty address")
        for port in self.allowed_ports:
            if not 0 < port < 65536:
                raise ValueError(f"allowed_ports: {port} is not a port")
        for s in self.subnets:
            parse_prefix(s)
        if self.connect_timeout_s <= 0 or self.resolve_interval_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.dns_server:
            host, _ = check_hostport("dns_server", self.dns_server, default_port=53)
            ipaddress.ip_address(host)
        if self.cipher != CIPHER_AUTO:
            try:
                suite_by_name(self.cipher)
            except ValueError as exc:
                raise ValueError(f"cipher: {exc} or {CIPHER_AUTO}") from None

    def transport_suites(self, cpuinfo: str = "/proc/cpuinfo") -> tuple[Suite, ...]:
        """The suites this agent offers, in order of preference (``cipher``)."""
        if self.cipher != CIPHER_AUTO:
            return (suite_by_name(self.cipher),)
        return auto_suites(cpuinfo)


def auto_suites(cpuinfo: str = "/proc/cpuinfo") -> tuple[Suite, ...]:
    """What ``cipher: auto`` offers: AES-256-GCM first where the CPU has AES instructions."""
    if cpu_has_aes(cpuinfo):
        return (Suite.AESGCM, Suite.CHACHAPOLY)
    return (Suite.CHACHAPOLY,)


def parse_gateway(value: str) -> tuple[str, int, str | None]:
    """``host:port`` (raw tunnel), ``wss://host[:port]/path`` (WebSocket over TLS, port 443
    by default) or ``ws://host[:port]/path`` (WebSocket without TLS, port 80: for an HTTP
    load balancer inside a trusted network; the tunnel stays Noise-encrypted inside):
    (host, port, WebSocket URL path or None). ValueError showing the expected forms."""
    if "://" not in value:
        host, port = check_hostport("gateway", value)
        return host, port, None
    parts = urllib.parse.urlsplit(value)
    forms = "write host:port or wss://host[:port]/path"
    if parts.scheme not in ("wss", "ws"):
        raise ValueError(f"gateway: {value[:80]!r}: only wss:// and ws:// URLs; {forms}")
    try:
        port = parts.port or (443 if parts.scheme == "wss" else 80)
    except ValueError:
        raise ValueError(f"gateway: {value[:80]!r}: bad port; {forms}") from None
    if not parts.hostname or parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"gateway: {value[:80]!r}: {forms}")
    return parts.hostname, port, parts.path or "/"


def load_agent_config(path: str | Path) -> AgentConfig:
    """Load and validate an agent config file; raises ConfigError naming the problem."""
    return load_config(AgentConfig, path)
