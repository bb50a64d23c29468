"""Pod UID -> pod name, from the API server: the pods scheduled on this node.

The exporter learns a process's pod UID and container id from its cgroup; this turns them into
namespace, pod and container names. The pod list (one ``list_pod_for_all_namespaces`` with a
``spec.nodeName`` field selector) is cached for ``ttl_s`` and refreshed early, at most every
``min_refresh_s``, when an unknown UID shows up (a pod that just started). Blocking; called from
the exporter's collection thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gpu_exporter.backend import PodRef
from gpu_exporter.process_mapping import CgroupRef

__all__ = ["ApiServerPodLookup", "in_cluster_lookup"]

log = logging.getLogger(__name__)

_Pod = tuple[str, str, dict[str, str]]  # namespace, name, container id -> container name


def _container_ids(pod: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    status = getattr(pod, "status", None)
    statuses = list(getattr(status, "container_statuses", None) or [])
    statuses += list(getattr(status, "init_container_statuses", None) or [])
    for s in statuses:
        cid = getattr(s, "container_id", None) or ""
        if cid:
            out[cid.rsplit("://", 1)[-1]] = str(s.name)
    return out


class ApiServerPodLookup:
    """Callable(CgroupRef) -> PodRef | None backed by a CoreV1Api-like object."""

    def __init__(
        self,
        core_v1: Any,
        node_name: str,
        *,
        ttl_s: float = 30.0,
        min_refresh_s: float = 5.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = core_v1
        self.node_name = node_name
        self.ttl_s = ttl_s
        self.min_refresh_s = min_refresh_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._pods: dict[str, _Pod] = {}
        self._fetched_at: float | None = None
        self._failing = False

    def _refresh(self) -> None:
        self._fetched_at = self._clock()
        try:
            answer = self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}",
                _request_timeout=self.timeout_s,
            )
        except Exception as exc:  # API server unreachable, RBAC: keep the old table
            if not self._failing:
                log.warning("pod list failed node=%s error=%s", self.node_name, exc)
            self._failing = True
            return
        self._failing = False
        pods: dict[str, _Pod] = {}
        for pod in answer.items or []:
            meta = pod.metadata
            pods[str(meta.uid)] = (str(meta.namespace), str(meta.name), _container_ids(pod))
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
    try:
        from kubernetes import client, config

        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except Exception as exc:
        log.info("no in-cluster API access (%s): pods named from pod-resources only", exc)
        return None
    return ApiServerPodLookup(client.CoreV1Api(), node_name)
