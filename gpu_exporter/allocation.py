"""Which container was given which GPU, MIG instance or share of a GPU, and how much memory.

The kubelet's pod-resources API names, per container, a resource and the device ids the device
plugin handed out. The id's form tells the sharing mode:

===========================  ============================  =====================================
resource                     device id                     what the container got
===========================  ============================  =====================================
``nvidia.com/gpu``           ``GPU-<uuid>``                the whole GPU (exclusive)
``nvidia.com/gpu`` (or       ``GPU-<uuid>::<n>``           replica n of a time-sliced GPU: the
``nvidia.com/gpu.shared``)                                 whole GPU's memory, shared in time
``nvidia.com/mig-<profile>`` ``MIG-<uuid>``                one MIG instance and its memory
                             ``MIG-GPU-<uuid>/<gi>/<ci>``  (the same, in the older id form)
``aliyun.com/gpu-mem``       ``GPU-<uuid>-_-<n>``          ACK GPU sharing: one memory unit of
                                                           that GPU per id (``--gpu-mem-unit``)
===========================  ============================  =====================================

Other ``aliyun.com/`` resources (``gpu-core.percentage``, ``gpu-count``) carry no device
identity and are not used. An id naming no GPU of this node is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_exporter.backend import Allocation, GpuInfo, PodRef
from gpu_exporter.podresources import PodResources

__all__ = [
    "ACK_GPU_MEM",
    "DEFAULT_GPU_MEM_UNIT_MIB",
    "DeviceTarget",
    "GpuKey",
    "allocations_by_gpu",
    "device_target",
    "gpu_key",
]

ACK_GPU_MEM = "aliyun.com/gpu-mem"
DEFAULT_GPU_MEM_UNIT_MIB = 1024
"""ACK's gpushare device plugin counts memory in GiB by default."""

GpuKey = tuple[str, int | None]
"""(GPU UUID, MIG GPU-instance id or None for the whole GPU)."""

_MIG_LEGACY = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")
_ACK_FAKE_ID = re.compile(r"^(GPU-[0-9a-fA-F-]+)-_-\d+$")


def gpu_key(info: GpuInfo) -> GpuKey:
    return (info.uuid, info.mig_instance if info.mig_profile else None)


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    key: GpuKey
    ack_units: int = 0
    """1 for an ``aliyun.com/gpu-mem`` id (one memory unit), else 0."""


def device_target(
    resource: str, device_id: str, mig_by_uuid: dict[str, GpuKey]
) -> DeviceTarget | None:
    """The GPU (or MIG instance) a device id of a resource names, or None."""
    if resource == ACK_GPU_MEM:
        m = _ACK_FAKE_ID.match(device_id)
        return DeviceTarget((m.group(1), None), ack_units=1) if m else None
    if not resource.startswith("nvidia.com/"):
        return None
    if device_id.startswith("MIG-"):
        legacy = _MIG_LEGACY.match(device_id)
        if legacy:
            return DeviceTarget((legacy.group(1), int(legacy.group(2))))
        key = mig_by_uuid.get(device_id)
        return DeviceTarget(key) if key else None
    if device_id.startswith("GPU-"):
        return DeviceTarget((device_id.split("::", 1)[0], None))
    return None


def allocations_by_gpu(
    pods: Sequence[PodResources],
    gpus: Iterable[GpuInfo],
    *,
    gpu_mem_unit_mib: int = DEFAULT_GPU_MEM_UNIT_MIB,
) -> dict[GpuKey, tuple[Allocation, ...]]:
    """GPU (or MIG instance) -> the containers allocated to it, with their memory."""
    infos = {gpu_key(g): g for g in gpus}
    mig_by_uuid = {g.mig_uuid: gpu_key(g) for g in infos.values() if g.mig_uuid}
    units: dict[tuple[GpuKey, PodRef], int] = {}
    whole: dict[tuple[GpuKey, PodRef], int] = {}
    for pod in pods:
        for devices in pod.devices:
            ref = PodRef(pod.namespace, pod.name, devices.container)
            for device_id in devices.device_ids:
                target = device_target(devices.resource_name, device_id, mig_by_uuid)
                if target is None or target.key not in infos:
                    continue
                slot = (target.key, ref)
                if target.ack_units:
                    units[slot] = units.get(slot, 0) + target.ack_units
                else:
                    whole[slot] = infos[target.key].memory_total_mib
    out: dict[GpuKey, list[Allocation]] = {}
    for (key, ref), memory in whole.items():
        out.setdefault(key, []).append(Allocation(ref, memory))
    for (key, ref), count in units.items():
        if (key, ref) not in whole:
            out.setdefault(key, []).append(Allocation(ref, count * gpu_mem_unit_mib))
    return {k: tuple(sorted(v, key=_order)) for k, v in out.items()}


def _order(a: Allocation) -> tuple[str, str, str]:
    return (a.pod.namespace, a.pod.pod, a.pod.container)
