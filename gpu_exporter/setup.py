"""Pieces both the standalone and the agent-embedded exporter are built from."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpu_exporter.allocation import DEFAULT_GPU_MEM_UNIT_MIB
from gpu_exporter.backend import GpuBackend
from gpu_exporter.kube_pods import in_cluster_lookup
from gpu_exporter.podresources import PodResourcesClient
from gpu_exporter.process_mapping import PodMapper

__all__ = ["IN_CLUSTER_ENV", "build_mapper", "real_backend"]

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


def real_backend(
    *, processes: bool, interval_s: float, dcgm: bool = True, dcgm_host: str = "localhost"
) -> GpuBackend:
    """NVML, with DCGM's profiling fields when its bindings and host engine are there.

    Raises BackendUnavailableError without NVML (the message names the fix)."""
    from gpu_exporter.nvml_backend import NvmlBackend

    nvml = NvmlBackend(processes=processes)
    if not dcgm:
        return nvml
    from gpu_exporter.dcgm_backend import load_bindings, open_dcgm_backend

    backend = open_dcgm_backend(
        nvml, host=dcgm_host, interval_s=interval_s, bindings=load_bindings()
    )
    return nvml if backend is None else backend
