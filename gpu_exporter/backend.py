"""The data a collection produces, and the backend contract (NVML or simulated).

A backend turns the GPUs of a machine into a `Snapshot`: per GPU its identity (`GpuInfo`),
the DCGM field values it could read (`GpuSample.values`, field name -> value in the unit the
counter table names) and its compute processes. A GPU that cannot be read at all becomes a
`GpuFailure`: its series are dropped and the exporter's per-GPU health gauge goes to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Allocation",
    "BackendUnavailableError",
    "GpuBackend",
    "GpuFailure",
    "GpuInfo",
    "GpuSample",
    "PodRef",
    "ProcessSample",
    "Snapshot",
]


class BackendUnavailableError(RuntimeError):
    """The backend cannot start (no NVML library, no driver); the message names the fix."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """A Kubernetes container a GPU or a process belongs to."""

    namespace: str
    pod: str
    container: str
    pod_uid: str = ""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static identity of a GPU (or of a MIG instance: mig_profile and mig_instance set)."""

    index: int
    uuid: str
    pci_bus_id: str
    device: str
    """``nvidia<index>``, as dcgm-exporter writes it."""
    model_name: str
    memory_total_mib: int = 0
    mig_profile: str = ""
    """MIG GPU-instance profile (``3g.40gb``); empty for a whole GPU."""
    mig_instance: int | None = None
    """MIG GPU-instance id (``GPU_I_ID``)."""
    mig_uuid: str = ""
    """The MIG device's own UUID (``MIG-...``), the id a device plugin hands to a pod."""


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One compute process on a GPU. Utilisation in %, memory in MiB."""

    pid: int
    used_memory_mib: int
    sm_util: int = 0
    mem_util: int = 0
    enc_util: int = 0
    dec_util: int = 0
    pod: PodRef | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """A container's share of a GPU (or MIG instance): what its pod was given."""

    pod: PodRef
    memory_mib: int
    """Framebuffer memory the container may use: the whole GPU (exclusive or time-sliced),
    the MIG instance, or its ``aliyun.com/gpu-mem`` units (ACK GPU sharing)."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    info: GpuInfo
    values: dict[str, float]
    """DCGM field name -> value in the counter table's unit; unreadable fields are absent."""
    processes: tuple[ProcessSample, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    """The containers the GPU is allocated to (kubelet pod-resources), one entry each."""

    @property
    def pod(self) -> PodRef | None:
        """The one container holding the GPU, or None (free, unknown or shared)."""
        pods = {a.pod for a in self.allocations}
        return next(iter(pods)) if len(pods) == 1 else None


@dataclass(frozen=True, slots=True)
class GpuFailure:
    info: GpuInfo
    reason: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one collection saw."""

    timestamp: float
    """Wall-clock seconds when the collection ran."""
    driver_version: str
    gpus: tuple[GpuSample, ...]
    failures: tuple[GpuFailure, ...] = field(default=())


class GpuBackend(Protocol):
    """Reads GPUs. `collect` blocks (NVML calls); the server runs it in a worker thread."""

    @property
    def name(self) -> str: ...

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        """Read the given DCGM fields from every GPU. Never raises for one GPU's trouble."""
        ...

    def close(self) -> None: ...
