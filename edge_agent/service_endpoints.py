"""Where a scraped port really is on a node: the endpoints of configured Services.

Upstream dcgm-exporter's chart (and any exporter deployed as a DaemonSet behind a ClusterIP
Service, without hostNetwork) listens on a pod address, not on the node's. For each Service
the agent is configured with (``kubernetes.services``: ``namespace/name``), it follows the
Service (its ports) and its EndpointSlices (label ``kubernetes.io/service-name``) with
:class:`raven.kube.reflector.Reflector`. :meth:`ServiceEndpoints.candidates` answers, for a
node and a Service port, the ready endpoints on that node (``nodeName``) with their target
port. The relay asks only after the node's own address refused the connection, and only for
a node it serves and a port it allows: the allow-list stays the agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from raven.kube.cache import Cache
from raven.kube.client import ApiConfig, KubeClient
from raven.kube.objects import (
    ServicePort,
    SliceEndpoint,
    endpoint_slice_endpoints,
    service_ports,
)
from raven.kube.reflector import Reflector

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _slice_endpoints(obj: Mapping[str, Any]) -> tuple[SliceEndpoint, ...]:
    return endpoint_slice_endpoints(obj)


def _ports(obj: Mapping[str, Any]) -> tuple[ServicePort, ...]:
    return service_ports(obj)


class WatchedService:
    """One configured Service: its ports and its EndpointSlices."""

    def __init__(self, client: KubeClient, key: str, **reflector_options: Any) -> None:
        namespace, _, name = key.partition("/")
        self.key = key
        self.ports: Cache[tuple[ServicePort, ...]] = Cache(f"service {key}", _ports)
        self.slices: Cache[tuple[SliceEndpoint, ...]] = Cache(
            f"endpointslices of {key}", _slice_endpoints
        )
        self.reflectors: list[Reflector[Any]] = [
            Reflector(
                client,
                f"/api/v1/namespaces/{namespace}/services",
                self.ports,
                field_selector=f"metadata.name={name}",
                **reflector_options,
            ),
            Reflector(
                client,
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                self.slices,
                label_selector=f"{SERVICE_NAME_LABEL}={name}",
                **reflector_options,
            ),
        ]

    def candidates(self, node: str, port: int) -> list[tuple[str, int]]:
        """(address, port) of this Service's ready endpoints on ``node`` for Service ``port``."""
        out: list[tuple[str, int]] = []
        for ports in self.ports.items.values():
            for sp in ports:
                if sp.port != port:
                    continue
                for endpoints in self.slices.items.values():
                    for ep in endpoints:
                        if ep.node != node:
                            continue
                        # A slice names its ports after the Service's ports.
                        out.extend((ep.address, n) for name, n in ep.ports if name == sp.name)
        return sorted(set(out))


class ServiceEndpoints:
    """The configured Services, followed; :meth:`candidates` is what the relay asks."""

    def __init__(self, client: KubeClient, services: list[str], **reflector_options: Any) -> None:
        self.client = client
        self.services = [WatchedService(client, s, **reflector_options) for s in services]
        self._tasks: list[asyncio.Task[None]] = []

    def candidates(self, node: str, port: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for svc in self.services:
            out.extend(c for c in svc.candidates(node, port) if c not in out)
        return out

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for s in self.services for r in s.reflectors)

    def start(self) -> None:
        for svc in self.services:
            for r in svc.reflectors:
                self._tasks.append(asyncio.create_task(r.run(), name=f"k8s {r.name}"))
        log.info("following service endpoints services=%s", ",".join(s.key for s in self.services))

    async def wait_synced(self, timeout_s: float) -> None:
        waits = [r.synced.wait() for s in self.services for r in s.reflectors]
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*waits)
        except TimeoutError:
            log.warning("service endpoints: not listed after %.0fs; still trying", timeout_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.client.close()


async def start_service_endpoints(
    services: list[str],
    api: ApiConfig,
    *,
    first_sync_timeout_s: float = 10.0,
    **reflector_options: Any,
) -> ServiceEndpoints:
    """Follow ``services``; waits (bounded) for their first lists."""
    endpoints = ServiceEndpoints(KubeClient(api), services, **reflector_options)
    endpoints.start()
    await endpoints.wait_synced(first_sync_timeout_s)
    return endpoints
