"""Pod UID -> pod name, from the API server: the pods scheduled on this node.

The exporter learns a process's pod UID and container id from its cgroup; this turns them into
namespace, pod and container names. The pod list (one ``GET /api/v1/pods`` with a
``spec.nodeName`` field selector, through raven.kube's client: the one Kubernetes client of
every component) is cached for ``ttl_s`` and refreshed early, at most every ``min_refresh_s``,
when an unknown UID shows up (a pod that just started). Blocking; called from the exporter's
collection thread, which runs each request on a short-lived event loop of its own. The answer
is untrusted: a pod whose fields are not what the API documents is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpu_exporter.backend import PodRef
from gpu_exporter.process_mapping import CgroupRef

if TYPE_CHECKING:  # imported when used: an agent embedding the exporter may run without ssl
    from raven.kube.client import ApiConfig

__all__ = ["ApiServerPodLookup", "in_cluster_lookup", "pod_list_fetcher"]

log = logging.getLogger(__name__)

_Pod = tuple[str, str, dict[str, str]]  # namespace, name, container id -> container name
#: ``field_selector`` -> the PodList the API server answered (decoded JSON).
ListPods = Callable[[str], object]


def _container_ids(pod: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    status = pod.get("status")
    if not isinstance(status, dict):
        return out
    statuses: list[Any] = []
    for key in ("containerStatuses", "initContainerStatuses"):
        value = status.get(key)
        statuses += value if isinstance(value, list) else []
    for s in statuses:
        if not isinstance(s, dict):
            continue
        cid, name = s.get("containerID"), s.get("name")
        if isinstance(cid, str) and cid and isinstance(name, str):
            out[cid.rsplit("://", 1)[-1]] = name
    return out


def _pods(answer: object) -> dict[str, _Pod]:
    """uid -> pod of a PodList; ValueError when it is not one."""
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise ValueError("the API answered something that is not a pod list")
    pods: dict[str, _Pod] = {}
    for pod in items:
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            continue
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str):
            pods[uid] = (namespace, name, _container_ids(pod))
    return pods


def pod_list_fetcher(config: ApiConfig, timeout_s: float = 10.0) -> ListPods:
    """Lists this node's pods with ``config``'s credentials, from a thread without a running
    event loop (the collection thread): each call runs one request on a loop of its own."""

    from raven.kube.client import KubeClient

    def list_pods(field_selector: str) -> object:
        async def get() -> object:
            client = KubeClient(config, connect_timeout_s=timeout_s)
            try:
                return await client.get_json(
                    "/api/v1/pods", {"fieldSelector": field_selector}, timeout_s
                )
            finally:
                await client.close()

        return asyncio.run(get())

    return list_pods


class ApiServerPodLookup:
    """Callable(CgroupRef) -> PodRef | None backed by ``list_pods`` (`pod_list_fetcher`)."""

    def __init__(
        self,
        list_pods: ListPods,
        node_name: str,
        *,
        ttl_s: float = 30.0,
        min_refresh_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_pods = list_pods
        self.node_name = node_name
        self.ttl_s = ttl_s
        self.min_refresh_s = min_refresh_s
        self._clock = clock
        self._pods: dict[str, _Pod] = {}
        self._fetched_at: float | None = None
        self._failing = False

    def _refresh(self) -> None:
        self._fetched_at = self._clock()
        try:
            pods = _pods(self._list_pods(f"spec.nodeName={self.node_name}"))
        except Exception as exc:  # API server unreachable, RBAC, garbage: keep the old table
            if not self._failing:
                log.warning("pod list failed node=%s error=%s", self.node_name, exc)
            self._failing = True
            return
        self._failing = False
        self._pods = pods

    def __call__(self, ref: CgroupRef) -> PodRef | None:
        now = self._clock()
        age = None if self._fetched_at is None else now - self._fetched_at
        if (
            age is None
            or age >= self.ttl_s
            or (ref.pod_uid not in self._pods and age >= self.min_refresh_s)
        ):
            self._refresh()
        pod = self._pods.get(ref.pod_uid)
        if pod is None:
            return None
        namespace, name, containers = pod
        return PodRef(namespace, name, containers.get(ref.container_id, ""), ref.pod_uid)


def in_cluster_lookup(node_name: str) -> ApiServerPodLookup | None:
    """A lookup using the pod's service account, or None outside a cluster."""
    from raven.kube.client import KubeConfigError, in_cluster_config

    try:
        config = in_cluster_config()
    except KubeConfigError as exc:
        log.info("no in-cluster API access (%s): pods named from pod-resources only", exc)
        return None
    return ApiServerPodLookup(pod_list_fetcher(config), node_name)
