"""The ``raven_l3_*`` metrics, shared by the gateway's router and the agent's forwarder."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from raven.l3.drops import DropReason


class L3Metrics:
    """``raven_l3_*`` metrics on one registry (shared by the router and the forwarder)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.packets = Counter(
            "raven_l3_packets",
            "IP packets carried through the tunnel, by direction relative to the agent.",
            ["direction", "agent"],
            registry=registry,
        )
        self.bytes = Counter(
            "raven_l3_bytes",
            "Bytes of IP packets carried through the tunnel, by direction.",
            ["direction", "agent"],
            registry=registry,
        )
        self.drops = Counter(
            "raven_l3_drops",
            "IP packets dropped by the L3 path, by reason.",
            ["reason"],
            registry=registry,
        )
        self._drop_children = {reason: self.drops.labels(reason.value) for reason in DropReason}

    def drop(self, reason: DropReason) -> None:
        self._drop_children[reason].inc()
