"""The agent's L7 relay: stream from the gateway -> allow-list -> TCP to the target.

The bytes move by callbacks (:class:`raven.transport.splice.Splice`, the target connection's
protocol): a stream has a task only while it connects; once accepted, nothing waits on it (a
kept stream costs no task).

An agent never dials a destination outside its allow-list: only nodes it serves, only
allowed ports, and never an address given by the gateway (the gateway names a node,
the agent's own table gives the address).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Protocol

from raven.protocol.codes import StreamCode
from raven.protocol.names import normalize_node_name
from raven.telemetry.promclient import (
    Collector,
    CollectorRegistry,
    Counter,
    CounterMetricFamily,
    Gauge,
    Metric,
)
from raven.transport.connect_errors import connect_failure
from raven.transport.splice import Splice
from raven.transport.tunnel import TunnelStream

log = logging.getLogger(__name__)


class RequestWatcher(Protocol):
    """Looks at the bytes going to a target (backfill learns scrapes this way)."""

    def feed(self, data: bytes) -> bool:
        """True when it needs no more bytes."""
        ...


class EndpointFinder(Protocol):
    """Where else ``port`` of ``node`` may listen (Service endpoints on that node)."""

    def candidates(self, node: str, port: int) -> list[tuple[str, int]]: ...


class RelayMetrics(Collector):
    """The relay's metrics. The bytes relayed move with every chunk, so they are plain
    counts exported when the registry is collected (no client_python child, lock or check
    per chunk, as the gateway's request counts); the rest are client_python metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Counter(
            "raven_agent_streams_total",
            "Streams the gateway asked for, by result (ok or the refusal reason).",
            ["result"],
            registry=registry,
        )
        self.active = Gauge(
            "raven_agent_streams_active", "Streams relayed right now.", registry=registry
        )
        self.service_endpoints = Counter(
            "raven_agent_service_endpoint_connects_total",
            "Connections to a Service endpoint after the node's own address refused, by result.",
            ["result"],
            registry=registry,
        )
        #: raven_agent_relay_bytes_total{direction="to_target"|"from_target"}
        self.to_target = 0
        self.from_target = 0
        # the hot path's child, looked up once (not per stream)
        self.streams_ok = self.streams.labels("ok")
        registry.register(self)

    def count_from_target(self, size: int) -> None:
        """``size`` bytes read from a target (a Splice's hook)."""
        self.from_target += size

    def collect(self) -> Iterator[Metric]:
        relayed = CounterMetricFamily(
            "raven_agent_relay_bytes",
            "Bytes relayed, by direction (to_target, from_target).",
            labels=["direction"],
        )
        relayed.add_metric(["to_target"], self.to_target)
        relayed.add_metric(["from_target"], self.from_target)
        yield relayed


class Relay:
    """Serves streams the gateway opens through a tunnel."""

    def __init__(
        self,
        nodes: Mapping[str, str],
        allowed_ports: Collection[int],
        connect_timeout_s: float,
        registry: CollectorRegistry,
    ) -> None:
        self.nodes: dict[str, str] = {normalize_node_name(k): v for k, v in nodes.items()}
        self.allowed_ports = frozenset(allowed_ports)
        self.connect_timeout_s = connect_timeout_s
        self.metrics = RelayMetrics(registry)
        #: streams being relayed right now (read by raven_agent_streams_active when scraped)
        self.active: set[TunnelStream] = set()
        self.metrics.active.set_function(lambda: len(self.active))
        #: Service endpoints asked when a node's own address refuses (None: not configured).
        self.endpoints: EndpointFinder | None = None
        #: per stream, an optional watcher of the request bytes (set by the backfill service)
        self.request_watcher: Callable[[str, int], RequestWatcher | None] | None = None

    def set_nodes(self, nodes: Mapping[str, str]) -> None:
        self.nodes = {normalize_node_name(k): v for k, v in nodes.items()}

    def _refuse(self, stream: TunnelStream, code: StreamCode, reason: str) -> None:
        self.metrics.streams.labels(code.label).inc()
        stream.refuse(code, reason)

    async def handle(self, stream: TunnelStream, node: str, port: int) -> None:
        """Check, connect, accept, then join the stream to the target connection (its
        :class:`Splice`), which relays by callbacks until both ways ended (this task ends
        there); every failure gets its reason code."""
        name = normalize_node_name(node)
        address = self.nodes.get(name)
        if address is None:
            self._refuse(stream, StreamCode.UNKNOWN_NODE, f"this agent does not serve {name}")
            return
        if port not in self.allowed_ports:
            self._refuse(stream, StreamCode.PORT_NOT_ALLOWED, f"port {port} not allowed")
            return
        what = f"{name}:{port}"
        try:
            leg, via = await self._connect(name, address, port, what)
        except (OSError, TimeoutError) as exc:
            self._refuse(stream, *connect_failure(exc, what, address))
            return
        try:
            stream.accept()
        except BaseException:
            leg.close()
            raise
        self.metrics.streams_ok.inc()
        self.active.add(stream)
        leg.done.add_done_callback(lambda _: self._ended(stream, leg))
        try:
            leg.start(stream, on_to_socket=self._to_target_hook(name, address, port, via, what),
                      on_from_socket=self.metrics.count_from_target)  # fmt: skip
        except BaseException:
            leg.close()
            raise

    def _ended(self, stream: TunnelStream, leg: Splice) -> None:
        """The splice ended (both ways, broken or reset; it closed both sides): no task
        waited for it."""
        self.active.discard(stream)

    def _to_target_hook(
        self, name: str, address: str, port: int, via: tuple[str, int] | None, what: str
    ) -> Callable[[bytes], None]:
        """Each chunk to the target: re-checked as its OPEN was (a kept stream carries later
        requests), counted, and shown to the backfill's request watcher until it has enough."""
        watcher = self.request_watcher(name, port) if self.request_watcher else None
        watching = [watcher] if watcher is not None else []
        metrics = self.metrics

        def to_target(data: bytes) -> None:
            if self.nodes.get(name) != address or port not in self.allowed_ports or not (
                via is None or (self.endpoints is not None
                                and via in self.endpoints.candidates(name, port))
            ):  # fmt: skip
                raise ConnectionAbortedError(f"{what} is no longer served by this agent")
            metrics.to_target += len(data)
            if watching and watching[0].feed(data):
                watching.clear()

        return to_target

    async def _open(self, host: str, port: int, what: str) -> Splice:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, leg = await loop.create_connection(lambda: Splice(f"target {what}"), host, port)
        return leg

    async def _connect(
        self, name: str, address: str, port: int, what: str
    ) -> tuple[Splice, tuple[str, int] | None]:
        """The node's own address first; when nothing listens there (refused), the ready
        endpoints of a configured Service on that node (:mod:`edge_agent.service_endpoints`).
        Returns the connection and the endpoint it went to (None: the node's own address)."""
        try:
            return await self._open(address, port, what), None
        except ConnectionRefusedError:
            candidates = self.endpoints.candidates(name, port) if self.endpoints else []
            if not candidates:
                raise
        for host, target_port in candidates:
            try:
                leg = await self._open(host, target_port, what)
            except (OSError, TimeoutError) as exc:
                self.metrics.service_endpoints.labels("failed").inc()
                log.info(
                    "service endpoint failed node=%s endpoint=%s:%d err=%s",
                    name,
                    host,
                    target_port,
                    exc,
                )
                continue
            self.metrics.service_endpoints.labels("ok").inc()
            return leg, (host, target_port)
        raise ConnectionRefusedError(f"{name}:{port} and its service endpoints refused")
