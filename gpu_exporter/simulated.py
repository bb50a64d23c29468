"""A simulated GPU backend: N GPUs of a chosen model, driven by a load profile and shared
between pods in one of the sharing modes a Kubernetes node uses.

Every value is a pure function of (seed, model, profile, sharing, GPU index, time): the same
inputs give the same snapshot, so tests can compute what a scrape must show. Counters that
integrate over time (energy, NVLink traffic) are computed in closed form from a fixed boot time,
so they only grow and never depend on when the exporter started.

Sharing modes (`SHARING_MODES`), each with the device ids its device plugin hands out, which
`pod_resources()` returns as the kubelet would:

- ``exclusive``: one pod per GPU (``nvidia.com/gpu``, ``GPU-<uuid>``);
- ``time-slicing``: three pods per GPU (``GPU-<uuid>::<n>``), each allowed the whole memory;
- ``mig``: even-numbered GPUs of a MIG-capable model (A100, H100, H200) cut into three MIG
  instances, one pod each (``nvidia.com/mig-<profile>``, ``MIG-<uuid>``); odd-numbered GPUs
  stay whole and exclusive, as on a node with a mixed MIG strategy;
- ``ack-share``: ACK GPU sharing, three pods per GPU, each given 10, 20 and 30 % of the memory
  in ``aliyun.com/gpu-mem`` units (``GPU-<uuid>-_-<n>``).

The simulated node stands for one with NVIDIA's DCGM: profiling fields (``DCGM_FI_PROF_*``) on
every model, per MIG instance too; a MIG instance's single pod is credited with the instance's
engine activity as its SM utilisation.
"""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpu_exporter.allocation import ACK_GPU_MEM, DEFAULT_GPU_MEM_UNIT_MIB
from gpu_exporter.backend import (
    Allocation,
    GpuFailure,
    GpuInfo,
    GpuSample,
    PodRef,
    ProcessSample,
    Snapshot,
)
from gpu_exporter.podresources import ContainerDevices, PodResources
from gpu_exporter.sim_models import MODELS, GpuModel, MigSlice, resolve_model

__all__ = [
    "BOOT_TIME_S",
    "LOAD_PROFILES",
    "MODELS",
    "SHARING_MODES",
    "GpuModel",
    "SimulatedBackend",
    "resolve_model",
    "utilisation",
]

BOOT_TIME_S = 1_700_000_000.0
"""Simulated boot time (Unix seconds): energy and NVLink counters integrate from here."""

DRIVER_VERSION = "550.54.15"


LOAD_PROFILES = ("idle", "training", "inference", "bursty", "mixed")
SHARING_MODES = ("exclusive", "time-slicing", "mig", "ack-share")
_MIXED_CYCLE = ("training", "inference", "bursty", "idle")

_BURST_PERIOD_S = 30.0
_BURST_DUTY = 0.3
_BURST_HIGH = 0.95
_BURST_LOW = 0.05


def _rng(key: str) -> random.Random:
    """A generator seeded from a string: deterministic across runs (simulation, not crypto)."""
    return random.Random(key)


def _phase(seed: int, index: int) -> float:
    return _rng(f"raven-sim:{seed}:{index}").uniform(0.0, 2.0 * math.pi)


def _profile_for(profile: str, index: int) -> str:
    return _MIXED_CYCLE[index % len(_MIXED_CYCLE)] if profile == "mixed" else profile


def utilisation(profile: str, phase: float, t: float) -> float:
    """GPU utilisation (0..1) of a profile at time t (seconds)."""
    if profile == "idle":
        return 0.0
    if profile == "training":
        return 0.9 + 0.06 * math.sin(2.0 * math.pi * t / 60.0 + phase)
    if profile == "inference":
        return 0.45 + 0.3 * math.sin(2.0 * math.pi * t / 300.0 + phase)
    if profile == "bursty":
        r = (t + phase / (2.0 * math.pi) * _BURST_PERIOD_S) % _BURST_PERIOD_S
        return _BURST_HIGH if r < _BURST_DUTY * _BURST_PERIOD_S else _BURST_LOW
    raise ValueError(f"unknown load profile {profile!r}")


def _utilisation_integral(profile: str, phase: float, t: float) -> float:
    """An antiderivative of `utilisation` in t (closed form, so counters are pure functions)."""
    if profile == "idle":
        return 0.0
    if profile in ("training", "inference"):
        mean, amp, period = (0.9, 0.06, 60.0) if profile == "training" else (0.45, 0.3, 300.0)
        w = 2.0 * math.pi / period
        return mean * t - amp * math.cos(w * t + phase) / w
    s = t + phase / (2.0 * math.pi) * _BURST_PERIOD_S
    n = math.floor(s / _BURST_PERIOD_S)
    r = s - n * _BURST_PERIOD_S
    on = _BURST_DUTY * _BURST_PERIOD_S
    per_period = _BURST_HIGH * on + _BURST_LOW * (_BURST_PERIOD_S - on)
    return n * per_period + _BURST_HIGH * min(r, on) + _BURST_LOW * max(0.0, r - on)


