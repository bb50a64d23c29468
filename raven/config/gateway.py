"""Cloud gateway configuration (YAML). Every field is documented in docs/configuration.md."""

from __future__ import annotations

import fnmatch
import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from raven.config import defaults
from raven.config.backfill import GatewayBackfillConfig
from raven.config.common import LimitsConfig, LogConfig, TunConfig, check_hostport, parse_prefix
from raven.config.loader import doc, load_config
from raven.keys import KeyError_, decode_key
from raven.protocol.names import MAX_REPLICAS, replica_id_error
from raven.protocol.suites import DEFAULT_SUITE, Suite, suite_by_name
from raven.runtime.cpuflags import cpu_has_aes

#: ``transport_suites`` entry: the default suite, and AES-256-GCM on a CPU with AES instructions.
SUITES_AUTO = "auto"

#: What makes a node pattern a glob rather than an exact name (fnmatch syntax).
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class AuthorisedAgent:
    """One agent key and what it may serve."""

    name: str = doc("A name for the agent (site), used in logs, metrics and the API.")
    public_key: str = doc("The agent's X25519 public key, base64 (from `raven pubkey`).")
    nodes: list[str] = doc(
        "Node names the agent may serve: exact names or globs like 'site-a-*'.",
        default_factory=list,
    )
    prefixes: list[str] = doc(
        "IP prefixes the agent may route over L3 (e.g. 10.20.0.0/16).", default_factory=list
    )

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 63:
            raise ValueError("agent name must be 1-63 characters")
        try:
            decode_key(self.public_key)
        except KeyError_ as exc:
            raise ValueError(
                f"agent {self.name!r}: public_key: {self.public_key[:60]!r}: {exc}; expected "
                "44 base64 characters ending in '=': paste the output of raven pubkey < agent.key"
            ) from None
        for p in self.prefixes:
            parse_prefix(p)

    @property
    def public_key_bytes(self) -> bytes:
        return decode_key(self.public_key)

    def may_serve(self, node: str) -> bool:
        """True if ``node`` matches one of this agent's names or globs."""
        node = node.lower()
        exact, globs = self._names
        return node in exact or any(fnmatch.fnmatchcase(node, pat) for pat in globs)

    @functools.cached_property
    def _names(self) -> tuple[frozenset[str], tuple[str, ...]]:
        """Exact names (a set lookup) and globs (fnmatch, which compiles a regex each)."""
        lowered = [pat.lower() for pat in self.nodes]
        globs = tuple(pat for pat in lowered if _GLOB_CHARS.intersection(pat))
        return frozenset(pat for pat in lowered if pat not in globs), globs


@dataclass(frozen=True)
class TlsListener:
    """A TLS passthrough listener routing by ClientHello SNI to ``<sni>:<target_port>``."""

    listen: str = doc("Address to listen on, host:port.")
    target_port: int = doc("Edge port the connection goes to (e.g. 10250 for the kubelet).")

    def __post_init__(self) -> None:
        check_hostport("listen", self.listen)
        if not 0 < self.target_port < 65536:
            raise ValueError(f"tls listener {self.listen}: target_port {self.target_port}")


