"""Prometheus metrics of the hosts generator, on a registry passed in (never the global one)."""

from __future__ import annotations

from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge


class HostsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.writes = Counter(
            "raven_hosts_writes_total",
            "Hosts text written to a sink because it changed.",
            ["sink"],
            registry=registry,
        )
        self.unchanged = Counter(
            "raven_hosts_writes_skipped_total",
            "Syncs where a sink already held identical text, so nothing was written.",
            ["sink"],
            registry=registry,
        )
        self.last_success = Gauge(
            "raven_hosts_last_success_timestamp_seconds",
            "Unix time of the last sync that reached every sink.",
            registry=registry,
        )
        self.entries = Gauge(
            "raven_hosts_entries",
            "Names in the last rendered hosts text.",
            registry=registry,
        )
        self.invalid_names = Gauge(
            "raven_hosts_invalid_names",
            "Names skipped in the last render because they are not valid DNS names.",
            registry=registry,
        )
        self.errors = Counter(
            "raven_hosts_errors_total",
            "Errors by stage (source, sink) and reason.",
            ["stage", "reason"],
            registry=registry,
        )
        self.relists = Counter(
            "raven_hosts_relists_total",
            "Full lists of a watched Kubernetes resource (start, 410 Gone, errors).",
            ["resource"],
            registry=registry,
        )
        self.sync_seconds = Gauge(
            "raven_hosts_last_sync_duration_seconds",
            "Time taken by the last render and write.",
            registry=registry,
        )
