"""Pieces both the standalone and the agent-embedded exporter are built from."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpu_exporter.allocation import DEFAULT_GPU_MEM_UNIT_MIB
from gpu_exporter.kube_pods import in_cluster_lookup
from gpu_exporter.podresources import PodResourcesClient
from gpu_exporter.process_mapping import PodMapper

__all__ = ["IN_CLUSTER_ENV", "build_mapper"]

log = logging.getLogger(__name__)

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


def build_mapper(
    socket_path: str,
    *,
    node_name: str,
    gpu_mem_unit_mib: int = DEFAULT_GPU_MEM_UNIT_MIB,
    proc_root: str | Path = "/proc",
) -> PodMapper:
    """Pod mapping from the kubelet's pod-resources socket, /proc cgroups and, inside a
    cluster, the API server (pods on this node; needs the RBAC of deploy/)."""
    client = PodResourcesClient(socket_path)
    if not client.available():
        log.warning(
            "pod-resources socket missing path=%s: GPUs are mapped to pods once it appears",
            socket_path,
        )
    lookup = in_cluster_lookup(node_name) if os.environ.get(IN_CLUSTER_ENV) else None
    return PodMapper(
        client.list, pod_lookup=lookup, proc_root=proc_root, gpu_mem_unit_mib=gpu_mem_unit_mib
    )