@dataclass(frozen=True, slots=True)
class Tenant:
    """A container on a simulated GPU (or MIG instance): its process and its allocation."""

    pod: PodRef
    pid: int
    share: float
    """Its part of the GPU's utilisation."""
    used_mib: int
    allocated_mib: int
    resource: str
    device_ids: tuple[str, ...]


_SHARES = (0.5, 0.3, 0.2)
_TS_MEMORY = (0.3, 0.2, 0.1)
_ACK_MEMORY = (0.1, 0.2, 0.3)
_ACK_USE = (0.5, 0.75, 0.4)
_EXCLUSIVE = {
    # profile: (namespace, pod prefix, container, memory fraction)
    "training": ("ml", "train", "trainer", 0.85),
    "inference": ("serving", "infer", "server", 0.4),
    "bursty": ("batch", "burst", "worker", 0.5),
}


def _pod(namespace: str, name: str, container: str) -> PodRef:
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"raven-sim/{namespace}/{name}"))
    return PodRef(namespace, name, container, uid)


def _pid(key: str) -> int:
    return _rng(f"raven-sim-pid:{key}").randrange(1000, 4_000_000)


class SimulatedBackend:
    """N simulated GPUs; `collect` is a pure function of (configuration, now)."""

    def __init__(
        self,
        count: int,
        *,
        model: str = "H100",
        seed: int = 0,
        load_profile: str = "training",
        sharing: str = "exclusive",
        failing: Iterable[int] = (),
        clock: Callable[[], float] | None = None,
        gpu_mem_unit_mib: int = DEFAULT_GPU_MEM_UNIT_MIB,
    ) -> None:
        if count < 0 or count > 64:
            raise ValueError("simulated GPU count must be between 0 and 64")
        if load_profile not in LOAD_PROFILES:
            raise ValueError(
                f"unknown load profile {load_profile!r} (choose from {', '.join(LOAD_PROFILES)})"
            )
        if sharing not in SHARING_MODES:
            raise ValueError(
                f"unknown sharing mode {sharing!r} (choose from {', '.join(SHARING_MODES)})"
            )
        self.count = count
        self.model = resolve_model(model)
        if sharing == "mig" and not self.model.mig:
            raise ValueError(f"model {self.model.key} has no MIG (use A100, H100 or H200)")
        self.seed = seed
        self.load_profile = load_profile
        self.sharing = sharing
        self.failing = frozenset(failing)
        self.gpu_mem_unit_mib = gpu_mem_unit_mib
        self._clock = clock

    @property
    def name(self) -> str:
        return (
            f"simulated({self.count}x{self.model.key},{self.load_profile},{self.sharing},"
            f"seed={self.seed})"
        )

    # ---- identity ------------------------------------------------------------------------

    def gpu_info(self, index: int) -> GpuInfo:
        rng = _rng(f"raven-sim-id:{self.seed}:{index}")
        gpu_uuid = "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))
        bus = 0x18 + index * 0x10 if index < 14 else index
        return GpuInfo(
            index=index,
            uuid=gpu_uuid,
            pci_bus_id=f"00000000:{bus:02X}:00.0",
            device=f"nvidia{index}",
            model_name=self.model.name,
            memory_total_mib=self.model.memory_total_mib,
        )

    def is_mig(self, index: int) -> bool:
        return self.sharing == "mig" and index % 2 == 0

    def mig_info(self, index: int, s: MigSlice) -> GpuInfo:
        parent = self.gpu_info(index)
        mig_uuid = "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{parent.uuid}/{s.gpu_instance}"))
        return dataclasses.replace(
            parent,
            memory_total_mib=s.memory_mib,
            mig_profile=s.profile,
            mig_instance=s.gpu_instance,
            mig_uuid=mig_uuid,
        )

    # ---- who runs where ------------------------------------------------------------------

    def tenants(self, index: int, mig: MigSlice | None = None) -> list[Tenant]:
        """The containers on GPU ``index`` (or on one of its MIG instances)."""
        profile = _profile_for(self.load_profile, index)
        if profile == "idle":
            return []
        m, info = self.model, self.gpu_info(index)
        usable = m.memory_total_mib - m.memory_reserved_mib
        tag = f"{self.seed}-{index}"
        if mig is not None:
            mig_info = self.mig_info(index, mig)
            pod = _pod("ml", f"mig-{tag}-{mig.gpu_instance}", "worker")
            return [
                Tenant(
                    pod, _pid(pod.pod), 1.0, int(mig.memory_mib * 0.6), mig.memory_mib,
                    f"nvidia.com/mig-{mig.profile}", (mig_info.mig_uuid,),
                )
            ]  # fmt: skip
        if self.sharing == "time-slicing":
            return [
                Tenant(
                    p, _pid(p.pod), share, int(usable * mem), m.memory_total_mib,
                    "nvidia.com/gpu", (f"{info.uuid}::{k}",),
                )
                for k, (share, mem) in enumerate(zip(_SHARES, _TS_MEMORY, strict=True))
                for p in (_pod("ml", f"ts-{tag}-{k}", "worker"),)
            ]  # fmt: skip
        if self.sharing == "ack-share":
            return self._ack_tenants(index, tag)
        namespace, prefix, container, mem = _EXCLUSIVE[profile]
        pod = _pod(namespace, f"{prefix}-{tag}", container)
        return [
            Tenant(
                pod, _pid(pod.pod), 1.0, int(usable * mem), m.memory_total_mib,
                "nvidia.com/gpu", (info.uuid,),
            )
        ]  # fmt: skip

    def _ack_tenants(self, index: int, tag: str) -> list[Tenant]:
        info, unit = self.gpu_info(index), self.gpu_mem_unit_mib
        total_units = self.model.memory_total_mib // unit
        out, first = [], 0
        for k in range(3):
            units = max(1, int(total_units * _ACK_MEMORY[k]))
            pod = _pod("ack", f"share-{tag}-{k}", "app")
            ids = tuple(f"{info.uuid}-_-{n}" for n in range(first, first + units))
            first += units
            allocated = units * unit
            out.append(
                Tenant(
                    pod, _pid(pod.pod), _SHARES[k], int(allocated * _ACK_USE[k]), allocated,
                    ACK_GPU_MEM, ids,
                )
            )  # fmt: skip
        return out

    def pod_resources(self) -> list[PodResources]:
        """What the kubelet's pod-resources List would answer on this node."""
        tenants: list[Tenant] = []
        for i in range(self.count):
            if self.is_mig(i):
                for s in self.model.mig:
                    tenants.extend(self.tenants(i, s))
            else:
                tenants.extend(self.tenants(i))
        return [
            PodResources(
                t.pod.pod,
                t.pod.namespace,
                (ContainerDevices(t.pod.container, t.resource, t.device_ids),),
            )
            for t in tenants
        ]

    # ---- values --------------------------------------------------------------------------

    def _load(self, index: int) -> list[tuple[float, str, float]]:
        """(weight, profile, phase) components of a GPU's utilisation."""
        profile = _profile_for(self.load_profile, index)
        if not self.is_mig(index):
            return [(1.0, profile, _phase(self.seed, index))]
        slices = [int(s.profile.split("g.", 1)[0]) for s in self.model.mig]
        total = sum(slices)
        return [
            (n / total, profile, _phase(self.seed, index * 16 + s.gpu_instance))
            for n, s in zip(slices, self.model.mig, strict=True)
        ]

    def sample(self, index: int, fields: frozenset[str], now: float) -> list[GpuSample]:
        """The state of GPU ``index`` at time ``now``: the GPU, then its MIG instances."""
        load = self._load(index)
        u = sum(w * utilisation(p, ph, now) for w, p, ph in load)
        elapsed_u = sum(
            w * (_utilisation_integral(p, ph, now) - _utilisation_integral(p, ph, BOOT_TIME_S))
            for w, p, ph in load
        )
        values = _device_values(self.model, u, elapsed_u, now)
        if self.is_mig(index):
            parent = {k: v for k, v in values.items() if k not in _PER_INSTANCE}
            out = [GpuSample(self.gpu_info(index), _wanted(parent, fields))]
            for s, (_, profile, phase) in zip(self.model.mig, load, strict=True):
                out.append(self._instance(index, s, utilisation(profile, phase, now), fields))
            return out
        tenants = self.tenants(index)
        profile = _profile_for(self.load_profile, index)
        procs = tuple(_process(t, u, profile) for t in tenants)
        used = sum(t.used_mib for t in tenants)
        values.update(_memory(self.model.memory_total_mib, self.model.memory_reserved_mib, used))
        values.update(_profiling(u, profile))
        values["DCGM_FI_DEV_DEC_UTIL"] = sum(p.dec_util for p in procs)
        allocations = _allocations(tenants)
        return [GpuSample(self.gpu_info(index), _wanted(values, fields), procs, allocations)]

    def _instance(self, index: int, s: MigSlice, u: float, fields: frozenset[str]) -> GpuSample:
        tenants = self.tenants(index, s)
        profile = _profile_for(self.load_profile, index)
        values = _memory(s.memory_mib, 0, sum(t.used_mib for t in tenants))
        values.update(_profiling(u, profile))
        procs = tuple(_process(t, u, profile) for t in tenants)
        allocations = _allocations(tenants)
        return GpuSample(self.mig_info(index, s), _wanted(values, fields), procs, allocations)

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        if self._clock is not None:
            now = self._clock()
        gpus: list[GpuSample] = []
        failures = []
        for i in range(self.count):
            if i in self.failing:
                failures.append(GpuFailure(self.gpu_info(i), "GPU is lost (simulated)"))
            else:
                gpus.extend(self.sample(i, fields, now))
        return Snapshot(now, DRIVER_VERSION, tuple(gpus), tuple(failures))

    def close(self) -> None:
        return None


