"""``raven_proxy_request_duration_seconds{node}``: the scrape latency histogram of every node.

A gateway in front of 10,000 nodes has 190,000 series here (16 buckets, +Inf, sum and count
per node). prometheus-client's Histogram keeps 18 locked values and a child object per node
and writes its text through one Sample object per series: 1.4 s of the gateway's event loop
per scrape of its /metrics, a stall every site's scrapes waited through. Here a node is one
small object (bucket counts and a sum, bumped in place); a collection snapshots them (a few
ms for 10,000 nodes) into a :class:`~raven.telemetry.promclient.RenderedFamily`, whose text is
a few string operations per line and is written off the event loop
(:func:`~raven.telemetry.promclient.generate_text_off_loop`). The text is what
prometheus-client wrote.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from raven.telemetry.promclient import (
    Collector,
    CollectorRegistry,
    Metric,
    RenderedFamily,
    Sample,
    escape_label_value,
    floatToGoString,
)

__all__ = ["NodeLatency"]

NAME = "raven_proxy_request_duration_seconds"
HELP = "Time from a request's head to the last byte of its response (scrape latency), by node"


class _Node:
    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0


Snapshot = list[tuple[str, tuple[int, ...], float]]


class NodeLatency(Collector):
    """Per-node latency histograms (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._nodes: dict[str, _Node] = {}
        registry.register(self)

    def __len__(self) -> int:
        return len(self._nodes)

    def observe(self, node: str, seconds: float) -> None:
        entry = self._nodes.get(node)
        if entry is None:
            entry = self._nodes[node] = _Node(len(self.bounds))
        entry.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        entry.sum += seconds

    def forget(self, nodes: Iterable[str]) -> None:
        """Drop the series of nodes the registry forgot (bounded cardinality)."""
        for node in nodes:
            self._nodes.pop(node, None)

    def collect(self) -> Iterable[Metric]:
        snapshot = [(node, tuple(e.counts), e.sum) for node, e in self._nodes.items()]
        yield RenderedFamily(NAME, HELP, "histogram",
                             render=lambda: self._render(snapshot),
                             samples=lambda: self._samples(snapshot))  # fmt: skip

    def _render(self, snapshot: Snapshot) -> str:
        bucket = [f'{NAME}_bucket{{le="{le}",node="' for le in self._les]
        count, total = f'{NAME}_count{{node="', f'{NAME}_sum{{node="'
        out: list[str] = []
        add = out.append
        for node, counts, seconds in snapshot:
            tail = escape_label_value(node) + '"} '
            cumulative = 0
            for prefix, n in zip(bucket, counts, strict=True):
                cumulative += n
                add(f"{prefix}{tail}{cumulative}.0\n")
            add(f"{count}{tail}{cumulative}.0\n")
            add(f"{total}{tail}{floatToGoString(seconds)}\n")  # type: ignore[no-untyped-call]
        return "".join(out)

    def _samples(self, snapshot: Snapshot) -> list[Sample]:
        samples = []
        for node, counts, seconds in snapshot:
            cumulative = 0
            for le, n in zip(self._les, counts, strict=True):
                cumulative += n
                samples.append(
                    Sample(f"{NAME}_bucket", {"node": node, "le": le}, float(cumulative))
                )
            samples.append(Sample(f"{NAME}_count", {"node": node}, float(cumulative)))
            samples.append(Sample(f"{NAME}_sum", {"node": node}, seconds))
        return samples
