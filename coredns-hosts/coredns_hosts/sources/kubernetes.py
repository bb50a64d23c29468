"""Kubernetes source: edge Nodes (by label selector) and the gateway Service's ClusterIP(s).

Every Node matching the selector resolves to every ClusterIP of the gateway Service (one
per family on a dual-stack Service). Both resources are listed then watched on their own
thread (:class:`ListWatcher`); the source is not ready until both have been listed and the
Service has a ClusterIP (a headless or ExternalName Service has none: nothing is written,
the last good output stays).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from kubernetes import client

from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import InputError, IPAddress, Snapshot, SourceNotReady, parse_address
from coredns_hosts.sources import OnChange
from coredns_hosts.sources.kube_watch import ListWatcher

log = logging.getLogger(__name__)

DEFAULT_NODE_SELECTOR = "openyurt.io/is-edge-worker=true"
DEFAULT_SERVICE = "kube-system/raven-gateway"


def node_name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise InputError("Node without metadata.name")
    return name


def service_cluster_ips(obj: dict[str, Any]) -> tuple[IPAddress, ...]:
    """``spec.clusterIPs`` (or ``spec.clusterIP``); () for headless/ExternalName Services."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise InputError("Service without spec")
    ips = spec.get("clusterIPs")
    if ips is None:
        single = spec.get("clusterIP")
        ips = [single] if single is not None else []
    if not isinstance(ips, list):
        raise InputError("Service spec.clusterIPs is not a list")
    result: list[IPAddress] = []
    for ip in ips:
        if ip in ("None", ""):
            continue
        address = parse_address(ip)
        if address not in result:
            result.append(address)
    return tuple(result)


class _NodeHandler:
    def __init__(self, source: KubernetesSource) -> None:
        self._source = source

    def replace(self, objects: list[dict[str, Any]]) -> None:
        names = set()
        for obj in objects:
            try:
                names.add(node_name(obj))
            except InputError as exc:
                log.warning("node skipped: %s", exc)
        with self._source.lock:
            self._source.nodes = names
        self._source.notify()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        try:
            name = node_name(obj)
        except InputError as exc:
            log.warning("node event skipped: %s", exc)
            return
        with self._source.lock:
            if event_type == "DELETED":
                self._source.nodes.discard(name)
            else:
                self._source.nodes.add(name)
        self._source.notify()


class _ServiceHandler:
    def __init__(self, source: KubernetesSource) -> None:
        self._source = source

    def _set(self, obj: dict[str, Any] | None) -> None:
        addresses: tuple[IPAddress, ...] = ()
        if obj is not None:
            try:
                addresses = service_cluster_ips(obj)
            except InputError as exc:
                log.warning("gateway Service %s unusable: %s", self._source.service, exc)
        with self._source.lock:
            changed = self._source.addresses != addresses
            self._source.addresses = addresses
        if changed:
            log.info(
                "gateway Service %s addresses=%s",
                self._source.service,
                ",".join(map(str, addresses)) or "none",
            )
        self._source.notify()

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._set(objects[0] if objects else None)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._set(None if event_type == "DELETED" else obj)


class KubernetesSource:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        metrics: HostsMetrics,
        node_selector: str = DEFAULT_NODE_SELECTOR,
        service: str = DEFAULT_SERVICE,
        watch_timeout_s: int = 300,
        page_size: int = 500,
    ) -> None:
        namespace, sep, name = service.partition("/")
        if not sep or not namespace or not name:
            raise ValueError(f"gateway Service must be NAMESPACE/NAME, got {service!r}")
        self.service = service
        self.node_selector = node_selector
        self.origin = f"kubernetes nodes {node_selector or '(all)'} -> service {service}"
        self.lock = threading.Lock()
        self.nodes: set[str] = set()
        self.addresses: tuple[IPAddress, ...] = ()
        self._on_change: OnChange | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._notify_pending = False
        api = client.CoreV1Api(api_client)
        common: dict[str, Any] = {"watch_timeout_s": watch_timeout_s, "page_size": page_size}
        self.node_watcher = ListWatcher(
            resource="nodes",
            list_func=api.list_node,
            list_kwargs={"label_selector": node_selector} if node_selector else {},
            handler=_NodeHandler(self),
            metrics=metrics,
            **common,
        )
        self.service_watcher = ListWatcher(
            resource="services",
            list_func=api.list_namespaced_service,
            list_kwargs={"namespace": namespace, "field_selector": f"metadata.name={name}"},
            handler=_ServiceHandler(self),
            metrics=metrics,
            **common,
        )

    def notify(self) -> None:
        """Called from watcher threads; coalesces into one callback on the loop."""
        loop = self._loop
        if loop is None or self._on_change is None:
            return
        with self.lock:
            if self._notify_pending:
                return
            self._notify_pending = True
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            self._notify_pending = False
        if self._on_change is not None:
            self._on_change()

    def snapshot(self) -> Snapshot:
        if not (self.node_watcher.synced.is_set() and self.service_watcher.synced.is_set()):
            raise SourceNotReady("waiting for the first list of nodes and service")
        with self.lock:
            names = sorted(self.nodes)
            addresses = self.addresses
        if not addresses:
            raise SourceNotReady(
                f"gateway Service {self.service} has no ClusterIP (missing, headless or "
                "ExternalName)"
            )
        return Snapshot.uniform(names, addresses, self.origin)

    async def load(self) -> Snapshot:
        await asyncio.to_thread(self.node_watcher.list_once)
        await asyncio.to_thread(self.service_watcher.list_once)
        return self.snapshot()

    async def run(self, on_change: OnChange) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        threads = [
            threading.Thread(target=w.run, name=f"watch-{w.resource}", daemon=True)
            for w in (self.node_watcher, self.service_watcher)
        ]
        for thread in threads:
            thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._on_change = None
            await asyncio.shield(asyncio.to_thread(self._stop_and_join, threads))

    def _stop_and_join(self, threads: list[threading.Thread], timeout_s: float = 15.0) -> None:
        # stop() again while waiting: a watch request that was being opened at the first
        # stop() has a socket only now, and stop() shuts that socket down.
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            while thread.is_alive() and time.monotonic() < deadline:
                self.node_watcher.stop()
                self.service_watcher.stop()
                thread.join(0.1)