_PER_INSTANCE = frozenset(
    {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
     "DCGM_FI_DEV_DEC_UTIL"}
)  # fmt: skip
"""Fields a MIG-enabled GPU does not report as a whole (NVML answers NOT_SUPPORTED)."""


def _allocations(tenants: Sequence[Tenant]) -> tuple[Allocation, ...]:
    """As the kubelet names them: namespace, pod and container, no UID."""
    return tuple(
        Allocation(dataclasses.replace(t.pod, pod_uid=""), t.allocated_mib) for t in tenants
    )


def _wanted(values: dict[str, float], fields: frozenset[str]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k in fields}


def _process(t: Tenant, u: float, profile: str) -> ProcessSample:
    return ProcessSample(
        pid=t.pid,
        used_memory_mib=t.used_mib,
        sm_util=round(100.0 * u * t.share),
        mem_util=round(35.0 * u * t.share),
        dec_util=round(10.0 * u * t.share) if profile == "inference" else 0,
        pod=t.pod,
    )


def _memory(total: int, reserved: int, used: int) -> dict[str, float]:
    return {
        "DCGM_FI_DEV_FB_FREE": total - reserved - used,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_RESERVED": reserved,
        "DCGM_FI_DEV_FB_TOTAL": total,
    }


def _profiling(u: float, profile: str) -> dict[str, float]:
    tensor = 0.6 if profile == "training" else 0.25
    return {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(u, 6),
        "DCGM_FI_PROF_SM_ACTIVE": round(0.97 * u, 6),
        "DCGM_FI_PROF_SM_OCCUPANCY": round(0.45 * u, 6),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(tensor * u, 6),
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": round(0.1 * u, 6),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": round(0.05 * u, 6),
        "DCGM_FI_PROF_DRAM_ACTIVE": round(0.3 * u, 6),
        "DCGM_FI_PROF_PCIE_TX_BYTES": int(u * 2.0e8),
        "DCGM_FI_PROF_PCIE_RX_BYTES": int(u * 5.0e8),
    }