@dataclass(frozen=True)
class ProxyConfig:
    """The L7 proxy listeners Prometheus talks to."""

    http_listen: str = doc(
        "HTTP proxy listener (DNS, forward-proxy, CONNECT and path modes).",
        default=f"0.0.0.0:{defaults.HTTP_PROXY_PORT}",
    )
    tls_listeners: list[TlsListener] = doc(
        "TLS passthrough listeners routed by SNI.",
        default_factory=lambda: [
            TlsListener(
                listen=f"0.0.0.0:{defaults.TLS_PROXY_PORT}", target_port=defaults.KUBELET_PORT
            )
        ],
    )
    default_timeout_s: float = doc(
        "Bound on a request's tunnel leg when the client sends no"
        " X-Prometheus-Scrape-Timeout-Seconds (curl, other clients); at most `max_timeout_s`.",
        default=30.0,
    )
    header_timeout_s: float = doc(
        "A client must send its whole request head within this (slowloris bound).", default=10.0
    )
    max_header_bytes: int = doc("Largest request head; larger gets 431.", default=16384)
    idle_timeout_s: float = doc("Keep-alive connections idle this long are closed.", default=120.0)
    max_connections: int = doc(
        "Concurrent client connections; beyond it new ones wait in the accept queue.", default=4096
    )
    max_timeout_s: float = doc(
        "Cap on every request's tunnel leg: the largest X-Prometheus-Scrape-Timeout-Seconds"
        " honoured (a client asking for more gets this), and the bound of requests without"
        " that header too: a large answer to a header-less client that takes longer is cut.",
        default=300.0,
    )
    max_requests_per_client: int = doc(
        "Requests (and CONNECT tunnels) in flight from one client address; beyond it: 429 with "
        "Retry-After. One Prometheus is one address: scraping 10,000 targets every 15 s it has "
        "about 670 scrapes/s x their duration in flight (~65 at 100 ms, ~670 at 1 s).",
        default=1024,
    )
    allowed_clients: list[str] = doc(
        "Client address prefixes (CIDR) the proxy listeners serve; others are closed at "
        "accept (counted, one log line). Empty: every client.",
        default_factory=list,
    )
    max_refusals_per_client_per_s: int = doc(
        "A client refused with 429 more often than this within one second (it retries at once, "
        "ignoring Retry-After) has its new connections reset at accept, before a byte is read, "
        "for refusal_penalty_s (counted as client_penalised). 0: no penalty.",
        default=50,
    )
    refusal_penalty_s: float = doc(
        "How long a client over max_refusals_per_client_per_s has its connections reset.",
        default=1.0,
    )
    max_streams_per_node: int = doc(
        "Requests (and CONNECT tunnels) in flight to one node; beyond it: 503 with Retry-After "
        "(no client can take all of a tunnel's streams).",
        default=64,
    )
    max_idle_streams: int = doc(
        "Idle tunnel streams kept after a complete response, each holding its agent's "
        "connection to the target, for the next request to that node:port from any client "
        "(Prometheus spreads its scrapes over its proxy connections). Size it to the targets "
        "scraped through this gateway; when full, further streams end after their response. "
        "A tunnel lends at most half its stream slots. 0: every request opens a stream.",
        default=16384,
    )
    idle_stream_timeout_s: float = doc(
        "An idle kept stream older than this ends (its agent closes the target connection); "
        "longer than the scrape interval, so each scrape finds its target's connection.",
        default=90.0,
    )

    def __post_init__(self) -> None:
        check_hostport("http_listen", self.http_listen)
        if self.max_idle_streams < 0 or self.idle_stream_timeout_s <= 0:
            raise ValueError("max_idle_streams must be >= 0 and idle_stream_timeout_s > 0")
        for prefix in self.allowed_clients:
            parse_prefix(prefix)
        if self.max_refusals_per_client_per_s < 0 or self.refusal_penalty_s < 0:
            raise ValueError("max_refusals_per_client_per_s and refusal_penalty_s must be >= 0")
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ValueError(
                f"default_timeout_s ({self.default_timeout_s:g}) must be above 0 and at most "
                f"max_timeout_s ({self.max_timeout_s:g}), which caps every request"
            )


