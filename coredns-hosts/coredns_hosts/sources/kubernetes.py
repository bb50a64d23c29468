"""Kubernetes source: edge Nodes (by label selector) and the gateway Service's ClusterIP(s).

Every Node matching the selector resolves to every ClusterIP of the gateway Service (one
per family on a dual-stack Service). Both resources are followed by raven's one reflector
(:class:`raven.kube.reflector.Reflector`); the source is not ready until both have been listed
and the Service has a ClusterIP (a headless or ExternalName Service has none: nothing is
written, the last good output stays).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import IPAddress, Snapshot, SourceNotReady, parse_address
from coredns_hosts.sources import OnChange
from raven.kube.cache import Cache, WatchFailed, WatchGone
from raven.kube.client import ApiConfig, ApiError, KubeClient
from raven.kube.objects import KubeObjectError, node_name, service_cluster_ips
from raven.kube.reflector import Reflector

log = logging.getLogger(__name__)

DEFAULT_NODE_SELECTOR = "openyurt.io/is-edge-worker=true"
#: The proxy Service the Helm chart creates (release ``raven`` in ``raven-system``).
DEFAULT_SERVICE = "raven-system/raven-gateway"


def _service_addresses(obj: Mapping[str, Any]) -> tuple[IPAddress, ...]:
    try:
        return tuple(parse_address(ip) for ip in service_cluster_ips(obj))
    except KubeObjectError as exc:
        log.warning("gateway Service unusable: %s", exc)
        return ()


class KubernetesSource:
    def __init__(
        self,
        api: ApiConfig,
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
        self.client = KubeClient(api)
        self._on_change: OnChange | None = None
        self._last_addresses: tuple[IPAddress, ...] | None = None
        common: dict[str, Any] = {
            "watch_timeout_s": (watch_timeout_s, watch_timeout_s),
            "page_size": page_size,
            "min_backoff_s": 0.2,
            "on_change": self._changed,
        }
        self.node_cache: Cache[str] = Cache("nodes", node_name)
        self.node_watcher = Reflector(
            self.client,
            "/api/v1/nodes",
            self.node_cache,
            label_selector=node_selector,
            on_relist=lambda: metrics.relists.labels("nodes").inc(),
            on_error=lambda r: metrics.errors.labels("source", f"nodes_{r}").inc(),
            **common,
        )
        self.service_cache: Cache[tuple[IPAddress, ...]] = Cache("services", _service_addresses)
        self.service_watcher = Reflector(
            self.client,
            f"/api/v1/namespaces/{namespace}/services",
            self.service_cache,
            field_selector=f"metadata.name={name}",
            on_relist=lambda: metrics.relists.labels("services").inc(),
            on_error=lambda r: metrics.errors.labels("source", f"services_{r}").inc(),
            **common,
        )

    @property
    def nodes(self) -> set[str]:
        return set(self.node_cache.items.values())

    @property
    def addresses(self) -> tuple[IPAddress, ...]:
        return next(iter(self.service_cache.items.values()), ())

    def _changed(self) -> None:
        if self.addresses != self._last_addresses:
            self._last_addresses = self.addresses
            log.info(
                "gateway Service %s addresses=%s",
                self.service,
                ",".join(map(str, self.addresses)) or "none",
            )
        if self._on_change is not None:
            self._on_change()

    def snapshot(self) -> Snapshot:
        if not (self.node_watcher.synced.is_set() and self.service_watcher.synced.is_set()):
            raise SourceNotReady("waiting for the first list of nodes and service")
        addresses = self.addresses
        if not addresses:
            raise SourceNotReady(
                f"gateway Service {self.service} has no ClusterIP (missing, headless or "
                "ExternalName)"
            )
        return Snapshot.uniform(sorted(self.nodes), addresses, self.origin)

    async def load(self) -> Snapshot:
        try:
            await self.node_watcher.relist()
            await self.service_watcher.relist()
            return self.snapshot()
        except (ApiError, WatchFailed, WatchGone) as exc:
            raise SourceNotReady(f"kubernetes: {exc}") from None
        finally:
            await self.client.close()

    async def run(self, on_change: OnChange) -> None:
        self._on_change = on_change
        tasks = [
            asyncio.create_task(r.run(), name=f"watch-{r.name}")
            for r in (self.node_watcher, self.service_watcher)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            self._on_change = None
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.client.close()
