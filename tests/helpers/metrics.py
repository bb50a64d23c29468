"""Every metric the project defines, as Prometheus would see it scraped: for the tests that hold
the dashboard, the alert rules and the docs to real metric names and labels."""

from __future__ import annotations

import time

from coredns_hosts.metrics import HostsMetrics
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from cloud_gateway.backfill.receiver import BackfillMetrics as GatewayBackfillMetrics
from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.proxy.metrics import ProxyMetrics
from cloud_gateway.proxy.stream_pool import StreamPool
from edge_agent.backfill.learn import TargetTable
from edge_agent.backfill.metrics import BackfillMetrics as AgentBackfillMetrics
from edge_agent.backfill.store import Totals
from edge_agent.relay import RelayMetrics
from raven.l3.metrics import L3Metrics
from raven.protocol.stats import TunnelStats
from raven.protocol.suites import Suite
from raven.telemetry.loop_lag import LoopLagProbe
from raven.telemetry.metrics import TunnelMetrics
from raven.telemetry.process_metrics import BuildInfoCollector


class IdleTunnel:
    """What the tunnel collector reads of a tunnel (stats, streams, RTT), with no traffic."""

    def __init__(self) -> None:
        self.stats = TunnelStats(datagrams_dropped={"queue_full": 0})
        self.conn = self
        self.suite: Suite | None = Suite.CHACHAPOLY
        self.streams: dict[int, object] = {}
        self.rtt_s = 0.001


def defined_metrics() -> dict[str, tuple[str, set[str]]]:
    """Exposed sample name -> (type, label names) for every metric class of the project."""
    registry = CollectorRegistry()
    TunnelMetrics(registry, peer_label="agent").live.tunnel_up("site-a", IdleTunnel())
    proxy = ProxyMetrics(registry)
    proxy.observe("edge-gpu-1", 0.01)  # custom collectors: a sample each
    proxy.request("http", 200)
    proxy.watch_pool(StreamPool(1, 1.0, time.monotonic))
    L3Metrics(registry).traffic("to_agent", "site-a").count(100)  # a custom collector: a sample
    HostsMetrics(registry)
    GatewayMetrics(registry)
    RelayMetrics(registry)
    GatewayBackfillMetrics(registry)
    table = TargetTable(max_targets=1, forget_after_s=1.0, keep_while_down_s=1.0)
    AgentBackfillMetrics(registry, Totals, table, dict)
    registry.register(BuildInfoCollector())
    LoopLagProbe(registry)
    out: dict[str, tuple[str, set[str]]] = {}
    for collector in list(registry._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            families = [(collector._name, collector._type, set(collector._labelnames))]
        else:  # a custom collector: names, types and labels from what it collects
            families = [
                (f.name, f.type, {k for s in f.samples for k in s.labels})
                for f in collector.collect()
            ]
        for name, kind, labels in families:
            if kind == "counter":
                out[f"{name}_total"] = ("counter", labels)
            elif kind == "histogram":
                out[name] = ("histogram", labels)
                out[f"{name}_bucket"] = ("histogram_bucket", labels | {"le"})
                out[f"{name}_count"] = ("counter", labels)
                out[f"{name}_sum"] = ("counter", labels)
            else:
                out[name] = (kind, labels)
    return out