def _device_values(m: GpuModel, u: float, elapsed_u: float, now: float) -> dict[str, float]:
    """The whole-GPU fields at utilisation u (0..1)."""
    span = m.max_power_w - m.idle_power_w
    energy_j = m.idle_power_w * (now - BOOT_TIME_S) + span * elapsed_u
    gpu_temp = round(m.idle_temp_c + (m.load_temp_c - m.idle_temp_c) * u)
    values: dict[str, float] = {
        "DCGM_FI_DEV_SM_CLOCK": m.load_sm_clock_mhz if u > 0.1 else m.idle_sm_clock_mhz,
        "DCGM_FI_DEV_MEM_CLOCK": m.mem_clock_mhz,
        "DCGM_FI_DEV_GPU_TEMP": gpu_temp,
        "DCGM_FI_DEV_MEMORY_TEMP": gpu_temp + 7 - round(10 * u),
        "DCGM_FI_DEV_POWER_USAGE": round(m.idle_power_w + span * u, 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(energy_j * 1000.0),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": int(u * 200_000),
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": int(u * 500_000),
        "DCGM_FI_DEV_GPU_UTIL": round(100.0 * u),
        "DCGM_FI_DEV_MEM_COPY_UTIL": round(35.0 * u),
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
    }
    for name in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY"):
        values[f"DCGM_FI_DEV_{name}_VIOLATION"] = 0
    for name in ("SBE_VOL", "DBE_VOL", "SBE_AGG", "DBE_AGG"):
        values[f"DCGM_FI_DEV_ECC_{name}_TOTAL"] = 0
    for name in ("SBE", "DBE", "PENDING"):
        values[f"DCGM_FI_DEV_RETIRED_{name}"] = 0
    if m.nvlink:
        values["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = int(elapsed_u * 2_000_000)
    return values


def tenants_of(backend: SimulatedBackend) -> Sequence[Tenant]:
    """Every container on the simulated node (for tests: what each pod must show)."""
    out: list[Tenant] = []
    for i in range(backend.count):
        if i in backend.failing:
            continue
        if backend.is_mig(i):
            for s in backend.model.mig:
                out.extend(backend.tenants(i, s))
        else:
            out.extend(backend.tenants(i))
    return out
