"""The ``raven_l3_*`` metrics, shared by the gateway's router and the agent's forwarder.

Counted per packet, so counted cheaply: plain integers bumped on the hot path, turned
into Prometheus counters only when the registry is collected (a custom collector, as
client_python recommends for data that already lives elsewhere).

- ``raven_l3_packets_total{direction, agent}``, ``raven_l3_bytes_total{direction, agent}``:
  ``direction`` is ``to_agent`` (cloud -> edge) or ``from_agent`` (edge -> cloud);
- ``raven_l3_drops_total{reason}``: one series per :class:`DropReason`, present from 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from raven.l3.drops import DropReason
from raven.telemetry.promclient import Collector, CollectorRegistry, CounterMetricFamily, Metric

TO_AGENT = "to_agent"
FROM_AGENT = "from_agent"


#: One packet in :attr:`Traffic.total`: packets above bit 64, bytes below (2**64 bytes,
#: 16 EiB, is never reached by one counter).
_ONE_PACKET = 1 << 64
_BYTES_MASK = _ONE_PACKET - 1


class Traffic:
    """Packets and bytes of one (direction, agent) pair, in one integer: counting a
    packet is a single addition on the hot path (split again at scrape time)."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0

    def count(self, size: int) -> None:
        self.total += _ONE_PACKET + size

    @property
    def packets(self) -> int:
        return self.total >> 64

    @property
    def bytes(self) -> int:
        return self.total & _BYTES_MASK


class L3Metrics(Collector):
    """The L3 counters, registered on ``registry`` at construction."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._traffic: dict[tuple[str, str], Traffic] = {}
        self.drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        registry.register(self)

    def traffic(self, direction: str, agent: str) -> Traffic:
        """The counters of one direction and agent (created at 0 on first use)."""
        return self._traffic.setdefault((direction, agent), Traffic())

    def drop(self, reason: DropReason) -> None:
        self.drops[reason] += 1

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        return (
            CounterMetricFamily(
                "raven_l3_packets",
                "IP packets carried through the tunnel, by direction relative to the agent.",
                labels=["direction", "agent"],
            ),
            CounterMetricFamily(
                "raven_l3_bytes",
                "Bytes of IP packets carried through the tunnel, by direction.",
                labels=["direction", "agent"],
            ),
            CounterMetricFamily(
                "raven_l3_drops", "IP packets dropped by the L3 path, by reason.", labels=["reason"]
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        packets, size, drops = self._families()
        for (direction, agent), traffic in sorted(self._traffic.items()):
            packets.add_metric([direction, agent], traffic.packets)
            size.add_metric([direction, agent], traffic.bytes)
        for reason, count in self.drops.items():
            drops.add_metric([reason.value], count)
        return (packets, size, drops)