@dataclass(frozen=True)
class WebSocketConfig:
    """The tunnel inside WebSocket, for agents behind TLS-terminating HTTP load balancers
    and Ingresses (docs/networks.md, "TLS-terminating load balancers")."""

    listen: str | None = doc(
        "Where agents' WebSocket upgrades arrive (plain HTTP behind an Ingress that terminates"
        " TLS, or TLS here with `tls_cert_file`), e.g. `0.0.0.0:10263`. Unset: off. The raw"
        " tunnel port (`tunnel_listen`) keeps serving alongside.",
        default=None,
    )
    path: str = doc("The URL path agents' `wss://host/path` names.", default="/raven/tunnel")
    tls_cert_file: str | None = doc(
        "Serve TLS on this port with this certificate chain (PEM); unset: plain HTTP (TLS"
        " terminated by the load balancer).",
        default=None,
    )
    tls_key_file: str | None = doc("The certificate's private key (PEM).", default=None)
    trusted_proxies: list[str] = doc(
        "Prefixes of the load balancers in front (e.g. the Ingress controller's pod CIDR):"
        " from these the agent's address is taken from the last `X-Forwarded-For` entry, so"
        " per-address handshake rate limits apply to agents, not to the load balancer.",
        default_factory=list,
    )

    def __post_init__(self) -> None:
        if self.listen is not None:
            check_hostport("websocket.listen", self.listen)
        if not self.path.startswith("/") or any(c in self.path for c in " \r\n?#"):
            raise ValueError(
                f"websocket.path: {self.path[:80]!r} must be a path like /raven/tunnel"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("websocket: set tls_cert_file and tls_key_file together")
        for prefix in self.trusted_proxies:
            parse_prefix(prefix)


@dataclass(frozen=True)
class ReplicaConfig:
    """How this replica presents itself to agents behind one load-balanced address
    (docs/networks.md, "One address for every replica")."""

    id: str | None = doc(
        "This replica's id, told to every agent after its handshake: an agent given one"
        " load-balanced address tells replicas apart by it. Unset: `$POD_NAME`, else the host"
        " name and process id.",
        default=None,
    )
    count: int = doc(
        "How many gateway replicas serve agents (the Deployment's `replicas`): an agent that"
        " reached this replica through a shared address keeps dialling it until it holds this"
        " many distinct replicas. 1: a single gateway.",
        default=1,
    )

    def __post_init__(self) -> None:
        if self.id is not None and (error := replica_id_error(self.id)) is not None:
            raise ValueError(f"replica.id: {self.id[:80]!r} {error}")
        if not 0 < self.count <= MAX_REPLICAS:
            raise ValueError(f"replica.count: {self.count} must be 1-{MAX_REPLICAS}")

    def resolved_id(self) -> str:
        """The id told to agents: ``id``, else ``$POD_NAME``, else ``hostname-pid``."""
        if self.id is not None:
            return self.id
        pod = os.environ.get("POD_NAME", "")
        if pod and replica_id_error(pod) is None:
            return pod
        host = "".join(c if replica_id_error(c) is None else "-" for c in socket.gethostname())
        return f"{host[:200] or 'gateway'}-{os.getpid()}"


@dataclass(frozen=True)
class GatewayConfig:
    """The cloud gateway."""

    private_key_file: str = doc("File holding the gateway's private key (mode 0600).")
    psk_file: str | None = doc(
        "Optional file with a base64 32-byte pre-shared key (all agents).", default=None
    )
    tunnel_listen: str = doc("Where agents connect.", default=f"0.0.0.0:{defaults.TUNNEL_PORT}")
    transport_suites: list[str] = doc(
        "Tunnel transport suites agents may use: `chacha20-poly1305` (every agent starts with"
        " it), `aes-256-gcm` (agents with `cipher: auto` use it when their CPU has AES"
        " instructions too), or `auto`: ChaCha20-Poly1305, and AES-256-GCM when this CPU has"
        " AES instructions (the `aes` flag of /proc/cpuinfo). Message 2 of each handshake"
        " tells the agent this list.",
        default_factory=lambda: [SUITES_AUTO],
    )
    admin_listen: str = doc(
        "Admin API: /metrics, /healthz, /readyz, /api/v1/* (loopback by default; 0.0.0.0:10265 "
        "for probes and scrapes from elsewhere, with admin_token_file).",
        default=f"127.0.0.1:{defaults.GATEWAY_ADMIN_PORT}",
    )
    admin_token_file: str | None = doc(
        "File (mode 0600) with the bearer token every admin route other than /metrics, "
        "/healthz and /readyz requires: the agents and nodes API, http_sd targets, the status "
        "page (docs/security.md).",
        default=None,
    )
    agents: list[AuthorisedAgent] = doc("The authorised agents.", default_factory=list)
    node_ttl_s: float = doc(
        "A node no agent serves any more stays known (503 no_agent rather than 404) this "
        "long; then it is forgotten with its per-node metric series.",
        default=3600.0,
    )
    proxy: ProxyConfig = doc("L7 proxy listeners.", default_factory=ProxyConfig)
    limits: LimitsConfig = doc("Tunnel limits.", default_factory=LimitsConfig)
    handshake_rate_per_s: float = doc(
        "Handshakes accepted per second per source address.", default=20.0
    )
    handshake_burst: int = doc("Burst of handshakes per source address.", default=40)
    max_half_open_handshakes: int = doc(
        "Tunnel connections whose handshake is not complete (keys not confirmed), over all "
        "sources; beyond it new connections are closed at accept (handshakes result "
        "`overloaded`) until some complete or time out.",
        default=1024,
    )
    handshake_load_threshold: int = doc(
        "Handshakes in progress (tunnel connections without confirmed keys, over all "
        "sources) above which the gateway is under load: it then answers an initiation with "
        "a cookie reply instead of a Diffie-Hellman unless its mac2 proves a cookie for its "
        "address (docs/protocol-handshake.md). 0: always under load.",
        default=64,
    )
    tun: TunConfig = doc("L3 forwarding (off unless enabled).", default_factory=TunConfig)
    backfill: GatewayBackfillConfig = doc(
        "Write agents' backfill to Prometheus (docs/backfill.md).",
        default_factory=GatewayBackfillConfig,
    )
    websocket: WebSocketConfig = doc(
        "The tunnel inside WebSocket (`wss://`), beside the raw TCP port.",
        default_factory=WebSocketConfig,
    )
    replica: ReplicaConfig = doc(
        "This replica among several behind one address.", default_factory=ReplicaConfig
    )
    shutdown_delay_s: float = doc(
        "On SIGTERM, how long the replica stays up not-ready (/readyz 503, new tunnels refused,"
        " keep-alive clients told `Connection: close`) before it drains, so that the load"
        " balancer stops sending it new scrapes first. Longer than the readiness probe's"
        " period times its failure threshold plus the endpoints' propagation.",
        default=0.0,
    )
    ready_after_s: float = doc(
        "/readyz fails for this long after the start, so that agents (which reach a new"
        " replica through the tunnel Service while it is not ready) connect before scrapes"
        " are sent to it. 0: ready as soon as the listeners are up.",
        default=0.0,
    )
    log: LogConfig = doc("Logging.", default_factory=LogConfig)

    def __post_init__(self) -> None:
        check_hostport("tunnel_listen", self.tunnel_listen)
        if self.shutdown_delay_s < 0 or self.ready_after_s < 0:
            raise ValueError("shutdown_delay_s and ready_after_s must be >= 0")
        check_hostport("admin_listen", self.admin_listen)
        if self.handshake_load_threshold < 0:
            raise ValueError("handshake_load_threshold must be 0 (always under load) or more")
        try:
            suites = self.accepted_suites()
        except ValueError as exc:
            raise ValueError(f"transport_suites: {exc}") from None
        if DEFAULT_SUITE not in suites:
            raise ValueError(
                f"transport_suites: must list {DEFAULT_SUITE.label} or {SUITES_AUTO} (every "
                "agent starts with it)"
            )
        keys: set[str] = set()
        names: set[str] = set()
        for a in self.agents:
            if a.public_key in keys:
                raise ValueError(
                    f"agents: {a.name!r} has a public key listed twice; each agent needs its own "
                    "key (raven keygen on its host)"
                )
            if a.name in names:
                raise ValueError(
                    f"agents: the name {a.name!r} is listed twice; give each site its own name"
                )
            keys.add(a.public_key)
            names.add(a.name)

    def accepted_suites(self, cpuinfo: str = "/proc/cpuinfo") -> tuple[Suite, ...]:
        """The transport suites the gateway accepts (``transport_suites``), no repeats."""
        suites: list[Suite] = []
        for name in self.transport_suites:
            if name != SUITES_AUTO:
                suites.append(suite_by_name(name))
                continue
            suites.append(DEFAULT_SUITE)
            if cpu_has_aes(cpuinfo):
                suites.append(Suite.AESGCM)
        return tuple(dict.fromkeys(suites))


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Load and validate a gateway config file; raises ConfigError naming the problem."""
    return load_config(GatewayConfig, path)
