"""The L7 proxy's metrics, on a registry passed in (never the global one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.node_latency import NodeLatency
from raven.telemetry.promclient import (
    Collector,
    CollectorRegistry,
    Counter,
    CounterMetricFamily,
    Gauge,
    GaugeMetricFamily,
    Metric,
)

if TYPE_CHECKING:
    from cloud_gateway.proxy.stream_pool import StreamPool

#: Scrape latency buckets (seconds): loopback sub-millisecond up to long scrape timeouts.
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class ProxyMetrics:
    """Counters and histograms of the proxy listeners. What moves on every request (requests
    by mode and status, response bytes) is a plain count, exported when the registry is
    collected (no client_python child, lock or check per request); children of the rest are
    cached per label value."""

    def __init__(self, registry: CollectorRegistry) -> None:
        #: raven_proxy_requests_total{mode, code}
        self.requests: dict[tuple[str, int], int] = {}
        #: raven_proxy_response_bytes_total
        self.response_bytes = 0
        registry.register(_RequestCollector(self))
        self.errors = Counter(
            "raven_proxy_errors_total",
            "Proxied requests that failed, by reason",
            ["reason"],
            registry=registry,
        )
        #: raven_proxy_request_duration_seconds{node}
        self.latency = NodeLatency(registry, DURATION_BUCKETS)
        self.active_connections = Gauge(
            "raven_proxy_active_connections",
            "Client connections open on the proxy listeners",
            registry=registry,
        )
        self.unused_closed = Counter(
            "raven_proxy_unused_connections_closed_total",
            "Client connections closed at header_timeout_s without a byte received (an HTTP "
            "client's spare pooled connection, or a scan): a FIN, no 408",
            registry=registry,
        )
        self._registry = registry
        self._errors: dict[ErrorKind, Counter] = {}

    def watch_pool(self, pool: StreamPool) -> None:
        """Export the pool's size and counts, read when scraped (nothing per request)."""
        self._registry.register(_PoolCollector(pool))

    def request(self, mode: str, code: int) -> None:
        """One request (or tunnelled connection) answered with ``code``."""
        key = (mode, code)
        self.requests[key] = self.requests.get(key, 0) + 1

    def error(self, kind: ErrorKind) -> None:
        child = self._errors.get(kind)
        if child is None:
            child = self._errors[kind] = self.errors.labels(kind.value)
        child.inc()

    def forget_nodes(self, nodes: list[str]) -> None:
        """Drop the per-node series of nodes the registry forgot (bounded cardinality)."""
        self.latency.forget(nodes)

    def observe(self, node: str, seconds: float) -> None:
        self.latency.observe(node, seconds)


class _RequestCollector(Collector):
    """``raven_proxy_requests_total{mode, code}`` and ``raven_proxy_response_bytes_total``."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        requests = CounterMetricFamily(
            "raven_proxy_requests",
            "Requests and tunnelled connections handled by the proxy listeners, by mode and status",
            labels=["mode", "code"],
        )
        for (mode, code), value in sorted(list(metrics.requests.items())):  # a copy: /metrics
            requests.add_metric([mode, str(code)], value)  # is served off the event loop
        yield requests
        yield CounterMetricFamily(
            "raven_proxy_response_bytes",
            "Bytes relayed from edge targets to clients (heads and bodies)",
            value=metrics.response_bytes,
        )


class _PoolCollector(Collector):
    """``raven_proxy_idle_streams`` and ``raven_proxy_stream_reuse_total{result}``."""

    def __init__(self, pool: StreamPool) -> None:
        self._pool = pool

    def collect(self) -> Iterable[Metric]:
        pool = self._pool
        yield GaugeMetricFamily(
            "raven_proxy_idle_streams",
            "Idle tunnel streams kept for the next request to their target",
            value=len(pool),
        )
        reuse = CounterMetricFamily(
            "raven_proxy_stream_reuse",
            "Requests without a body by what served them: hit (a kept stream to their target), "
            "miss (none kept: a new stream), stale (kept ones whose target had closed: ended)",
            labels=["result"],
        )
        for result, value in (("hit", pool.hits), ("miss", pool.misses), ("stale", pool.stale)):
            reuse.add_metric([result], value)
        yield reuse
