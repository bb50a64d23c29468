"""State shared by every proxy connection: opener, configuration, metrics, drain flag."""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloud_gateway.backfill.scrapers import ScraperBook
from cloud_gateway.proxy.errors import ErrorKind, ProxyError
from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.proxy.penalty import RefusalPenalty
from cloud_gateway.proxy.stream_pool import StreamPool
from cloud_gateway.status import ScrapeLog
from raven.config.gateway import ProxyConfig
from raven.telemetry.logs import doc_link, fields
from raven.telemetry.logthrottle import LogThrottle
from raven.transport.stream import StreamOpener

log = logging.getLogger("cloud_gateway.proxy")

#: Read size from clients.
READ_BYTES = 65536
#: Largest response head accepted from a target.
MAX_RESPONSE_HEAD_BYTES = 65536
#: Mode label for requests rejected before their target was known.
UNKNOWN_MODE = "unknown"


class Closable(Protocol):
    """An idle client connection, closed at once by a drain."""

    def close(self) -> None: ...


class HasPeer(Protocol):
    """A transport (or a StreamWriter): where its peer is."""

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


@dataclass
class ProxyContext:
    """What connection handlers share."""

    opener: StreamOpener
    config: ProxyConfig
    metrics: ProxyMetrics
    draining: bool = False
    idle: set[Closable] = field(default_factory=set)
    #: requests in flight per client address and per node (entries dropped at zero)
    by_client: dict[str, int] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)
    #: Recent results per node, for the status page.
    scrapes: ScrapeLog = field(default_factory=ScrapeLog)
    #: Client faults are logged at most ``burst`` lines per reason per interval: a client
    #: that retries a refused request in a loop must not turn each refusal into a log line.
    log_throttle: LogThrottle = field(default_factory=lambda: LogThrottle(clock=time.monotonic))
    #: monotonic seconds, for the refusal penalty
    clock: Callable[[], float] = time.monotonic
    #: while backfill is on: who scrapes what (each request names its scraper to the agent)
    scrapers: ScraperBook | None = None
    penalty: RefusalPenalty = field(init=False)
    #: idle streams by target, for the next request to it from any connection
    streams: StreamPool = field(init=False)
    _allowed: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(
        init=False, default_factory=list
    )

    def __post_init__(self) -> None:
        self._allowed = [ipaddress.ip_network(p) for p in self.config.allowed_clients]
        self.penalty = RefusalPenalty(
            max_per_s=self.config.max_refusals_per_client_per_s,
            penalty_s=self.config.refusal_penalty_s,
        )
        self.streams = StreamPool(
            self.config.max_idle_streams,
            self.config.idle_stream_timeout_s,
            self.clock,
            per_target=self.config.max_streams_per_node,
        )
        self.metrics.watch_pool(self.streams)

    def client_allowed(self, host: str) -> bool:
        """Is ``host`` inside proxy.allowed_clients (always, when that list is empty)?"""
        if not self._allowed:
            return True
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self._allowed)

    def penalised(self, client: str) -> bool:
        """Is ``client`` serving a refusal penalty (reset at accept, see RefusalPenalty)?"""
        return self.penalty.penalised(client, self.clock())

    def admit(self, client: str, node: str) -> Admission:
        """Take one in-flight slot of ``client`` and of ``node``, held until the Admission
        is released (or its ``with`` block ends); ProxyError CLIENT_LIMIT (429) or NODE_LIMIT
        (503), both with Retry-After, when either is full."""
        config = self.config
        if self.by_client.get(client, 0) >= config.max_requests_per_client:
            limit = config.max_requests_per_client
            self.penalty.refused(client, self.clock())
            raise ProxyError(ErrorKind.CLIENT_LIMIT, f"{limit} requests in flight from {client}")
        if self.by_node.get(node, 0) >= config.max_streams_per_node:
            limit = config.max_streams_per_node
            raise ProxyError(ErrorKind.NODE_LIMIT, f"{limit} requests in flight to {node}")
        _take(self.by_client, client)
        _take(self.by_node, node)
        return Admission(self, client, node)

    def scrape_timeout(self, header: bytes | None) -> float:
        """The tunnel-leg bound for a request: the Prometheus header, else the default."""
        if header is not None:
            try:
                value = float(header)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and value > 0:
                return min(value, self.config.max_timeout_s)
        return min(self.config.default_timeout_s, self.config.max_timeout_s)

    def record_error(
        self, exc: ProxyError, mode: str, peer: str, node: str = "", code: int | None = None
    ) -> None:
        """Count a failure and log it in one line: client faults at INFO, throttled per
        reason (a summary line counts what was left out); others at WARNING."""
        kind = exc.kind
        self.metrics.error(kind)
        self.scrapes.failed(node, kind.value, kind.status if code is None else code, exc.detail)
        self.metrics.request(mode, kind.status if code is None else code)
        extra = fields(reason=kind.value, status=kind.status, mode=mode, node=node or None,
                       peer=peer, detail=exc.detail or None,
                       doc=doc_link("proxy", kind.value))  # fmt: skip
        if kind.client_fault:
            key = f"proxy error {kind.value}"
            self.log_throttle.log(log, logging.INFO, key, "proxy error", extra=extra)
        else:
            log.log(logging.WARNING, "proxy error", extra=extra)


class Admission:
    """A request's in-flight slots (ProxyContext.admit), given back once: by ``release`` or
    at the end of a ``with`` block, whichever comes first."""

    __slots__ = ("_client", "_ctx", "_node")

    def __init__(self, ctx: ProxyContext, client: str, node: str) -> None:
        self._ctx: ProxyContext | None = ctx
        self._client = client
        self._node = node

    def release(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            _give(ctx.by_client, self._client)
            _give(ctx.by_node, self._node)

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _take(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _give(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def peer_host(transport: HasPeer) -> str:
    """The client's address without the port (the key of per-client limits)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "?"


def peer_name(transport: HasPeer) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "?"
